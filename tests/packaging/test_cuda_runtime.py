"""The CUDA 13 runtime Holoscan loads comes from the declared wheel, not from a system-wide CUDA install.

This machine has a CUDA 13 runtime installed system-wide (``ldconfig -p``), which is why a venv worked here
before the project declared the dependency. The decisive test hides every system copy in a private mount
namespace (root only) and imports Holoscan there, through the venv's ``.pth`` hook that ``make setup`` writes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from monai_triton_ops import cuda_runtime
from monai_triton_ops.packaging import runtime_libs

#: Imports Holoscan (through ``import monai``, as apps do) and prints which libcudart the process mapped.
IMPORT_AND_SHOW = (
    'import monai, holoscan; print("imported", holoscan.__version__); '
    'print(*sorted({l.split()[-1] for l in open("/proc/self/maps") if "libcudart" in l}), sep=chr(10))'
)


#: Without site-packages (-S) there is no hook: the library loads only if the system has one in reach.
LOAD_BY_NAME = f'import ctypes; ctypes.CDLL("{cuda_runtime.SONAME}")'


def system_cudart_dirs() -> list[str]:
    """Folders outside this venv from which the dynamic loader would take libcudart.so.13."""
    out = subprocess.run(
        [shutil.which("ldconfig") or "/sbin/ldconfig", "-p"], capture_output=True, text=True, timeout=30, check=False
    ).stdout
    return sorted(
        {str(Path(line.split("=>")[-1].strip()).parent) for line in out.splitlines() if "libcudart.so" in line}
    )


def test_the_library_is_the_wheels_and_is_loaded() -> None:
    library = cuda_runtime.wheel_library()
    assert library is not None
    assert library.name == cuda_runtime.SONAME
    assert Path(sys.prefix) in library.parents  # this environment's, from nvidia-cuda-runtime
    assert cuda_runtime.preload() == library
    maps = Path("/proc/self/maps").read_text()
    assert str(library.resolve()) in maps or str(library) in maps


def test_the_site_hook_loads_it_without_importing_this_package(tmp_path: Path) -> None:
    hook = cuda_runtime.write_site_hook(tmp_path)
    assert hook == tmp_path / cuda_runtime.HOOK_NAME
    line = hook.read_text()
    assert line.startswith("import ctypes, os;")
    assert "monai_triton_ops" not in line.split(";", 1)[1].replace(str(cuda_runtime.wheel_library()), "")
    installed = Path(sysconfig.get_paths()["purelib"]) / cuda_runtime.HOOK_NAME
    assert installed.is_file(), "make setup writes the hook into the venv"
    assert installed.read_text() == line


def test_the_lib_dir_command_prints_the_folder_for_ld_so_conf(capsys: pytest.CaptureFixture[str]) -> None:
    assert runtime_libs.main(["--lib-dir"]) == 0
    assert capsys.readouterr().out.strip() == str(cuda_runtime.wheel_library().parent)  # type: ignore[union-attr]


@pytest.mark.slow  # a fresh interpreter importing MONAI and Holoscan
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
def test_holoscan_imports_with_every_system_cuda_runtime_hidden() -> None:
    hidden = system_cudart_dirs()
    venv_lib = str(cuda_runtime.wheel_library().parent)  # type: ignore[union-attr]
    hidden = [d for d in hidden if not d.startswith(sys.prefix)]
    mounts = "; ".join(f"mount -t tmpfs none {d}" for d in hidden) or "true"
    probe = (
        f"{mounts}; "
        f"{sys.executable} -S -c '{LOAD_BY_NAME}' 2>/dev/null && echo SYSTEM-VISIBLE; "
        f"{sys.executable} -c '{IMPORT_AND_SHOW}'"
    )
    result = subprocess.run(
        [shutil.which("unshare") or "unshare", "-m", "sh", "-c", probe],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert "SYSTEM-VISIBLE" not in result.stdout, f"could not hide {hidden}"
    assert result.returncode == 0, result.stderr[-2000:]
    assert "imported" in result.stdout, result.stderr[-2000:]
    loaded = {line.split()[-1] for line in result.stdout.splitlines() if line.endswith(cuda_runtime.SONAME)}
    assert loaded == {f"{venv_lib}/{cuda_runtime.SONAME}"}, result.stdout
