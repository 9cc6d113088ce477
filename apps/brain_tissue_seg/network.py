"""The segmentation network, defined once for training and for anyone who rebuilds the weights."""

from __future__ import annotations

from monai.networks.layers import Norm
from monai.networks.nets import UNet

#: Feature maps per level; three stride-2 steps, so inputs must be multiples of 8 (``"8*n"``).
CHANNELS: tuple[int, ...] = (16, 32, 64, 128)
STRIDES: tuple[int, ...] = (2, 2, 2)
#: One residual unit per level keeps the TorchScript at ~2.5 MB (two units: ~4.9 MB, too close to the 5 MB limit).
NUM_RES_UNITS = 1
#: What a spatial dim of the input must be a multiple of.
SIZE_DIVISOR = 2 ** len(STRIDES)


def build_network(in_channels: int = 1, out_channels: int = 3) -> UNet:
    """A small 3D residual UNet: big enough for GM/WM on a 1 mm T1, small enough (< 5 MB) for a repo."""
    return UNet(
        spatial_dims=3,
        in_channels=in_channels,
        out_channels=out_channels,
        channels=CHANNELS,
        strides=STRIDES,
        num_res_units=NUM_RES_UNITS,
        norm=Norm.INSTANCE,
    )
