"""The checks that run before the graph: each names the path or spec, and writes nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from monai_triton_ops import exits, preflight
from monai_triton_ops.backends import registry
from monai_triton_ops.errors import BackendUnavailableError, InputDataError


def test_an_output_folder_that_is_a_file_or_unwritable_is_refused(tmp_path: Path) -> None:
    (tmp_path / "taken").write_text("")
    with pytest.raises(InputDataError, match=r"output '.*taken' exists and is not a folder"):
        preflight.check_output_folder(tmp_path / "taken")
    assert preflight.check_output_folder(tmp_path / "new" / "out").is_dir()
    assert list((tmp_path / "new" / "out").iterdir()) == []  # the write check leaves nothing


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders; the not-a-folder cases run instead")
def test_a_read_only_output_folder_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with pytest.raises(InputDataError, match=r"output folder '.*ro' is not writable: Permission denied"):
            preflight.check_output_folder(folder)
    finally:
        folder.chmod(0o755)


def test_a_backend_whose_package_is_missing_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_registry", dict(registry._registry))
    registry.register_backend("fancy", "not_installed_pkg.backend:Fancy", hint="pip install fancy-backend")
    with pytest.raises(BackendUnavailableError, match=r"cannot be imported .*\(pip install fancy-backend\)") as caught:
        preflight.check_backend("fancy")
    assert exits.exit_code(caught.value) == exits.UNAVAILABLE
    preflight.check_backend("torch")


def test_an_unreadable_input_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InputDataError, match=r"input '.*missing' does not exist"):
        preflight.check_input(tmp_path / "missing")
    (tmp_path / "image.nii.gz").write_bytes(b"x")
    assert preflight.check_input(tmp_path / "image.nii.gz") == tmp_path / "image.nii.gz"


def test_a_missing_holoscan_config_is_named(tmp_path: Path) -> None:
    with pytest.raises(InputDataError, match=r"Holoscan configuration file '.*nope.yaml' \(--config\) does not exist"):
        preflight.check_holoscan_options(["app", "-i", "x", "--config", str(tmp_path / "nope.yaml")])
    (tmp_path / "app.yaml").write_text("")
    preflight.check_holoscan_options(["app", f"--config={tmp_path / 'app.yaml'}"])
