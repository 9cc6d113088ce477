"""Step 1: save the minimal app's network as TorchScript with MONAI metadata, ready for ``monai-triton repo build``.

    python apps/minimal/make_model.py --out minimal_seg.pt [--in-channels 2]
    monai-triton repo build minimal_seg.pt -o model_repository --name minimal_seg

The metadata (MONAI's ``network_data_format``) is what makes a TorchScript file usable here: TorchScript
stores no tensor names, dtypes or shapes, so ``repo build`` writes ``config.pbtxt`` from it and every
backend checks each request against it. The weights are random (seed 0): the labels the app writes
mean nothing, they show the data flowing. Put your trained network in ``build_network`` and keep the
metadata in step with it.
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path
from typing import Any

# Importing MONAI imports the App SDK and with it Holoscan, which warns about the stack limit; this script
# runs no Holoscan graph, so the warning does not apply here.
warnings.filterwarnings("ignore", message="Current stack size", category=RuntimeWarning)

import torch  # noqa: E402
from monai.data import save_net_with_metadata  # noqa: E402
from monai.networks.nets import UNet  # noqa: E402

#: Output channels: 0 background, 1 foreground; the app's argmax turns them into labels 0 and 1.
OUT_CHANNELS = 2


def build_network(in_channels: int = 1) -> UNet:
    """A tiny 3D UNet; one stride-2 step, so every spatial size it sees must be even ("2*n" below)."""
    torch.manual_seed(0)
    return UNet(
        spatial_dims=3,
        in_channels=in_channels,
        out_channels=OUT_CHANNELS,
        channels=(8, 16),
        strides=(2,),
        num_res_units=1,
    )


def network_data_format(in_channels: int = 1) -> dict[str, Any]:
    """What the network takes and returns, in MONAI bundle terms (``configs/metadata.json`` has the same block)."""
    spatial = ["2*n", "2*n", "2*n"]  # any even size per axis; a fixed size would be written as 96
    return {
        "inputs": {
            "image": {
                "type": "image",
                "format": "magnitude",
                "num_channels": in_channels,
                "spatial_shape": spatial,
                "dtype": "float32",
                "value_range": [],
                "is_patch_data": True,
                "channel_def": {str(c): f"image channel {c}" for c in range(in_channels)},
            }
        },
        "outputs": {
            "pred": {
                "type": "image",
                "format": "segmentation",
                "num_channels": OUT_CHANNELS,
                "spatial_shape": spatial,
                "dtype": "float32",
                "value_range": [],
                "is_patch_data": True,
                "channel_def": {"0": "background", "1": "foreground"},
            }
        },
    }


def save_model(out: Path, in_channels: int = 1) -> Path:
    """Script the network and write it with its metadata to ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    scripted = torch.jit.script(build_network(in_channels).eval())
    meta = {"name": "minimal_seg", "version": "0.1.0", "network_data_format": network_data_format(in_channels)}
    save_net_with_metadata(scripted, str(out), include_config_vals=False, meta_values=meta)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("minimal_seg.pt"), help="TorchScript file to write")
    parser.add_argument("--in-channels", type=int, default=1, help="image channels the network takes (default 1)")
    args = parser.parse_args()
    print(f"wrote {save_model(args.out, args.in_channels)}")


if __name__ == "__main__":
    main()
