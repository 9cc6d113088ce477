"""The sample app's MAP, built on this machine without a Docker daemon, run with every backend by environment alone.

One image per session: ``monai-triton package`` (the real command, ``--builder buildah``) builds it from the
checkout on the cached Debian base (the first build on a machine also makes the base: see
``docs/packaging.md`` for cold and warm costs). Then, each in a fresh container from that image:

- the image against the MAP spec: config (environment, labels, entry point), files and manifests, ``show``
  and ``export``, nothing of this machine's pip or CA inside;
- the app on the sample DICOM series with ``torch`` (the image's default, from ``app.yaml``), ``triton``
  (Triton's core inside the container, models from ``HOLOSCAN_MODEL_PATH``) and ``grpc://`` to a server on
  the host's loopback (input and output through ``HOLOSCAN_INPUT_PATH``/``HOLOSCAN_OUTPUT_PATH``): exit 0,
  a DICOM SEG and ``seg.nii.gz`` with labels identical to the host's ``torch`` run (``make demo``'s row);
- a backend that cannot start (a server that is not there; the stub's ``libpython`` removed) ends within
  60 s with one ``error:`` line and exit code 3.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import nibabel as nib
import numpy as np
import pydicom
import pytest

from monai_triton_ops import cli
from monai_triton_ops.server import LocalTritonServer

from .. import warm_python
from .conftest import APP, MODELS, ROOT
from .spec import PATHS, app_yaml, check_app_manifest, check_labels, check_package_manifest

TAG = "localhost/monai-triton-ops-test/brain-tissue-seg:0.1.0"
BUILD_TIMEOUT_S = 3600
RUN_TIMEOUT_S = 600
FAIL_WITHIN_S = 60.0
SEG_SOP_CLASS = "1.2.840.10008.5.1.4.1.1.66.4"  # Segmentation Storage

pytestmark = [
    pytest.mark.slow,
    pytest.mark.map,
    pytest.mark.timeout(BUILD_TIMEOUT_S),  # the first test builds the image: minutes (a fresh machine: ~10)
    pytest.mark.skipif(os.geteuid() != 0, reason="buildah builds and runs images as root here"),
]


def buildah(*args: str, timeout: float = 120) -> str:
    exe = shutil.which("buildah") or "buildah"
    result = subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout, check=False)
    assert result.returncode == 0, f"buildah {' '.join(args)}: {result.stderr[-2000:]}"
    return result.stdout


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build the MAP with the real command (in this process, so that coverage sees it); returns its build context."""
    context = tmp_path_factory.mktemp("map") / "context"
    argv = ["package", str(APP), "-m", str(MODELS), "-o", str(context), "-t", TAG, "--builder", "buildah"]
    root_level = logging.getLogger().level
    started = time.perf_counter()
    try:
        assert cli.main(argv) == 0
    finally:
        logging.getLogger().setLevel(root_level)  # the command set its own log level for the process
    print(f"\nMAP build: {time.perf_counter() - started:.0f} s")
    return context


@contextlib.contextmanager
def container() -> Iterator[str]:
    """A fresh working container of the image, removed afterwards."""
    name = buildah("from", "--pull-never", TAG).strip()
    try:
        yield name
    finally:
        buildah("rm", name)


@dataclass
class Run:
    code: int
    seconds: float
    stdout: str
    stderr: str

    @property
    def app_errors(self) -> list[str]:
        """The app's ``error:`` lines (``Error: while running runtime`` is buildah's own report of the exit)."""
        return [line for line in self.stderr.splitlines() if line.startswith("error:")]


def run_map(
    name: str,
    env: dict[str, str] | None = None,
    volumes: Sequence[tuple[Path, str, str]] = (),
    args: Sequence[str] = (),
    timeout: float = RUN_TIMEOUT_S,
) -> Run:
    """``/var/holoscan/tools ARGS`` (the image's entry point) in container ``name``, with host networking."""
    exe = shutil.which("buildah") or "buildah"
    command = [exe, "run", "--network", "host"]
    command += [f"--env={key}={value}" for key, value in (env or {}).items()]
    command += [f"--volume={host}:{inside}:{mode}" for host, inside, mode in volumes]
    command += [name, "--", "/var/holoscan/tools", *args]
    started = time.perf_counter()
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            # SIGTERM: buildah stops the container; SIGKILL would leave its runc container running
            process.terminate()
            stdout, stderr = process.communicate(timeout=60)
            return Run(-1, time.perf_counter() - started, stdout, stderr + f"\n(killed after {timeout:.0f} s)")
    return Run(process.returncode, time.perf_counter() - started, stdout, stderr)


def writable(folder: Path) -> Path:
    """A host folder the image's user (uid 1000) can write, as an orchestrator would mount one."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o777)
    return folder


@pytest.fixture(scope="module")
def dicom(sample_data: Path) -> Path:
    return sample_data / "dicom"


@pytest.fixture(scope="module")
def reference(dicom: Path, tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    """``make demo``'s ``torch`` row on the DICOM series, run on the host."""
    out = tmp_path_factory.mktemp("reference")
    command = [sys.executable, "-m", "monai_triton_ops.cli", "exec", str(APP), "-i", str(dicom), "-o", str(out)]
    command += ["-m", str(MODELS), "--backend", "torch", "-l", "WARN"]
    result = warm_python.run(command, cwd=ROOT, timeout=RUN_TIMEOUT_S)
    assert result.returncode == 0, result.stderr[-3000:]
    return np.asarray(nib.load(out / "seg.nii.gz").dataobj)


def assert_segmentation(out: Path, reference: np.ndarray) -> None:
    labels = np.asarray(nib.load(out / "seg.nii.gz").dataobj)
    np.testing.assert_array_equal(labels, reference)
    (seg_file,) = out.glob("*.dcm")
    seg = pydicom.dcmread(seg_file)
    assert seg.SOPClassUID == SEG_SOP_CLASS
    assert [s.SegmentLabel for s in seg.SegmentSequence] == ["grey matter", "white matter"]


# -- the image against the spec -----------------------------------------------------------------------------------
def test_the_image_config_has_the_manifests_environment_and_labels(image: Path) -> None:
    config = json.loads(buildah("inspect", "--type", "image", TAG))["OCIv1"]["config"]
    app = json.loads((image / "map/app.json").read_text())
    env = dict(item.split("=", 1) for item in config["Env"])
    defaults = app_yaml(APP / "app.yaml")["application"]["environment"]
    assert app["environment"]["MONAI_TRITON_BACKEND"] == "torch"  # app.yaml's default, listed in the manifest
    for name, value in app["environment"].items():
        if name in defaults:  # applied by the app at start: a variable given to the container is told apart
            assert name not in env, name
        else:
            assert env[name] == value, name
    assert env["PATH"].startswith("/opt/venv/bin:")
    check_labels(config["Labels"], app, app_yaml(APP / "app.yaml"))
    assert config["Entrypoint"] == ["/var/holoscan/tools"]
    assert config["WorkingDir"] == "/var/holoscan"
    assert config["User"] == "holoscan"


def test_the_image_files_follow_the_map_layout(image: Path) -> None:
    config = app_yaml(APP / "app.yaml")
    with container() as name:
        root = Path(buildah("mount", name).strip())
        try:
            for path in PATHS:
                assert (root / path.lstrip("/")).exists(), path
            app = json.loads((root / "etc/holoscan/app.json").read_text())
            pkg = json.loads((root / "etc/holoscan/pkg.json").read_text())
            check_app_manifest(app, config)
            check_package_manifest(pkg, config, ["brain_tissue_seg"])
            assert (root / "var/holoscan/app.yaml").read_bytes() == (APP / "app.yaml").read_bytes()
            assert (root / "opt/holoscan/app/__main__.py").is_file()
            for model in pkg["models"]:
                assert (root / "opt/holoscan/models" / model["path"] / "config.pbtxt").is_file()
            assert os.access(root / "var/holoscan/tools", os.X_OK)
            assert (root / "var/holoscan/output").stat().st_uid == 1000  # the app's user writes there
            # what a fresh image needs, declared by the project: CUDA 13 runtime on the loader's path, libpython
            conf = (root / "etc/ld.so.conf.d/monai-triton-ops-cuda.conf").read_text().strip()
            assert (root / conf.lstrip("/") / "libcudart.so.13").is_file()
            assert list(root.glob("usr/lib/*/libpython3.11.so.1.0"))
            assert_nothing_of_this_machine(root)
        finally:
            buildah("umount", name)


def assert_nothing_of_this_machine(root: Path) -> None:
    """No pip configuration, local index path or host-only CA certificate was baked into the image."""
    assert not (root / "etc/pip.conf").exists()
    assert not (root / "etc/xdg/pip").exists()
    for stubs in ("run/secrets", "run/monai-triton-host"):  # mount points of the build's secrets and host folders
        assert not any(p.is_file() and p.stat().st_size for p in (root / stubs).rglob("*")), stubs
    assert not (root / "opt/wheels").exists()
    assert not (root / "opt/pypi").exists()
    host_bundle = Path("/etc/ssl/certs/ca-certificates.crt")
    image_bundle = root / "etc/ssl/certs/ca-certificates.crt"
    if host_bundle.is_file() and image_bundle.is_file():
        pattern = r"-----BEGIN CERTIFICATE-----.*?-----END CERTIFICATE-----"
        host_only = set(re.findall(pattern, host_bundle.read_text(), re.S)) - set(
            re.findall(pattern, (root / "etc/ssl/certs/ca-certificates.crt").read_text(), re.S)
        )
        text = image_bundle.read_text()
        assert not any(cert in text for cert in host_only)


def test_show_prints_and_export_copies_the_manifests(image: Path, tmp_path: Path) -> None:
    export = writable(tmp_path / "export")
    with container() as name:
        shown = run_map(name, args=["show"])
        exported = run_map(name, volumes=[(export, "/var/run/holoscan/export", "rw")], args=["export"])
    assert shown.code == 0, shown.stderr
    assert '"type": "application"' in shown.stdout
    assert '"modelRoot": "/opt/holoscan/models"' in shown.stdout
    assert exported.code == 0, exported.stderr
    for path in ("config/app.json", "config/pkg.json", "config/app.yaml", "app/__main__.py",
                 "models/brain_tissue_seg/config.pbtxt"):  # fmt: skip
        assert (export / path).is_file(), path
    assert (export / "config/app.json").read_text() == (image / "map/app.json").read_text()


# -- every backend by environment alone ----------------------------------------------------------------------------
def test_torch_is_the_default_from_app_yaml(image: Path, dicom: Path, reference: np.ndarray, tmp_path: Path) -> None:
    out = writable(tmp_path / "out")
    with container() as name:
        run = run_map(name, volumes=[(dicom, "/var/holoscan/input", "ro"), (out, "/var/holoscan/output", "rw")])
    print(f"\nMAP run torch: {run.seconds:.1f} s")
    assert run.code == 0, run.stderr[-3000:]
    assert_segmentation(out, reference)


def test_triton_inside_the_container(image: Path, dicom: Path, reference: np.ndarray, tmp_path: Path) -> None:
    out = writable(tmp_path / "out")
    volumes = [(dicom, "/var/holoscan/input", "ro"), (out, "/var/holoscan/output", "rw"), (MODELS, "/srv/models", "ro")]
    env = {"MONAI_TRITON_BACKEND": "triton", "HOLOSCAN_MODEL_PATH": "/srv/models"}
    env["TRITON_SERVER_NETLOC"] = f"127.0.0.1:{closed_port()}"  # both set: MONAI_TRITON_BACKEND wins
    with container() as name:
        run = run_map(name, env=env, volumes=volumes)
    print(f"\nMAP run triton: {run.seconds:.1f} s")
    assert run.code == 0, run.stderr[-3000:]
    assert_segmentation(out, reference)


def test_grpc_to_a_server_on_the_hosts_loopback(
    image: Path, dicom: Path, reference: np.ndarray, tmp_path: Path
) -> None:
    out = writable(tmp_path / "out")
    volumes = [(dicom, "/data/in", "ro"), (out, "/data/out", "rw")]
    with LocalTritonServer(MODELS) as server:
        env = {"MONAI_TRITON_BACKEND": server.grpc_url, "HOLOSCAN_INPUT_PATH": "/data/in"}
        env["HOLOSCAN_OUTPUT_PATH"] = "/data/out"
        with container() as name:
            run = run_map(name, env=env, volumes=volumes)
    print(f"\nMAP run grpc: {run.seconds:.1f} s")
    assert run.code == 0, run.stderr[-3000:]
    assert_segmentation(out, reference)


# -- a backend that cannot start: one line, exit 3, within 60 s -----------------------------------------------------
def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])  # closed again when the block ends: nothing listens there


def test_a_server_that_is_not_there(image: Path, dicom: Path, tmp_path: Path) -> None:
    """The App SDK's variable alone chooses the remote backend over app.yaml's ``MONAI_TRITON_BACKEND: torch``
    (the image does not bake that default in), and with the image's defaults (app.yaml's readiness deadline)
    a server that is not there ends the run within the minute."""
    out = writable(tmp_path / "out")
    port = closed_port()
    with container() as name:
        volumes = [(dicom, "/var/holoscan/input", "ro"), (out, "/var/holoscan/output", "rw")]
        run = run_map(name, env={"TRITON_SERVER_NETLOC": f"127.0.0.1:{port}"}, volumes=volumes)
    print(f"\nMAP run, no server: {run.seconds:.1f} s")
    assert run.code == 3, run.stderr[-3000:]
    assert run.seconds < FAIL_WITHIN_S, run.seconds
    assert len(run.app_errors) == 1, run.stderr
    assert f"http://127.0.0.1:{port}" in run.app_errors[0]
    assert re.search(r"\b30(\.0)? s\b", run.app_errors[0])  # MONAI_TRITON_READY_TIMEOUT_S from app.yaml
    assert not list(out.iterdir())  # nothing half written


def test_a_stub_that_cannot_start_fails_fast(image: Path, dicom: Path, tmp_path: Path) -> None:
    """Needs the in-process load's fail-fast and the stub library check (issue 19, inproc and errors)."""
    out = writable(tmp_path / "out")
    with container() as name:
        # the Python-backend stub links libpython3.11.so.1.0; Debian's python3 itself does not need it
        remove = "rm -f $(ldconfig -p | grep -o '/[^ ]*libpython3.11.so.1.0' | sort -u) && ldconfig"
        subprocess.run([shutil.which("buildah") or "buildah", "run", "--user", "root", name, "--", "sh", "-c", remove],
                       check=True, capture_output=True, timeout=120)  # fmt: skip
        env = {"MONAI_TRITON_BACKEND": "triton"}
        volumes = [(dicom, "/var/holoscan/input", "ro"), (out, "/var/holoscan/output", "rw")]
        run = run_map(name, env=env, volumes=volumes, timeout=FAIL_WITHIN_S + 60)
    assert run.seconds < FAIL_WITHIN_S, run.seconds
    assert run.code == 3, run.stderr[-3000:]
    assert len(run.app_errors) == 1, run.stderr
    assert "libpython3.11" in run.app_errors[0] or "stub" in run.app_errors[0]
