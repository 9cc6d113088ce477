"""``repo check`` / ``repo describe`` on every kind of model folder users have, and what each is said to be for.

Kinds: a client-side folder (the App SDK remote example's ``config.pbtxt`` and no version folder), a
hand-written Python-backend model, a bare model file with MONAI metadata, another platform's model, a
``KIND_GPU`` configuration on this machine. The uses printed come from ``repository/servable.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from monai_triton_ops.cli import main
from monai_triton_ops.repository import servable
from monai_triton_ops.repository.check import check_repository, describe_path, local_capabilities

from .. import triton_models
from ..conftest import UNET_META, save_model, tiny_unet
from ..onnx_models import save_onnx
from .test_like import APP_SDK_CONFIG

pytestmark = pytest.mark.usefixtures("restore_console")


@pytest.fixture
def client_side(tmp_path: Path) -> Path:
    repo = tmp_path / "models_client_side"
    (repo / "spleen_ct").mkdir(parents=True)
    (repo / "spleen_ct" / "config.pbtxt").write_text(APP_SDK_CONFIG)
    return repo


def lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return capsys.readouterr().out.splitlines()


def test_a_client_side_folder_checks_clean_and_says_what_it_is_for(
    client_side: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for target in (client_side, client_side / "spleen_ct"):  # the repository, or the model folder itself
        assert main(["repo", "check", str(target)]) == 0
        out = lines(capsys)
        assert out[1].split()[:5] == ["spleen_ct", "client-side", "-", "INPUT_0", "FP32"]
        assert out[1].endswith(" ok")
        assert "spleen_ct: note: a client-side model folder: config.pbtxt only, the model file is on the server" in out
        assert (
            "spleen_ct: use: remote backends (grpc://, http://) and the App SDK's TritonRemoteModel, as its "
            "client-side config"
        ) in out
        assert "spleen_ct: not: the torch backend (no TorchScript file)" in out
        assert "spleen_ct: not: serving (no version folder)" in out
        assert any("the libtorch backend maps outputs ['OUTPUT_0'] by their order" in line for line in out)


def test_describe_a_client_side_folder(client_side: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["repo", "describe", str(client_side / "spleen_ct")]) == 0
    out = lines(capsys)
    assert out[:7] == [
        "model     spleen_ct",
        "kind      client-side",
        "source    config.pbtxt",
        "batch     implicit, up to 16 per request",
        "input 0   INPUT_0 FP32 [-1, 1, 96, 96, 96]",
        "output 0  OUTPUT_0 FP32 [-1, 2, 96, 96, 96]",
        "use       remote backends (grpc://, http://) and the App SDK's TritonRemoteModel, as its client-side config",
    ]


def test_a_hand_written_python_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo = triton_models.identity(tmp_path / "repo", "echo", dims=(-1, 4))
    assert main(["repo", "check", str(repo)]) == 0
    out = lines(capsys)
    assert out[1].split()[:5] == ["echo", "python", "model", "1", "INPUT__0"]
    assert "echo: use: the triton backend and monai-triton serve" in out
    assert "echo: not: the torch backend (no TorchScript file)" in out
    assert main(["repo", "describe", str(repo / "echo")]) == 0
    assert "input 0   INPUT__0 FP32 [-1, 4]" in lines(capsys)
    (repo / "echo" / "1" / "model.py").unlink()
    assert main(["repo", "check", str(repo)]) == 2
    assert f"echo: version 1: no model.py in {str(repo / 'echo' / '1')!r} for the python backend" in lines(capsys)


def test_a_model_file_without_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    save_model(tiny_unet(), tmp_path / "repo" / "seg" / "1" / "model.pt", UNET_META)
    assert main(["repo", "check", str(tmp_path / "repo")]) == 0
    out = lines(capsys)
    assert out[1].split()[:4] == ["seg", "model", "file", "1"]
    assert "seg: use: the torch backend" in out
    assert "seg: not: Triton (no config.pbtxt: monai-triton repo build writes one)" in out


def test_another_platform_and_a_gpu_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU for this process, whatever the machine has
    capabilities = local_capabilities()
    if capabilities is None or "onnxruntime" in capabilities.backends:
        pytest.skip("needs a local Triton without the onnxruntime backend (the wheel's)")
    repo = tmp_path / "repo"
    (repo / "onnx" / "1").mkdir(parents=True)
    save_onnx(  # the config's tensors, batch dynamic: repo check reads the graph against config.pbtxt
        torch.nn.Conv3d(1, 2, 1),
        repo / "onnx" / "1" / "model.onnx",
        [torch.zeros(1, 1, 96, 96, 96)],
        input_names=["INPUT_0"],
        output_names=["OUTPUT_0"],
        dynamic={"INPUT_0": [0], "OUTPUT_0": [0]},
    )
    (repo / "onnx" / "config.pbtxt").write_text(
        APP_SDK_CONFIG.replace('platform: "pytorch_libtorch"', 'platform: "onnxruntime_onnx"').replace(
            "model_spleen_ct_segmentation_v1.ts", "model.onnx"
        )
    )
    triton_models.identity(repo, "gpu")
    config = repo / "gpu" / "config.pbtxt"
    config.write_text(config.read_text().replace("KIND_CPU", "KIND_GPU"))
    reports = {r.name: r for r in check_repository(repo)}
    assert reports["onnx"].kind == "onnxruntime_onnx"
    assert reports["onnx"].problems == ()
    assert reports["onnx"].not_uses == (
        "the torch backend (no TorchScript file)",
        "the triton backend and monai-triton serve: config.pbtxt needs Triton's 'onnxruntime' backend (platform "
        "'onnxruntime_onnx'), which this server does not have (it has: python)",
    )
    assert reports["gpu"].not_uses[-1] == (
        "the triton backend and monai-triton serve: config.pbtxt asks for KIND_GPU instances and this machine "
        "has no GPU"
    )
    assert describe_path(repo / "onnx").kind == "onnxruntime_onnx"


def test_gpu_count_follows_cuda_visible_devices() -> None:
    found = servable.gpu_count({})
    assert servable.gpu_count({"CUDA_VISIBLE_DEVICES": ""}) == 0
    assert servable.gpu_count({"CUDA_VISIBLE_DEVICES": "-1"}) == 0
    assert servable.gpu_count({"CUDA_VISIBLE_DEVICES": "0"}) == min(found, 1)


def test_check_needs_a_repository_or_a_server(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["repo", "check"]) == 2
    assert capsys.readouterr().err == "error: monai-triton repo check: give a model repository, --server URL, or both\n"
    assert main(["repo", "check", "--server", "ftp://x:1"]) == 2
    assert "server URL 'ftp://x:1': expected grpc://HOST:PORT" in capsys.readouterr().err


def test_a_server_model_that_is_not_ready_is_a_problem_with_its_reason(client_side: Path) -> None:
    """What ``repo check --server`` makes of an index entry the server could not load (the entries as it reports)."""
    from monai_triton_ops.client.endpoints import server_endpoint
    from monai_triton_ops.repository.served import ServedModel, against_server, render_served

    served = [ServedModel(name="spleen_ct", version="1", state="UNAVAILABLE", reason="instance group has KIND_GPU")]
    [report] = against_server(check_repository(client_side), served, "http://triton:8000")
    assert report.problems[-1] == "on the server http://triton:8000 but UNAVAILABLE: instance group has KIND_GPU"
    text = render_served(served, "http://triton:8000").splitlines()
    assert text[2].split() == ["spleen_ct", "1", "UNAVAILABLE", "-", "-", "-"]
    assert text[3] == "spleen_ct: UNAVAILABLE: instance group has KIND_GPU"
    bare, tls = server_endpoint("triton:8000"), server_endpoint("grpcs://triton:8001")
    assert (bare.protocol, bare.address, bare.tls) == ("http", "triton:8000", False)
    assert (tls.protocol, tls.address, tls.tls) == ("grpc", "triton:8001", True)
