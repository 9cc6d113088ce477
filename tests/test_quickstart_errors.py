"""docs/quickstart.md's error table matches the code: each row is caused for real, message and exit code checked.

Every row needs a trigger here and every trigger a row, so the table cannot drift from what users see.
What is compared is the line after ``error: ``, as ``exits.one_line`` prints it; ``...`` in the table is any text.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from monai.deploy.core import Application, Image

from monai_triton_ops import InferenceSettings, create_backend, deployment, errors, exits, preflight
from monai_triton_ops.app_args import app_parser, resolve_backend
from monai_triton_ops.app_settings import app_yaml_of, model_name_for, read_app_environment, resolve_backend_options
from monai_triton_ops.backends import registry
from monai_triton_ops.backends.mock import MockBackend
from monai_triton_ops.operators.bundle import locate
from monai_triton_ops.operators.nifti import NiftiImageLoader
from monai_triton_ops.pipeline.inputs import check_dicom_images, classify_input
from monai_triton_ops.repository.builder import build_repository
from monai_triton_ops.server import LocalTritonServer, find_tritonserver
from monai_triton_ops.signature import ModelSignature, TensorSpec

from .conftest import UNET_META, nd_format, save_model, tiny_unet
from .operators.test_operator import OneShotApp
from .pipeline.test_inputs import write_dicom

QUICKSTART = Path(__file__).resolve().parents[1] / "docs" / "quickstart.md"
ROW = re.compile(r"^\| (\d) \| `(.+?)` \| .+ \|$")


def table() -> dict[str, int]:
    """``{message prefix: exit code}`` from section 4 of the quick start."""
    text = QUICKSTART.read_text(encoding="utf-8")
    section = text[text.index("## 4. Errors you may meet") :]
    return {m.group(2): int(m.group(1)) for line in section.splitlines() if (m := ROW.match(line))}


def raised(call: Callable[[], object]) -> BaseException:
    try:
        call()
    except BaseException as exc:  # the trigger's error is what the row documents
        return exc
    pytest.fail("the trigger raised nothing")


# -- the triggers ---------------------------------------------------------------------------------------------
@pytest.fixture
def repo(tmp_path: Path) -> Path:
    save_model(tiny_unet(), tmp_path / "repo" / "seg" / "1" / "model.pt", UNET_META)
    return tmp_path / "repo"


def infer(repo: Path, data: np.ndarray, **kwargs: object) -> None:
    """The image through a real App SDK application with the operator, as an app runs it."""
    settings = InferenceSettings(roi_size=(8, 8, 8), sw_batch_size=2)
    OneShotApp(Image(data, metadata={}), model_name="seg", backend="torch", backend_options={"model_repository": repo},
               settings=settings, **kwargs).run()  # fmt: skip


def volume(*channels: int, dtype: type = np.float32) -> np.ndarray:
    return np.random.default_rng(0).standard_normal((10, 12, 16, *channels)).astype(dtype)


def nan_volume() -> np.ndarray:
    data = volume()
    data[1, 2, 3:6] = np.nan
    return data


def dictionary_chain(pred_key: str) -> dict[str, object]:
    """App SDK dictionary transforms whose post-transforms use ``pred_key`` for the prediction."""
    from monai.transforms import AsDiscreted, Compose, EnsureChannelFirstd, EnsureTyped

    return {
        "pre_transforms": Compose([EnsureChannelFirstd(keys="image"), EnsureTyped(keys="image")]),
        "post_transforms": Compose([AsDiscreted(keys=pred_key, argmax=True)]),
    }


def port_in_use(tmp_path: Path) -> BaseException:
    try:
        find_tritonserver()
    except exits.ServerError:
        pytest.skip("no tritonserver installed: the port check comes after finding it")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        return raised(LocalTritonServer(tmp_path, grpc_port=sock.getsockname()[1]).start)


def stub_cannot_start(tmp_path: Path) -> BaseException:
    """A repository with a Python model, served where the stub cannot link its libpython (the real stub, renamed)."""
    from .server.conftest import make_broken_stub_home, write_model

    try:
        install = find_tritonserver()
    except exits.ServerError:
        pytest.skip("no tritonserver installed")
    home = make_broken_stub_home(install, tmp_path / "broken_stub")
    return raised(LocalTritonServer(write_model(tmp_path / "stub_repo", "seg"), server_path=home).start)


def dead_stub() -> BaseException:
    """What each Triton backend makes of a dead stub's answer: through the status table, where the message is made.

    Caused for real on all three backends in ``tests/backends/test_contract.py`` (a stub that calls ``os._exit``).
    """
    from monai_triton_ops.client import status

    answer = status.from_triton_code("INTERNAL", "Stub process 'seg_0_0' is not healthy.")
    return status.to_public(answer, model="seg", url=status.IN_PROCESS)


def server_failed() -> BaseException:
    """What a server's internal error becomes, through the status table, where the message is made.

    Caused for real by a model that raises: on KServe's model server over gRPC and HTTP
    (``tests/backends/remote/test_kserve.py``), on Triton (``tests/backends/remote/test_failures.py``).
    """
    from monai_triton_ops.client import status

    answer = status.from_grpc_status("StatusCode.INTERNAL", "Internal server error")
    return status.to_public(answer, model="seg", url="grpc://127.0.0.1:8001")


def mixed_fleet(tmp_path: Path) -> BaseException:
    """Two real servers that serve different models under one name: refused when the backend opens."""
    from . import triton_models

    try:
        find_tritonserver()
    except exits.ServerError:
        pytest.skip("no tritonserver installed")
    vector = triton_models.passthrough(tmp_path / "vector", "seg")
    matrix = triton_models.passthrough(tmp_path / "matrix", "seg", dims=(-1, -1))
    with LocalTritonServer(vector) as first, LocalTritonServer(matrix) as second:
        return raised(lambda: create_backend(f"{first.grpc_url},{second.grpc_address}", "seg").open())


def no_volume_model(tmp_path: Path) -> BaseException:
    """``mode=volume`` against a real server that serves the network (a stand-in without torch) and no volume model."""
    from . import triton_models

    try:
        find_tritonserver()
    except exits.ServerError:
        pytest.skip("no tritonserver installed")
    repo = triton_models.passthrough(tmp_path / "served", "seg", dims=(-1, 1, -1, -1, -1))
    with LocalTritonServer(repo, startup_timeout_s=180.0) as server:
        backend = create_backend(f"{server.grpc_url}?mode=volume&ready_timeout_s=10", "seg")
        try:
            return raised(backend.open)
        finally:
            backend.close()


def volume_over_limit() -> BaseException:
    """The client's check before a whole-volume request is sent (the server's own check: tests/backends/remote)."""
    from monai_triton_ops.pipeline.volume import check_volume_size
    from monai_triton_ops.repository.volume import plan_volume
    from monai_triton_ops.signature import ModelSignature, TensorSpec

    network = ModelSignature(
        name="seg",
        inputs=(TensorSpec(name="x", dtype="FP32", shape=(-1, 1, -1, -1, -1)),),
        outputs=(TensorSpec(name="y", dtype="FP32", shape=(-1, 3, -1, -1, -1)),),
    )
    _, spec = plan_volume(network, max_volume_mb=1)
    backend = create_backend("grpc://127.0.0.1:9?mode=volume", "seg")  # created, not opened: nothing connects
    return raised(lambda: check_volume_size(torch.zeros(1, 1, 80, 64, 64), backend, spec))


def two_inputs_wrapped(tmp_path: Path) -> BaseException:
    from monai_triton_ops.repository.volume import wrap_network

    from .conftest import TWO_META, TwoInTwoOut

    build_repository(save_model(TwoInTwoOut(), tmp_path / "two.pt", TWO_META), tmp_path / "two_repo", "seg")
    return raised(lambda: wrap_network(tmp_path / "two_repo", "seg"))


def untrusted_tls(tmp_path: Path) -> BaseException:
    """A real TLS listener on loopback whose certificate another CA signed than the one the client is given."""
    import ssl
    import threading

    from .backends.remote import certs

    server_pair = certs.authority(tmp_path / "pki", "ca").issue(tmp_path / "pki", "server", server=True)
    other = certs.authority(tmp_path / "pki", "other-ca")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(server_pair.cert, server_pair.key)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(10)

        def accept() -> None:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn, contextlib.suppress(OSError):
                context.wrap_socket(conn, server_side=True)

        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        spec = f"grpcs://127.0.0.1:{listener.getsockname()[1]}?ready_timeout_s=5"
        exc = raised(lambda: create_backend(spec, "seg", root_certificates=other.pem).open())
        thread.join(timeout=10)
    return exc


def no_answer_in_time() -> BaseException:
    """A model slower than the request's deadline (the base class's deadline, the same for every backend)."""
    signature = ModelSignature(
        name="seg",
        inputs=(TensorSpec(name="x", dtype="FP32", shape=(-1,)),),
        outputs=(TensorSpec(name="y", dtype="FP32", shape=(-1,)),),
    )

    def slow(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        time.sleep(0.5)
        return {"y": inputs["x"]}

    with MockBackend(signature=signature, fn=slow) as backend:
        return raised(lambda: backend.infer({"x": np.ones(2, np.float32)}, timeout_s=0.1))


def index_not_in_time() -> BaseException:
    from monai_triton_ops.repository.served import ServerView

    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with ServerView(f"grpc://127.0.0.1:{port}", timeout_s=0.5) as view:
        return raised(view.models)


def served_differently(tmp_path: Path, repo: Path) -> BaseException:
    """``repo check MODELS --server URL`` against a real server that does not serve the local model."""
    from monai_triton_ops import cli

    try:
        find_tritonserver()
    except exits.ServerError:
        pytest.skip("no tritonserver installed")
    (tmp_path / "served").mkdir()
    with LocalTritonServer(tmp_path / "served") as server:  # an empty repository: the quickest start
        args = cli.build_parser().parse_args(["repo", "check", str(repo), "--server", server.grpc_url])
        return raised(lambda: args.handler(args))


def unservable(tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch) -> BaseException:
    """What ``serve``, ``LocalTritonServer`` and the ``triton`` backend raise when such a model fails to load:
    the error made from its ``config.pbtxt`` and the install (``tests/repository/test_servable.py`` causes both
    with real loads, in a process that sees no GPU)."""
    from monai_triton_ops.repository import servable

    from .repository.test_servable import gpu_model, libtorch_model

    try:
        install = find_tritonserver()
    except exits.ServerError:
        pytest.skip("no tritonserver installed")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    if kind == "libtorch" and "pytorch" in servable.Capabilities.of_install(install).backends:
        pytest.skip("this Triton has the libtorch backend")
    model = (gpu_model if kind == "gpu" else libtorch_model)(tmp_path / kind) / "seg"
    error = servable.load_failure(model, install, "Triton's own reason", where="tritonserver")
    assert error is not None
    return error


def like_mismatch(tmp_path: Path, repo: Path) -> BaseException:
    template = tmp_path / "client" / "seg" / "config.pbtxt"
    template.parent.mkdir(parents=True)
    template.write_text(
        'name: "seg"\nbackend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "INPUT_0" data_type: TYPE_FP32 dims: [ -1, 2, -1, -1, -1 ] } ]\n'
        'output [ { name: "OUTPUT_0" data_type: TYPE_FP32 dims: [ -1, 3, -1, -1, -1 ] } ]\n'
    )
    model = repo / "seg" / "1" / "model.pt"
    return raised(lambda: build_repository(model, tmp_path / "built", "seg", like=template))


def holoscan_model_path_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> BaseException:
    """An app started as a MAP starts it: no options, the folders from ``HOLOSCAN_*``, the models not there."""
    from monai_triton_ops.app_args import init_app_context

    (tmp_path / "image.nii.gz").write_bytes(b"\0")
    monkeypatch.setenv("HOLOSCAN_INPUT_PATH", str(tmp_path / "image.nii.gz"))
    monkeypatch.setenv("HOLOSCAN_OUTPUT_PATH", str(tmp_path / "out"))
    monkeypatch.setenv("HOLOSCAN_MODEL_PATH", str(tmp_path / "models"))
    monkeypatch.delenv("HOLOSCAN_CONFIG_PATH", raising=False)
    return raised(lambda: init_app_context([str(tmp_path / "map_app" / "app.py")]))  # no app.yaml beside it


def not_writable(tmp_path: Path) -> BaseException:
    folder = Path("/sys") if os.geteuid() == 0 else tmp_path / "ro"  # root writes anywhere but on read-only mounts
    if folder != Path("/sys"):
        folder.mkdir()
        folder.chmod(0o555)
    exc = raised(lambda: preflight.check_output_folder(folder))
    if not isinstance(exc, exits.MonaiTritonError):
        pytest.skip(f"{folder} is writable here")
    return exc


def volume_bundle(folder: Path) -> object:
    """A bundle whose inferer the server's sliding window cannot be, over a remote backend in volume mode: refused
    when it starts, before anything connects."""
    from monai.deploy.core import IOType
    from monai.deploy.operators.monai_bundle_inference_operator import IOMapping

    from monai_triton_ops import InferenceOperator

    from .bundles.makers import unet_bundle

    return InferenceOperator(
        Application(),
        bundle_path=unet_bundle(folder, inferer={"_target_": "SliceInferer", "roi_size": [16, 16], "spatial_dim": 2}),
        backend="grpc://127.0.0.1:9?mode=volume",  # nothing listens on 9: the refusal comes first
        input_mapping=[IOMapping("image", Image, IOType.IN_MEMORY)],
        output_mapping=[IOMapping("pred", Image, IOType.IN_MEMORY)],
    )


def bundle_rows(tmp_path: Path) -> dict[str, Callable[[], BaseException]]:
    """The broken bundles of ``tests/bundles/broken.py``, read as every backend and ``repo build`` read them."""
    from monai_triton_ops.bundles import read_bundle

    from .bundles.broken import BROKEN

    def read(kind: str) -> Callable[[], BaseException]:
        return lambda: raised(lambda: read_bundle(*BROKEN[kind](tmp_path / "bundles" / kind)))

    return {
        "bundle file .../configs/metadata.json: is missing: a bundle needs its metadata ...": read("no_metadata"),
        "bundle file .../configs/inference.json: is not valid JSON: ... at line ... column ...": read("json_syntax"),
        "bundle file .../configs: has no config '...' (..., .yaml or .yml; configs present: [...]); check "
        "bundle_config_names (--config-name)": read("config_name_missing"),
        "bundle file .../configs/inference.json, item 'preprocessing': ...": read("unknown_transform"),
        "bundle file .../configs/inference.json, item 'network_def': has no 'network_def' item, which model.pt ...": (
            read("missing_network_def")
        ),
        "bundle file .../models/model.pt, item 'network_def': weights do not fit the network of ...": read(
            "weights_do_not_fit"
        ),
        "bundle file .../configs/metadata.json, item 'network_data_format#inputs': the network takes 2 inputs [...]; "
        "...": read("two_inputs"),
        "bundle file .../configs/inference.json, item 'inferer': SaliencyInferer (an Inferer) may need the network as "
        "a torch module, ...": read("module_inferer"),
        "bundle file .../configs/inference.json, item 'inferer': SliceInferer is not a SlidingWindowInferer; "
        "mode=volume runs MONAI's SlidingWindowInferer (or SimpleInferer) on the server: ...": (
            lambda: raised(lambda: volume_bundle(tmp_path / "bundles" / "volume").start())
        ),
        "bundle file .../configs/metadata.json, item 'network_data_format#outputs#pred': channel_def names ... "
        "classes [...] but num_channels is ...": read("class_names_count"),
        "bundle file .../configs/metadata.json, item 'network_data_format#outputs#pred': output 'pred' is scores (not "
        "a spatial image), but the operator's output_mapping declares it an Image port; ...": (
            lambda: raised(lambda: scores_as_image(tmp_path / "bundles" / "scores_as_image"))
        ),
    }


def scores_as_image(folder: Path) -> object:
    """The zoo's breast density bundle wired as a segmentation app wires its output: an ``Image`` port."""
    from monai.deploy.core import IOType
    from monai.deploy.operators.monai_bundle_inference_operator import IOMapping

    from monai_triton_ops import InferenceOperator

    from .bundles.classify import classify_bundle

    return InferenceOperator(
        Application(),
        bundle_path=classify_bundle(folder),
        backend="torch",
        input_mapping=[IOMapping("image", Image, IOType.IN_MEMORY)],
        output_mapping=[IOMapping("pred", Image, IOType.IN_MEMORY)],
    )


def ensemble_rows(tmp_path: Path) -> dict[str, Callable[[], BaseException]]:
    """The ensemble operator's refusals: each made by the operator (when the graph is composed, or at ``start()``)."""
    from monai.deploy.core import IOType
    from monai.deploy.operators.monai_bundle_inference_operator import IOMapping

    from monai_triton_ops import Ensemble, EnsembleInferenceOperator, Member

    from .bundles.makers import fold_bundle, resampled
    from .operators.test_ensemble import unet

    def models() -> Path:
        folder = tmp_path / "ensemble"
        save_model(unet(0), folder / "fold0" / "1" / "model.pt", UNET_META)
        two = nd_format({"image": (1, ["2*n"] * 3, "float32")}, {"pred": (2, ["2*n"] * 3, "float32")})
        save_model(unet(1, out_channels=2), folder / "two_channels" / "1" / "model.pt", two)
        return folder

    def bundles() -> Path:
        folder = tmp_path / "bundle_folds"
        fold_bundle(folder / "fold0", 0)
        fold_bundle(folder / "fold3", 3, preprocessing=resampled([2.0, 2.0, 2.0]))
        return folder

    def operator(members: list[str | Member], folder: Path | None = None, **keywords: object) -> object:
        return EnsembleInferenceOperator(
            Application(), ensemble=Ensemble(members, mirror_axes=(0,)), backend="torch", model_path=folder, **keywords
        )

    mapping = {
        "input_mapping": [IOMapping("image", Image, IOType.IN_MEMORY)],
        "output_mapping": [IOMapping("pred", Image, IOType.IN_MEMORY)],
    }
    volume = Member("fold1", backend="grpc://127.0.0.1:9?mode=volume")  # refused before it connects
    return {
        "ensemble member 'fold9' is not in the models folder '...' (models there: ...); each member must be a "
        "model's folder name": lambda: raised(lambda: operator(["fold0", "fold9"], models())),
        "ensemble member 'two_channels' gives 2 output channels, member 'fold0' gives 3: the members of an ensemble "
        "must predict the same channels": lambda: raised(operator(["fold0", "two_channels"], models()).start),
        "bundle file .../configs/inference.json, item 'preprocessing#transforms#3#pixdim': ensemble member 'fold3' "
        "has [2.0, 2.0, 2.0], member 'fold0' has [1.5, 1.5, 2.0]: the members of a bundle ensemble share one "
        "pre-processing, inferer and post-processing ...": lambda: raised(
            lambda: operator(["fold0", "fold3"], bundles(), **mapping)
        ),
        "ensemble member 'fold1': mode=volume sends the whole image to the server's sliding window over one model, "
        "and an ensemble (or test-time mirroring) combines every member's prediction of each window in the app; ...": (
            lambda: raised(operator([volume]).start)
        ),
    }


def triggers(tmp_path: Path, repo: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Callable[[], BaseException]]:
    empty, no_dicom, ct = tmp_path / "empty", tmp_path / "no_dicom", tmp_path / "ct"
    for folder in (empty, no_dicom, ct):
        folder.mkdir()
    (no_dicom / "notes.txt").write_text("")
    write_dicom(ct / "IM0001", modality="CT")
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(registry, "_registry", dict(registry._registry))
    registry.register_backend("fancy", "not_installed_pkg.backend:Fancy", hint="pip install fancy-backend")

    def model_entry(version: int | None = None, name: str = "seg", folder: Path = repo) -> Callable[[], object]:
        return lambda: preflight.check_model_entry("torch", folder, name, version)

    def broken(what: str) -> Path:
        copy = tmp_path / what
        save_model(tiny_unet(), copy / "seg" / "1" / "model.pt", UNET_META)
        if what == "config":
            (copy / "seg" / "config.pbtxt").write_text('name: "seg" input [')
        elif what == "no_file":
            (copy / "seg" / "1" / "model.pt").unlink()
        else:
            (copy / "seg" / "1" / "model.pt").write_bytes(b"not a model")
        return copy

    plain = tmp_path / "plain.pt"
    torch.jit.script(torch.nn.Identity()).save(str(plain))
    (tmp_path / "app.yaml").write_text("application: [unclosed\n")
    monkeypatch.delenv("TRITON_TOKEN", raising=False)
    return {
        "unknown backend spec 'trition'; expected one of: ...": lambda: raised(lambda: resolve_backend("trition")),
        "backend 'fancy' cannot be imported (...)": lambda: raised(lambda: preflight.check_backend("fancy")),
        "model 'seg' on grpc://... was not ready within ... s (ready_timeout_s): ...": lambda: raised(
            lambda: create_backend("grpc://127.0.0.1:9?ready_timeout_s=0.5", "seg").open()  # nothing listens on 9
        ),
        "model 'seg' was not ready on any of its 2 servers within ... s (ready_timeout_s): grpc://... connection "
        "refused (...); ...": lambda: raised(
            lambda: create_backend("grpc://127.0.0.1:9,127.0.0.1:7?ready_timeout_s=0.5", "seg").open()
        ),
        "model 'seg': the servers do not serve the same model: grpc://... differs from grpc://...: ...": lambda: (
            mixed_fleet(tmp_path)
        ),
        "model 'seg': option servers: 'h2' is not HOST:PORT (or grpc://HOST:PORT, the spec's scheme)": lambda: raised(
            lambda: create_backend("grpc://h1:8001?servers=h2", "seg")
        ),
        "model 'seg': fallback=torch needs the local model repository (...)": lambda: raised(
            lambda: create_backend("grpc://127.0.0.1:9?fallback=torch", "seg").open()
        ),
        "model 'seg': shared_memory=system needs one server on this host, and ... is 2; ...": lambda: raised(
            lambda: create_backend("grpc://h1:8001,h2:8001?shared_memory=system", "seg")
        ),
        "seg: unrecognized arguments: --bogus": lambda: raised(lambda: app_parser("seg").parse_args(["--bogus"])),
        "Holoscan configuration file '...' (--config) does not exist": lambda: raised(
            lambda: preflight.check_holoscan_options(["seg", "--config", str(tmp_path / "nope.yaml")])
        ),
        "input '...' does not exist": lambda: raised(lambda: preflight.check_input(tmp_path / "nope")),
        "input '...' is not a NIfTI file (.nii or .nii.gz)": lambda: raised(
            lambda: NiftiImageLoader(Application(), input_path=empty)
        ),
        "input folder '...' is empty": lambda: raised(lambda: classify_input(empty)),
        "input folder '...' holds no DICOM series": lambda: raised(lambda: classify_input(no_dicom)),
        "input folder '...' holds no DICOM MR image series (found: ...)": lambda: raised(
            lambda: check_dicom_images(ct, modality="MR")
        ),
        "output folder '...' cannot be created: ...": lambda: raised(
            lambda: preflight.check_output_folder(tmp_path / "file" / "out")
        ),
        "output folder '...' is not writable: ...": lambda: not_writable(tmp_path),
        "model repository '...' does not exist (check -m)": lambda: raised(
            lambda: preflight.check_model_path(tmp_path / "nope")
        ),
        ".../config.pbtxt: not a valid Triton model configuration: ...": lambda: raised(
            lambda: preflight.check_model_configs(broken("config"))
        ),
        "model 'seg' not found in repository '...' (available: ...); model_name must be ...": lambda: raised(
            model_entry(folder=tmp_path / "empty")
        ),
        "model 'seg' has no version 3 in '...' (available: [1])": lambda: raised(model_entry(version=3)),
        "model 'seg' version 1: no 'model.pt' in '...'": lambda: raised(model_entry(folder=broken("no_file"))),
        "model 'seg': '...' is not TorchScript or .pt2 (not a zip archive): ...": lambda: raised(
            lambda: infer(broken("corrupt"), volume())
        ),
        "model 'seg': the input image has 3 non-finite voxel(s) (3 NaN, 0 Inf) of ...": lambda: raised(
            lambda: infer(repo, nan_volume())
        ),
        "model 'seg' input 'x': expected dtype FP32, got INT16; the image is ...": lambda: raised(
            lambda: infer(repo, volume(dtype=np.int16))
        ),
        "model 'seg' input 'x': expected shape [-1, 1, -1, -1, -1], got [...] (dim 1: expected 1, got 2); "
        "the image is ...": lambda: raised(lambda: infer(repo, volume(2))),
        "model 'seg' expects 3D images, got an image of shape [...]": lambda: raised(lambda: infer(repo, volume()[0])),
        "model 'seg': ... carries no MONAI metadata and no bundle metadata was given; pass --input-shape ...": (
            lambda: raised(lambda: build_repository(plain, tmp_path / "built", "seg"))
        ),
        "model 'seg' already exists in repository '...'; pass --force ...": lambda: raised(
            lambda: build_repository(plain, repo, "seg", input_shapes=[(1, 1, 8, 8, 8)])
        ),
        "model 'seg': no answer within the deadline of ... s (waited ...)": no_answer_in_time,
        "Triton server '...' did not give the repository index within ... s: ...": index_not_in_time,
        "... of ... model(s) have problems (listed above): [...]": lambda: served_differently(tmp_path, repo),
        "model 'seg' input 0 (...): ... says ... [...], the model file ... [...] (...)": lambda: like_mismatch(
            tmp_path, repo
        ),
        "model 'seg' failed to load in ...: its config.pbtxt asks for KIND_GPU instances and this machine has no GPU; "
        "rebuild it with 'monai-triton repo build ... --instance-kind cpu' ...": lambda: unservable(
            tmp_path, "gpu", monkeypatch
        ),
        "model 'seg' failed to load in ...: its config.pbtxt needs Triton's 'pytorch' backend (platform "
        "'pytorch_libtorch'), which this server does not have (it has: ...); rebuild it for the Python backend with "
        "'monai-triton repo build MODEL -o REPO --name seg --flavor python'": lambda: unservable(
            tmp_path, "libtorch", monkeypatch
        ),
        "model repository '...' (HOLOSCAN_MODEL_PATH) does not exist": lambda: holoscan_model_path_missing(
            tmp_path, monkeypatch
        ),
        "app configuration '...' (HOLOSCAN_CONFIG_PATH) does not exist": lambda: raised(
            lambda: app_yaml_of(None, environ={"HOLOSCAN_CONFIG_PATH": str(tmp_path / "nope.yaml")})
        ),
        "grpc_port ... on 127.0.0.1 is already in use by another process": lambda: port_in_use(tmp_path / "empty"),
        "no tritonserver executable at '...'": lambda: raised(lambda: find_tritonserver(tmp_path / "nope")),
        "models ['seg'] cannot load: the Python backend stub cannot start: error while loading shared libraries: "
        "libpython...: ... (..., exit status 127); install the Python ... shared library ...": lambda: (
            stub_cannot_start(tmp_path)
        ),
        "model 'seg' on ...: the model's backend process is gone (Stub process 'seg_0_0' is not healthy.); ...": (
            lambda: dead_stub()
        ),
        "model 'seg' on ...: the server failed on the request (its own or its model's internal error; its log says "
        "why): ...": server_failed,
        "--shared-memory: backend 'torch' has no option 'shared_memory'; its options: ...": lambda: raised(
            lambda: resolve_backend_options("torch", {"shared_memory": "none"}, environ={})
        ),
        "--auth-token: backend 'grpc': auth_token must say where the secret is, env:VARIABLE or file:PATH, not the "
        "secret itself ...": lambda: raised(
            lambda: resolve_backend_options("grpc://127.0.0.1:9", {"auth_token": "s3cr3t-t0ken"}, environ={})
        ),
        "auth_token: environment variable TRITON_TOKEN is not set": lambda: raised(
            lambda: create_backend("grpcs://127.0.0.1:9?auth_token=env:TRITON_TOKEN", "seg").open()
        ),
        "grpcs://...: the server's TLS certificate is not trusted: ... (checked against the CA file '...' "
        "(root_certificates))": lambda: untrusted_tls(tmp_path),
        "MONAI_TRITON_TIMEOUT_S (environment): backend 'torch': option timeout_s='soon' is not a ...": lambda: raised(
            lambda: resolve_backend_options("torch", {}, environ={"MONAI_TRITON_TIMEOUT_S": "soon"})
        ),
        "'.../app.yaml' cannot be read as YAML: ...": lambda: raised(
            lambda: read_app_environment(tmp_path / "app.yaml")
        ),
        "model name 'seg=': expected NAME or CODE=NAME[,CODE=NAME...], got 'seg='": lambda: raised(
            lambda: model_name_for("seg", "seg=")
        ),
        "--backend: two backends for model 'spleen', '...' and '...'; give one": lambda: raised(
            lambda: deployment.resolve(["spleen=torch", "spleen=triton"], environ={})
        ),
        "MONAI_TRITON_BACKEND (environment): backend for model 'liver', which is not in the models folder '...' "
        "(models there: ...); NAME must be a model's folder name": lambda: raised(
            lambda: deployment.check_models(
                deployment.resolve([], environ={"MONAI_TRITON_BACKEND": "liver=torch"}), repo
            )
        ),
        "bundle: model 'liver' is not in the models folder '...' (models there: ...); model_name must be a model's "
        "folder name": lambda: raised(lambda: locate(None, repo, "liver")),
        "model 'seg': model_path '...' is a file; give the model repository folder (...)": lambda: raised(
            lambda: infer(repo, volume(), model_path=repo / "seg" / "1" / "model.pt")
        ),
        "model 'seg': the post-transforms failed on a dictionary with keys [...] (input_dataset_key 'image', "
        "pred_dataset_key 'pred'): ...": lambda: raised(lambda: infer(repo, volume(), **dictionary_chain("seg"))),
        "model 'seg_volume' is not on grpc://...; the server has: ...; mode=volume needs the whole-volume model "
        "'seg_volume' beside 'seg': make it with 'monai-triton repo wrap REPO --name seg' ...": lambda: no_volume_model(
            tmp_path
        ),
        "model 'seg_volume' input 'x': the volume of shape [...] holds ... MB, over the server's limit of 1 MB for one "
        "whole-volume request (max_volume_mb; ...": volume_over_limit,
        "model 'seg' has 2 inputs [...]; a sliding window feeds one, so it cannot be wrapped as a whole-volume model": (
            lambda: two_inputs_wrapped(tmp_path)
        ),
        **bundle_rows(tmp_path),
        **ensemble_rows(tmp_path),
        "internal error: ValueError: ... (a bug: rerun with -l DEBUG and report the traceback)": lambda: ValueError(
            "an unexpected failure"
        ),
    }


# -- the checks -----------------------------------------------------------------------------------------------
def test_every_row_has_a_trigger_and_every_trigger_a_row(
    tmp_path: Path, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert sorted(table()) == sorted(triggers(tmp_path, repo, monkeypatch))


@pytest.mark.parametrize(("message", "code"), sorted(table().items()))
def test_the_row_is_what_the_code_prints(
    message: str, code: int, tmp_path: Path, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exc = triggers(tmp_path, repo, monkeypatch)[message]()
    line = exits.one_line(exc)
    pattern = ".*".join(re.escape(part) for part in message.split("..."))
    assert re.match(pattern, line), f"documented: {message}\nprinted:    {line}"
    assert exits.exit_code(exc) == code


# -- the table of classes -------------------------------------------------------------------------------------
CLASS_ROW = re.compile(r"^\| `(\w+)` \| (.*?) \| .+? \| (\d+) \| (.*?) \|$")


def class_table() -> dict[str, tuple[str, int, str]]:
    """``{class: (built-ins, exit code, codes)}`` from section 4 of the quick start."""
    text = QUICKSTART.read_text(encoding="utf-8")
    section = text[text.index("## 4. Errors you may meet") :]
    return {
        m.group(1): (m.group(2), int(m.group(3)), m.group(4))
        for line in section.splitlines()
        if (m := CLASS_ROW.match(line))
    }


def built_ins(cls: type) -> str:
    """The most specific built-in exceptions ``cls`` also is, as the table writes them."""
    found = [c for c in cls.__mro__ if c.__module__ == "builtins" and c not in (Exception, BaseException, object)]
    return ", ".join(f"`{c.__name__}`" for c in found if not any(o is not c and issubclass(o, c) for o in found))


def mapped_codes(cls: type) -> str:
    """What the status table maps to ``cls``: Triton codes, gRPC statuses, HTTP statuses."""
    from monai_triton_ops.client import status

    states = {s for s, c in status.ERROR_CLASSES.items() if c is cls}
    parts = []
    for label, table in (("Triton", status.TRITON), ("gRPC", status.GRPC)):
        names = [f"`{n}`" for n, s in table.items() if s in states]
        if names:
            parts.append(f"{label} {' '.join(names)}")
    numbers = [str(n) for n, s in status.HTTP.items() if s in states]
    if numbers:
        parts.append(f"HTTP {' '.join(numbers)}")
    return "; ".join(parts)


def test_the_class_table_is_the_tree_its_exit_codes_and_the_status_table() -> None:
    rows = class_table()
    tree = {n: c for n, c in vars(errors).items() if isinstance(c, type) and issubclass(c, errors.MonaiTritonError)}
    assert sorted(rows) == sorted(tree), "every class of errors.py has one row, and only they"
    for name, (also, code, codes) in rows.items():
        cls = tree[name]
        assert also.strip() == built_ins(cls), name
        assert code == exits.exit_code(cls("x")), name
        assert codes.startswith(mapped_codes(cls)), f"{name}: the table maps {mapped_codes(cls)!r}"
