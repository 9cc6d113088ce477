"""What an image build borrows from this machine (pip's settings and CA bundle, the Debian mirror, the cache folder),
and how it runs programs there.

``read_host_pip`` runs the real ``pip config list`` of this interpreter; the settings are steered with ``PIP_*``
variables, which pip ranks above its configuration files.
"""

from __future__ import annotations

import configparser
from pathlib import Path

import pytest

from monai_triton_ops.errors import PackagingError, UsageError
from monai_triton_ops.packaging.builders import choose_builder, docker_usable
from monai_triton_ops.packaging.hostpip import MOUNT_ROOT, read_host_pip
from monai_triton_ops.packaging.programs import run
from monai_triton_ops.packaging.rootfs import DEFAULT_MIRROR, RootfsSpec, cache_dir, host_mirror


@pytest.fixture
def pip_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    wheels, index, constraints = tmp_path / "wheels", tmp_path / "mirror" / "simple", tmp_path / "c.txt"
    wheels.mkdir()
    index.mkdir(parents=True)
    constraints.write_text("torch<99\n")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", f"file://{index} https://example.invalid/simple file:///no/such/dir")
    monkeypatch.setenv("PIP_CONSTRAINT", str(constraints))
    monkeypatch.setenv("PIP_DEFAULT_TIMEOUT", "42")
    return {"wheels": wheels, "index": index, "constraints": constraints}


def test_local_folders_of_pips_settings_are_mounted_for_buildah(pip_env: dict[str, Path]) -> None:
    host = read_host_pip(mounts_allowed=True)
    # a local index's pages link to ../../files/: its root is mounted, not only simple/; inside the build every
    # host folder sits below one folder of ours, so that no path of this machine is created in the image
    mounts = dict(host.volumes)
    assert set(mounts) == {pip_env["wheels"], pip_env["index"].parent, pip_env["constraints"]}
    assert all(inside.startswith(MOUNT_ROOT + "/") for inside in mounts.values())
    assert len(set(mounts.values())) == 3
    assert host.settings["find-links"] == mounts[pip_env["wheels"]]
    assert host.settings["constraint"] == mounts[pip_env["constraints"]]
    index = f"file://{mounts[pip_env['index'].parent]}/simple"
    assert host.settings["extra-index-url"] == f"{index} https://example.invalid/simple"
    assert host.settings["default-timeout"] == "42"
    assert host.dropped == ()
    parsed = configparser.ConfigParser(interpolation=None)
    parsed.read_string(host.pip_conf())
    assert dict(parsed["global"]) == host.settings
    assert "cert" not in host.settings  # the CA bundle travels as its own secret
    assert host.cert is not None
    assert "BEGIN CERTIFICATE" in host.cert.read_text()


def test_a_builder_that_cannot_mount_gets_only_the_network_settings(pip_env: dict[str, Path]) -> None:
    host = read_host_pip(mounts_allowed=False)
    assert host.volumes == ()
    assert host.settings["extra-index-url"] == "https://example.invalid/simple"
    assert "find-links" not in host.settings
    assert "constraint" not in host.settings
    assert f"find-links={pip_env['wheels']}" in host.dropped


def test_the_mirror_comes_from_this_machines_apt_sources(tmp_path: Path) -> None:
    apt = tmp_path / "apt"
    (apt / "sources.list.d").mkdir(parents=True)
    (apt / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n\n"
        "Types: deb\nURIs: http://mirror.example/debian/\nSuites: bookworm bookworm-updates\nComponents: main\n"
    )
    assert host_mirror("bookworm", [apt]) == "http://mirror.example/debian"
    (apt / "sources.list.d" / "debian.sources").unlink()
    (apt / "sources.list").write_text("deb [arch=amd64] http://old.example/debian bookworm main\n")
    assert host_mirror("bookworm", [apt]) == "http://old.example/debian"
    assert host_mirror("trixie", [apt]) == DEFAULT_MIRROR
    assert host_mirror("bookworm", [tmp_path / "none"]) == DEFAULT_MIRROR


def test_the_base_image_key_follows_what_decides_its_contents() -> None:
    spec = RootfsSpec()
    assert spec.image_ref == f"localhost/monai-triton-base:bookworm-{spec.key}"
    assert RootfsSpec().key == spec.key
    assert RootfsSpec(packages=(*spec.packages, "curl")).key != spec.key
    assert RootfsSpec(mirror="http://mirror.example/debian").key != spec.key
    assert "libpython3.11" in spec.packages  # the Triton stub links it; Debian's python3 does not bring it


def test_the_cache_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("MONAI_TRITON_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "monai-triton"
    monkeypatch.setenv("MONAI_TRITON_CACHE", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"


def test_every_program_runs_with_a_deadline_and_fails_in_one_error() -> None:
    assert run(["echo", "hi"], timeout_s=30, what="echo") == "hi\n"
    with pytest.raises(PackagingError, match=r"sleep: no result within 0.5 s"):
        run(["sleep", "30"], timeout_s=0.5, what="sleep")
    with pytest.raises(PackagingError, match=r"sh failed with exit code 7\n--- output tail ---\nboom"):
        run(["sh", "-c", "echo boom >&2; exit 7"], timeout_s=30, what="sh")
    with pytest.raises(PackagingError, match="cannot run 'no-such-program-here'"):
        run(["no-such-program-here"], timeout_s=30, what="missing")


def test_the_builder_choice_is_checked() -> None:
    with pytest.raises(UsageError, match="unknown builder 'kaniko'"):
        choose_builder("kaniko")
    if not docker_usable():  # this machine: a docker client, no daemon
        with pytest.raises(PackagingError, match="no daemon answers"):
            choose_builder("docker")
