"""Whole-volume mode against a real local tritonserver: the same result as window mode, per-request settings, errors.

One server for the module: a tiny UNet (3 classes, ``inference`` metadata: roi 16, overlap 0.25) with its
``_volume`` model, a second wrap of it with a 1 MB limit, and a network without a volume model.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
from monai.transforms import AsDiscrete, CastToType, Compose
from tritonclient.utils import InferenceServerException

from monai_triton_ops.backends.base import BaseBackend
from monai_triton_ops.errors import (
    InferenceTimeoutError,
    InputDataError,
    InputValidationError,
    ModelNotFoundError,
    UsageError,
)
from monai_triton_ops.pipeline.run import InferenceSettings, run_inference
from monai_triton_ops.repository.builder import build_repository
from monai_triton_ops.repository.volume import wrap_network
from monai_triton_ops.server import LocalTritonServer, TritonInstall

from ... import triton_models
from ...conftest import UNET_META, save_model, tiny_unet
from ...server.conftest import settled
from .conftest import MODE_IDS, MODES, Open, serve, url

pytestmark = pytest.mark.triton
INFERENCE = {"roi_size": [16, 16, 16], "overlap": 0.25, "sw_batch_size": 4}
LABELS = Compose([AsDiscrete(argmax=True), CastToType(dtype=torch.uint8)])


@pytest.fixture(scope="module")
def server(triton_install: TritonInstall, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTritonServer]:
    folder = tmp_path_factory.mktemp("volume")
    model = save_model(tiny_unet(), folder / "unet.pt", {**UNET_META, "inference": INFERENCE})
    repo = folder / "repo"
    build_repository(model, repo, "unet")
    wrap_network(repo, "unet")
    for name in ("small", "bare"):  # stand-ins that load without torch: no request ever reaches them
        triton_models.passthrough(repo, name, dims=(-1, 1, -1, -1, -1))
    wrap_network(repo, "small", max_volume_mb=1)
    yield from serve(repo, tmp_path_factory.mktemp("server_tmp"))


def _image(seed: int = 0, shape: tuple[int, ...] = (1, 40, 36, 30)) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).standard_normal(shape, dtype=np.float32))


def _run(backend: BaseBackend, image: torch.Tensor, post: Compose | None = LABELS, **settings: object) -> torch.Tensor:
    chosen = InferenceSettings.from_metadata(backend.signature.metadata, **settings)
    return torch.as_tensor(run_inference(image, backend, chosen, post_transforms=post))


@pytest.mark.parametrize(("scheme", "memory"), MODES, ids=MODE_IDS)
def test_volume_mode_gives_window_modes_labels_and_scores_exactly(
    server: LocalTritonServer, open_backend: Open, scheme: str, memory: str
) -> None:
    spec = f"{url(server, scheme)}?shared_memory={memory}"
    window = open_backend(spec, "unet")
    volume = open_backend(f"{spec}&mode=volume", "unet")
    scores = open_backend(f"{spec}&mode=volume&volume_output=scores", "unet")
    assert volume.model_name == "unet_volume"
    assert volume.signature.output_names == ("LABELS", "OUTPUT__0")
    image = _image()
    reference = _run(window, image)
    assert reference.dtype == torch.uint8
    assert set(reference.unique().tolist()) == {0, 1, 2}
    torch.testing.assert_close(_run(volume, image), reference, rtol=0, atol=0)
    torch.testing.assert_close(_run(scores, image, None), _run(window, image, None), rtol=0, atol=0)


def test_settings_travel_per_request_and_change_what_the_server_computes(
    server: LocalTritonServer, open_backend: Open
) -> None:
    window = open_backend(server.grpc_url, "unet")
    volume = open_backend(f"{server.grpc_url}?mode=volume&volume_output=scores", "unet")
    image = _image(1, (1, 33, 20, 27))
    default = _run(volume, image, None)
    changed = {"roi_size": (24, 12, 20), "overlap": 0.5, "mode": "gaussian", "sw_batch_size": 3}
    overridden = _run(volume, image, None, **changed)
    assert not torch.equal(overridden, default)
    torch.testing.assert_close(overridden, _run(window, image, None, **changed), rtol=0, atol=0)
    windows_of_two = _run(volume, image, None, request_batch_size=2)  # grouping never changes a window's result
    torch.testing.assert_close(windows_of_two, default, rtol=0, atol=0)
    simple = _run(volume, image[:, :16, :16, :16], None, inferer="simple")
    torch.testing.assert_close(simple, _run(window, image[:, :16, :16, :16], None, inferer="simple"), rtol=0, atol=0)


def test_one_request_crosses_the_wire_the_windows_stay_on_the_server(
    server: LocalTritonServer, open_backend: Open
) -> None:
    volume = open_backend(f"{server.grpc_url}?mode=volume", "unet")
    network = open_backend(server.grpc_url, "unet")
    before = _counts(volume), _counts(network)
    _run(volume, _image(2), request_batch_size=1)  # 3 x 3 x 3 windows of 16^3 at overlap 0.25, one per request
    after = _counts(volume), _counts(network)
    assert after[0] - before[0] == 1
    assert after[1] - before[1] == 27


def _counts(backend: BaseBackend) -> int:
    """Successful requests of the backend's model, once the statistics have settled (they lag responses)."""

    def read() -> int:
        stats = backend.statistics()["model_stats"][0]  # type: ignore[attr-defined]
        return int(stats.get("inference_stats", {}).get("success", {}).get("count", 0))

    return settled(read)


def test_a_deadline_stops_the_volume_on_the_server_and_the_model_serves_on(
    server: LocalTritonServer, open_backend: Open
) -> None:
    """The client's deadline cancels the request; the volume model stops at its next group of windows."""
    volume = open_backend(f"{server.grpc_url}?mode=volume&timeout_s=2", "unet")
    network = open_backend(server.grpc_url, "unet")
    before = _counts(network)
    # 17 windows of 16 per axis at overlap 0.25: 4,913 requests to the network, 12 s here (120^3, 1,000 windows
    # in 2.6 s, once finished within a CI machine's deadline): the deadline must fall well inside the volume.
    windows = 17**3
    with pytest.raises(InferenceTimeoutError, match=r"model 'unet_volume': no answer within the deadline of 2 s"):
        volume.infer({"x": _image(4, (1, 1, 200, 200, 200))}, parameters={"request_batch_size": "1"})
    time.sleep(2)  # the windows in flight at the deadline finish
    stopped = _counts(network)
    time.sleep(2)
    assert _counts(network) == stopped, "the server went on with the volume after the client gave up"
    assert stopped - before < windows / 2, f"{stopped - before} of {windows} windows ran: the deadline did not stop it"
    assert volume.infer({"x": _image().unsqueeze(0)})["LABELS"].shape == (1, 1, 40, 36, 30)


def test_a_server_without_the_volume_model_names_the_command_that_makes_it(
    server: LocalTritonServer, open_backend: Open
) -> None:
    with pytest.raises(ModelNotFoundError) as caught:
        open_backend(f"{server.grpc_url}?mode=volume&ready_timeout_s=10", "bare")
    message = str(caught.value)
    assert "model 'bare_volume' is not on" in message
    assert "monai-triton repo wrap REPO --name bare" in message
    assert "mode=window" in message


def test_bad_settings_are_refused_by_the_server_with_the_parameter_named(
    server: LocalTritonServer, open_backend: Open
) -> None:
    volume = open_backend(f"{server.http_url}?mode=volume", "unet")
    batch = _image().unsqueeze(0)
    with pytest.raises(InputValidationError, match=r"request parameter overlap=.*expected a number in \[0, 1\)"):
        volume.infer({"x": batch}, parameters={"overlap": "1.5"})
    with pytest.raises(InputValidationError, match=r"unknown request parameter\(s\) \['overlaps'\]; accepted: inferer"):
        volume.infer({"x": batch}, parameters={"overlaps": "0.5"})
    with pytest.raises(InputValidationError, match=r"roi_size='16,16': expected 3 positive sizes"):
        volume.infer({"x": batch}, parameters={"roi_size": "16,16"})
    assert volume.infer({"x": batch})["LABELS"].shape == (1, 1, 40, 36, 30)  # and the model still serves


def test_a_volume_over_the_limit_is_refused_before_it_is_sent_and_by_the_server(
    server: LocalTritonServer, open_backend: Open
) -> None:
    volume = open_backend(f"{server.grpc_url}?mode=volume", "small")
    image = _image(3, (1, 80, 64, 64))  # 1.25 MB of float32, the limit is 1 MB
    with pytest.raises(InputDataError) as caught:
        _run(volume, image)
    message = str(caught.value)
    assert "[1, 1, 80, 64, 64] holds 1.25 MB, over the server's limit of 1 MB" in message
    assert "max_volume_mb" in message
    assert "monai-triton repo wrap REPO --name small --max-volume-mb N --force" in message
    assert _counts(volume) == 0
    client = grpcclient.InferenceServerClient(server.grpc_address)  # a client that does not check first
    try:
        tensor = grpcclient.InferInput("INPUT__0", [1, *image.shape], "FP32")
        tensor.set_data_from_numpy(image.unsqueeze(0).numpy())
        with pytest.raises(InferenceServerException, match=r"holds 1.25 MB, over this model's limit of 1 MB"):
            client.infer("small_volume", [tensor], client_timeout=60)
    finally:
        client.close()


def test_only_backends_that_carry_parameters_take_them(tmp_path: Path) -> None:
    from monai_triton_ops import create_backend

    model = save_model(tiny_unet(), tmp_path / "unet.pt", UNET_META)
    repo = tmp_path / "repo"
    build_repository(model, repo, "unet")
    with create_backend("torch", "unet", model_repository=repo) as backend:
        with pytest.raises(UsageError, match=r"the torch backend passes no request parameters \(\['overlap'\]\)"):
            backend.infer({"x": _image().unsqueeze(0)}, parameters={"overlap": "0.5"})


def test_a_fleet_in_volume_mode_opens_on_its_ready_server_and_gives_the_same_labels(
    server: LocalTritonServer, open_backend: Open
) -> None:
    """Volume mode goes through the fleet like window mode: a second server that is down is probed in the
    background, the ready one is described with its volume model and network, and answers."""
    import socket

    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens there
        sock.bind(("127.0.0.1", 0))
        down = f"127.0.0.1:{sock.getsockname()[1]}"
    window = open_backend(server.grpc_url, "unet")
    volume = open_backend(f"{server.grpc_url}?mode=volume&servers={down}&ready_timeout_s=10", "unet")
    assert volume.model_name == "unet_volume"
    image = _image(2)
    torch.testing.assert_close(_run(volume, image), _run(window, image), rtol=0, atol=0)


def test_volume_mode_refuses_a_torch_fallback(server: LocalTritonServer) -> None:
    from monai_triton_ops import create_backend
    from monai_triton_ops.errors import ConfigError

    with pytest.raises(ConfigError, match=r"fallback=torch .* mode=volume"):
        create_backend(f"{server.grpc_url}?mode=volume&fallback=torch", "unet")
