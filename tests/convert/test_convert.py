"""``monai-triton convert``: the sample model and a bundle as ONNX and ``.pt2`` give the TorchScript's labels on every
backend, and a conversion that cannot be right is refused with nothing written.

One module-scoped set of conversions (the sample model and a zoo-style bundle, each to ONNX and to ``.pt2``),
one repository of the four, one tritonserver for gRPC and HTTP; a 16^3 volume.
"""

from __future__ import annotations

import re
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from monai_triton_ops import create_backend
from monai_triton_ops.cli import main
from monai_triton_ops.convert import convert
from monai_triton_ops.errors import ConversionError
from monai_triton_ops.repository.builder import build_repository
from monai_triton_ops.repository.bundle import build_bundle
from monai_triton_ops.repository.check import check_entry
from monai_triton_ops.repository.metadata import load_exported_program, read_torchscript_metadata
from monai_triton_ops.repository.onnx_model import read_onnx

from ..bundles.makers import unet_bundle
from ..conftest import ROOT, save_model

SAMPLE = ROOT / "model_repository"
SAMPLE_NETWORK = f"{ROOT / 'apps' / 'brain_tissue_seg' / 'network.py'}:build_network"
SIZE = 16
TOLERANCE = 1e-4
#: entry -> (reference entry in the TorchScript repository, in-process backend that runs it)
ENTRIES = {
    "sample_onnx": ("brain_tissue_seg", "onnx"),
    "sample_pt2": ("brain_tissue_seg", "torch"),
    "bundle_onnx": ("bundle", "onnx"),
    "bundle_pt2": ("bundle", "torch"),
}


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """``(TorchScript repo, converted repo, scratch)``: the sample model and a bundle, converted both ways and built."""
    root = tmp_path_factory.mktemp("convert")
    bundle = unet_bundle(root / "bundle", "pt")  # network_def + models/model.pt
    torch_repo = root / "torch"
    build_bundle(bundle, torch_repo, "bundle")
    repo = root / "converted"
    sample = SAMPLE / "brain_tissue_seg" / "1" / "model.pt"
    files = {
        "sample_onnx": convert(sample, "onnx", root / "sample.onnx").path,
        "sample_pt2": convert(sample, "pt2", root / "sample.pt2", network=SAMPLE_NETWORK).path,
        "bundle_onnx": convert(bundle, "onnx", root / "bundle_onnx").path / "models" / "model.onnx",
        "bundle_pt2": convert(bundle, "pt2", root / "bundle_pt2").path / "models" / "model.pt2",
    }
    for name, path in files.items():
        build_repository(path, repo, name)
    return torch_repo, repo, root


@pytest.fixture(scope="module")
def references(converted: tuple[Path, Path, Path]) -> dict[str, np.ndarray]:
    """Each TorchScript source's logits on ``torch`` for the test volume."""
    image = _image()
    found = {}
    for name, repo in (("brain_tissue_seg", SAMPLE), ("bundle", converted[0])):
        with create_backend("torch", name, model_repository=repo) as backend:
            signature = backend.signature
            found[name] = np.asarray(backend.infer({signature.input_names[0]: image})[signature.output_names[0]])
    return found


@pytest.fixture(scope="module")
def server(converted: tuple[Path, Path, Path]) -> Iterator[object]:
    from monai_triton_ops.errors import ServerNotFoundError
    from monai_triton_ops.server import LocalTritonServer, find_tritonserver

    from ..server.conftest import stop_and_check

    try:
        find_tritonserver()
    except ServerNotFoundError as exc:
        pytest.skip(f"no tritonserver: {exc}")
    server = LocalTritonServer(converted[1], startup_timeout_s=300.0, stop_timeout_s=10.0)
    server.start()
    yield server
    stop_and_check(server)


def _image() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((1, 1, SIZE, SIZE, SIZE)).astype(np.float32)


def _check_all(
    spec: str | None, repo: Path | None, references: dict[str, np.ndarray], entries: tuple[str, ...] = tuple(ENTRIES)
) -> None:
    """Converted ``entries`` on ``spec`` (``None``: each one's in-process backend) against its TorchScript source."""
    for name in entries:
        source, kind = ENTRIES[name]
        with create_backend(spec or kind, name, model_repository=repo) as backend:
            output = backend.signature.output_names[0]
            logits = np.asarray(backend.infer({backend.signature.input_names[0]: _image()})[output])
        reference = references[source]
        assert np.abs(logits - reference).max() <= TOLERANCE, name
        np.testing.assert_array_equal(logits.argmax(axis=1), reference.argmax(axis=1), err_msg=name)


def test_converted_files_carry_the_metadata_and_dynamic_axes(converted: tuple[Path, Path, Path]) -> None:
    root = converted[2]
    sample_meta = read_torchscript_metadata(SAMPLE / "brain_tissue_seg" / "1" / "model.pt")
    model = read_onnx(root / "sample.onnx")
    assert model.metadata == sample_meta
    assert [t.shape for t in (*model.inputs, *model.outputs)] == [(-1, 1, -1, -1, -1), (-1, 3, -1, -1, -1)]
    assert [t.name for t in (*model.inputs, *model.outputs)] == ["x", "OUTPUT__0"]
    exported = onnx.load(str(root / "sample.onnx"))
    assert exported.opset_import[0].version == 17
    ops = [node.op_type for node in exported.graph.node]  # its one-slope PReLUs rewritten (onnx_rewrite.py)
    assert "PRelu" not in ops
    assert ops.count("LeakyRelu") == 9
    program, meta = load_exported_program(root / "sample.pt2")
    assert meta == sample_meta
    batch_and_size = program.module()(torch.zeros(3, 1, 24, 16, 32)).shape  # another batch and spatial size
    assert tuple(batch_and_size) == (3, 3, 24, 16, 32)
    bundle = root / "bundle_pt2"
    assert sorted(p.name for p in (bundle / "models").iterdir()) == ["model.pt2"]
    assert (bundle / "configs" / "inference.json").read_text() == (
        root / "bundle" / "configs" / "inference.json"
    ).read_text()
    report = check_entry(converted[1], "sample_pt2")
    assert not report.problems


def test_converted_models_give_the_torchscript_labels_in_process(
    converted: tuple[Path, Path, Path], references: dict[str, np.ndarray]
) -> None:
    _check_all(None, converted[1], references)


@pytest.mark.triton
def test_converted_models_give_the_torchscript_labels_on_in_process_triton(
    converted: tuple[Path, Path, Path], references: dict[str, np.ndarray]
) -> None:
    from monai_triton_ops.discovery import find_triton_library
    from monai_triton_ops.errors import ServerNotFoundError

    try:
        find_triton_library()
    except ServerNotFoundError as exc:
        pytest.skip(f"no libtritonserver: {exc}")
    # the .pt2 entries: in-process Triton starts its core per backend (~15 s each here), and an ONNX file takes the
    # runner's ONNX Runtime path, which tests/backends/test_onnx.py runs on in-process Triton already
    _check_all("triton", converted[1], references, ("sample_pt2", "bundle_pt2"))


@pytest.mark.triton
@pytest.mark.parametrize("scheme", ["grpc", "http"])
def test_converted_models_give_the_torchscript_labels_on_a_remote_server(
    server: object, scheme: str, references: dict[str, np.ndarray]
) -> None:
    _check_all(getattr(server, f"{scheme}_url"), None, references)


def _scripted_with_network(tmp_path: Path, body: str) -> tuple[Path, str]:
    """A TorchScript file of a tiny module and ``FILE.py:build`` giving the same module in Python."""
    source = textwrap.dedent(
        f"""
        import torch

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = torch.nn.Conv3d(1, 2, 3, padding=1)
                self.calls = 0

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                {body}

        def build():
            torch.manual_seed(0)
            return Net()
        """
    )
    (tmp_path / "net.py").write_text(source)
    namespace: dict[str, object] = {}
    exec(compile(source, str(tmp_path / "net.py"), "exec"), namespace)  # noqa: S102 - the test's own module
    scripted = save_model(namespace["build"](), tmp_path / "net.pt", None)  # type: ignore[operator]
    return scripted, f"{tmp_path / 'net.py'}:build"


def test_data_dependent_control_flow_is_refused_for_onnx_and_pt2(tmp_path: Path) -> None:
    model, network = _scripted_with_network(tmp_path, "return self.conv(x) if bool(x.sum() > 0) else -self.conv(x)")
    shape = [[2, 1, 8, 8, 8]]
    with pytest.raises(
        ConversionError, match=r"model 'net' cannot be exported by torch\.onnx\.export: its control flow"
    ):
        convert(model, "onnx", tmp_path / "net.onnx", network=network, input_shapes=shape)
    with pytest.raises(ConversionError, match=r"model 'net' cannot be exported with torch\.export \(control flow"):
        convert(model, "pt2", tmp_path / "net.pt2", network=network, input_shapes=shape)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "__pycache__") == ["net.pt", "net.py"]


def test_a_conversion_over_the_tolerance_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    # Python state the trace freezes: the source ran with calls == 1, the export with calls == 2.
    model, network = _scripted_with_network(
        tmp_path, "self.calls += 1\n                return self.conv(x) * self.calls"
    )
    with pytest.raises(
        ConversionError,
        match=r"model 'net': the onnx model differs from the source by [\d.]+ .*over the tolerance 0\.0001; nothing",
    ):
        convert(model, "onnx", tmp_path / "net.onnx", network=network, input_shapes=[[2, 1, 8, 8, 8]])
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "__pycache__") == ["net.pt", "net.py"]


def test_the_cli_prints_the_difference_and_refuses_an_unknown_target(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ..conftest import UNET_META, tiny_unet

    model = save_model(tiny_unet(), tmp_path / "unet.pt", UNET_META)
    assert main(["convert", str(model), "--to", "onnx", "-o", str(tmp_path / "out.onnx")]) == 0
    assert "max abs difference against" in capsys.readouterr().out
    assert main(["convert", str(model), "--to", "tflite", "-o", str(tmp_path / "out.tflite")]) == 2
    err = capsys.readouterr().err
    assert "unknown conversion target --to 'tflite'; expected one of ['onnx', 'pt2']" in err
    assert "Traceback" not in err
    assert main(["convert", str(model), "--to", "pt2"]) == 2
    assert "a .pt2 needs the Python network: pass --network FILE.py:FUNCTION" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.onnx", "unet.pt"]


def test_a_converted_bundle_builds_and_serves_its_own_file(
    converted: tuple[Path, Path, Path], references: dict[str, np.ndarray]
) -> None:
    root, repo = converted[2], converted[2] / "bundles"
    for form, kind in (("onnx", "onnx"), ("pt2", "torch")):
        folder = build_bundle(root / f"bundle_{form}", repo, f"bundle_{form}")
        assert (folder / "1" / f"model.{form}").is_file()
        assert (folder / "configs" / "inference.json").is_file()
        with create_backend(kind, f"bundle_{form}", model_repository=repo) as backend:
            assert (backend.signature.input_names, backend.signature.output_names) == (("image",), ("pred",))
            logits = np.asarray(backend.infer({"image": _image()})["pred"])
        np.testing.assert_array_equal(logits.argmax(axis=1), references["bundle"].argmax(axis=1))


def test_the_torch_backend_refuses_an_onnx_model_and_bundle_naming_the_file_and_the_backends_that_run_it(
    converted: tuple[Path, Path, Path],
) -> None:
    from monai.deploy.core import Application, Image, IOType
    from monai.deploy.operators.monai_bundle_inference_operator import IOMapping

    from monai_triton_ops import InferenceOperator
    from monai_triton_ops.errors import BundleError, ConfigError

    backend = create_backend("torch", "sample_onnx", model_repository=converted[1])
    refused = r"model 'sample_onnx': its network is ONNX \('.*/sample_onnx/1/model\.onnx'\), which the 'torch' backend"
    with pytest.raises(ConfigError, match=rf"{refused} .* cannot run; use --backend onnx .* or --backend triton"):
        backend.open()
    mapping = {"input_mapping": [IOMapping("image", Image, IOType.IN_MEMORY)],
               "output_mapping": [IOMapping("pred", Image, IOType.IN_MEMORY)]}  # fmt: skip
    repository = converted[2] / "for_torch"  # a bundle folder, and the model folder repo build made of it
    build_bundle(converted[2] / "bundle_onnx", repository, "bundle_onnx")
    for bundle, file in (
        (converted[2] / "bundle_onnx", "models/model.onnx"),
        (repository / "bundle_onnx", "1/model.onnx"),
    ):
        op = InferenceOperator(Application(), bundle_path=bundle, backend="torch", **mapping)
        where = re.escape(str(bundle / file))
        with pytest.raises(BundleError, match=rf"bundle file {where}: is ONNX \(monai-triton convert --to onnx\), "
                           r"which the 'torch' backend .* cannot run; pass --backend onnx"):  # fmt: skip
            op.start()


@pytest.mark.slow
def test_apps_bundle_seg_runs_the_onnx_bundle_unchanged(converted: tuple[Path, Path, Path], tmp_path: Path) -> None:
    import nibabel as nib
    from monai.deploy.core import AppContext, Application, Image, IOType
    from monai.deploy.operators.monai_bundle_inference_operator import IOMapping, MonaiBundleInferenceOperator

    from monai_triton_ops.operators.nifti import read_nifti

    from .. import warm_python
    from ..apps.test_bundle_seg import APP, ct_volume
    from ..operators.test_bundle import Ports

    image = tmp_path / "ct.nii.gz"
    nib.save(nib.Nifti1Image(ct_volume().astype(np.float32), np.diag([1.2, 1.2, 2.5, 1.0])), image)
    bundle = converted[2] / "bundle_onnx"
    command = [sys.executable, str(APP), "-i", str(image), "-o", str(tmp_path / "out"), "-m", str(bundle)]
    result = warm_python.run([*command, "--backend", "onnx"], cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    reference = MonaiBundleInferenceOperator(
        Application(), app_context=AppContext({}), bundle_path=converted[2] / "bundle",
        input_mapping=[IOMapping("image", Image, IOType.IN_MEMORY)],
        output_mapping=[IOMapping("pred", Image, IOType.IN_MEMORY)],
    )  # fmt: skip
    ports = Ports({"image": read_nifti(image)})
    reference.compute(ports, ports, None)
    want = ports.emitted["pred"].asnumpy().T
    assert len(np.unique(want)) > 1
    np.testing.assert_array_equal(np.asarray(nib.load(tmp_path / "out" / "seg.nii.gz").dataobj), want)
