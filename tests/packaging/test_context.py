"""The build context `monai-triton package` writes: holoscan-cli 4.2.0's layout, manifests that meet the MAP spec.

No image is built here (``test_map_image.py`` builds and runs one): these are the seconds-long checks of
everything that goes into it, and of how the command treats what is already on disk.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import shlex
import shutil
import zipfile
from pathlib import Path

import pytest

from monai_triton_ops import cli
from monai_triton_ops.errors import ConfigError, UsageError
from monai_triton_ops.packaging import PackageRequest
from monai_triton_ops.packaging.context import MARKER, BuildContext, default_tag, qualified_tag, write_context
from monai_triton_ops.packaging.requirements import canonical
from monai_triton_ops.packaging.wheel import project_wheel

from .conftest import APP, BASE, MODELS
from .spec import ENVIRONMENT, app_yaml, check_app_manifest, check_package_manifest

ROOT_APP = APP.parent / "bundle_seg"


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def instruction(containerfile: str, keyword: str) -> dict[str, str]:
    """The ``KEY=VALUE`` pairs of the one ``ENV``/``LABEL`` instruction, continuation lines joined."""
    joined = containerfile.replace("\\\n", " ")
    (line,) = [line for line in joined.splitlines() if line.startswith(f"{keyword} ")]
    return dict(word.split("=", 1) for word in shlex.split(line)[1:])


def test_the_context_has_the_4_2_0_packager_layout(sample_context: BuildContext) -> None:
    root = sample_context.path
    for name in ("Dockerfile", ".dockerignore", "app.config", "map/app.json", "map/pkg.json", "tools",
                 "pip/requirements.txt", "pip/constraints.txt", "app/__main__.py", "app/app.py", "docs/README.md",
                 "models/brain_tissue_seg/config.pbtxt", "models/brain_tissue_seg/1/model.pt"):  # fmt: skip
        assert (root / name).is_file(), name
    assert (root / "app.config").read_bytes() == (APP / "app.yaml").read_bytes()
    assert (root / "models/brain_tissue_seg/1/model.pt").read_bytes() == (
        MODELS / "brain_tissue_seg/1/model.pt"
    ).read_bytes()
    assert os.access(root / "tools", os.X_OK)
    assert not list(root.rglob("__pycache__"))
    (wheel,) = (root / "pip").glob("monai_triton_ops-*.whl")
    assert wheel.stat().st_size > 10_000


def test_the_manifests_meet_the_map_spec(sample_context: BuildContext) -> None:
    config = app_yaml(APP / "app.yaml")
    app = read_json(sample_context.path / "map/app.json")
    check_app_manifest(app, config)
    assert json.loads(app["command"]) == ["python3", "/opt/holoscan/app"]
    assert app["environment"]["MONAI_TRITON_BACKEND"] == "torch"  # the default of app.yaml's environment:
    check_package_manifest(read_json(sample_context.path / "map/pkg.json"), config, ["brain_tissue_seg"])


def test_the_image_environment_and_labels_are_the_manifests(sample_context: BuildContext) -> None:
    app = read_json(sample_context.path / "map/app.json")
    text = (sample_context.path / "Dockerfile").read_text()
    env = instruction(text, "ENV")
    assert env.pop("PATH") == "/opt/venv/bin:$PATH"
    # HOLOSCAN_* are the image's; app.yaml's defaults are listed in app.json and applied by the app at start,
    # so that `-e TRITON_SERVER_NETLOC=...` is not hidden by a MONAI_TRITON_BACKEND baked into the image
    defaults = app_yaml(APP / "app.yaml")["application"]["environment"]
    assert env == {k: v for k, v in app["environment"].items() if k not in defaults}
    assert set(env) == set(ENVIRONMENT) | {"HOLOSCAN_APPLICATION", "HOLOSCAN_TIMEOUT"}
    labels = instruction(text, "LABEL")
    assert labels["org.opencontainers.image.version"] == app["version"]
    assert labels["org.opencontainers.image.title"] == app_yaml(APP / "app.yaml")["application"]["title"]
    assert re.search(r'^ENTRYPOINT \["/var/holoscan/tools"\]$', text, flags=re.MULTILINE)
    assert f"FROM {BASE}\n" in text


def test_pip_gets_the_projects_dependencies_and_this_environments_versions(sample_context: BuildContext) -> None:
    requirements = (sample_context.path / "pip/requirements.txt").read_text().splitlines()
    names = {canonical(re.split(r"[<>=!;\[ ]", line, maxsplit=1)[0]) for line in requirements}
    assert "monai-triton-ops" not in names  # no index has it: the wheel stands in for it
    assert {"monai-deploy-app-sdk", "torch", "tritonclient", "nvidia-cuda-runtime", "pydicom", "highdicom"} <= names
    constraints = (sample_context.path / "pip/constraints.txt").read_text()
    import torch

    assert f"torch=={torch.__version__}\n" in constraints  # the local CPU build, as tested here
    assert re.search(r"^nvidia-cuda-runtime==13\.", constraints, flags=re.MULTILINE)
    assert "monai-triton-ops==" not in constraints
    assert "nvidia-pytriton==0.7.0\n" in constraints  # installed --no-deps, at the version tested here
    assert "pytest==" not in constraints  # only what the image installs: a dev tool does not touch its layers
    assert "--no-deps nvidia-pytriton==" in (sample_context.path / "Dockerfile").read_text()


def test_nothing_of_this_machine_goes_into_the_context(sample_context: BuildContext) -> None:
    text = "\n".join(p.read_text(errors="replace") for p in sample_context.path.rglob("*") if p.is_file()
                     and p.suffix not in (".whl", ".pt"))  # fmt: skip
    assert "BEGIN CERTIFICATE" not in text
    assert "/opt/wheels" not in text
    assert "file:///" not in text


def test_a_rerun_replaces_its_own_context_and_a_failed_one_leaves_it(wheel: Path, tmp_path: Path) -> None:
    out = tmp_path / "ctx"
    first = write_context(PackageRequest(app=APP, models=MODELS, output=out, wheel=wheel), base_image=BASE)
    (out / "stale").write_text("from an earlier run")
    with pytest.raises(ConfigError):  # a bad version: refused before anything is written
        write_context(PackageRequest(app=APP, models=MODELS, output=out, wheel=wheel, version="x"), base_image=BASE)
    assert (out / "stale").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ctx"]  # no partial folder left beside it
    again = write_context(
        PackageRequest(app=APP, models=MODELS, output=out, wheel=wheel, version="0.2.0"), base_image=BASE
    )
    assert not (out / "stale").exists()
    assert read_json(out / "map/app.json")["version"] == "0.2.0"
    assert first.tag == "localhost/brain-tissue-seg:0.1.0"
    assert again.tag == "localhost/brain-tissue-seg:0.2.0"


def test_a_folder_it_did_not_write_is_never_replaced(wheel: Path, tmp_path: Path) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "precious.txt").write_text("keep")
    with pytest.raises(UsageError, match="was not written by 'monai-triton package'"):
        write_context(PackageRequest(app=APP, models=MODELS, output=out, wheel=wheel), base_image=BASE)
    assert (out / "precious.txt").read_text() == "keep"
    assert not (out / MARKER).exists()


def test_bad_apps_and_models_are_refused_before_anything_is_written(wheel: Path, tmp_path: Path) -> None:
    no_main = tmp_path / "app"
    no_main.mkdir()
    shutil.copy(APP / "app.yaml", no_main / "app.yaml")
    cases = [
        (PackageRequest(app=no_main, output=tmp_path / "a", wheel=wheel), UsageError, "no __main__.py"),
        (PackageRequest(app=APP, models=tmp_path / "none", output=tmp_path / "b", wheel=wheel), ConfigError,
         "does not exist"),
        (PackageRequest(app=APP, models=no_main, output=tmp_path / "c", wheel=wheel), ConfigError, "no model folders"),
        (PackageRequest(app=APP, output=tmp_path / "d", wheel=tmp_path / "x.whl"), ConfigError, "not a monai_triton"),
    ]  # fmt: skip
    for request, error, message in cases:
        with pytest.raises(error, match=message):
            write_context(request, base_image=BASE)
        assert not request.output.exists()


def test_a_single_file_app_and_a_model_file(wheel: Path, tmp_path: Path) -> None:
    app = tmp_path / "seg_app" / "run_me.py"
    app.parent.mkdir()
    app.write_text("print('hello')\n")
    shutil.copy(APP / "app.yaml", app.parent / "app.yaml")
    model = tmp_path / "spleen.ts"
    model.write_bytes(b"not really a model")
    context = write_context(
        PackageRequest(app=app, models=model, output=tmp_path / "out", wheel=wheel), base_image=BASE
    )
    assert json.loads(read_json(context.path / "map/app.json")["command"]) == ["python3", "/opt/holoscan/app/run_me.py"]
    assert read_json(context.path / "map/pkg.json")["models"] == [{"name": "spleen", "path": "spleen"}]
    assert (context.path / "models/spleen/spleen.ts").is_file()
    assert context.tag == "localhost/run-me:0.1.0"


def test_a_bundle_folder_is_one_model(wheel: Path, tmp_path: Path) -> None:
    """``-m BUNDLE``: the bundle lands whole in the MAP's models folder, as App SDK MAPs hold it."""
    from ..bundles.makers import unet_bundle

    bundle = unet_bundle(tmp_path / "spleen_ct")
    context = write_context(
        PackageRequest(app=ROOT_APP, models=bundle, output=tmp_path / "out", wheel=wheel), base_image=BASE
    )
    assert read_json(context.path / "map/pkg.json")["models"] == [{"name": "spleen_ct", "path": "spleen_ct"}]
    assert (context.path / "models/spleen_ct/configs/inference.json").is_file()
    assert (context.path / "models/spleen_ct/models/model.ts").is_file()


def test_a_models_folder_with_several_models_is_packaged_whole(wheel: Path, tmp_path: Path) -> None:
    """``-m MODELS`` of a multi-AI app or an ensemble: every model, of every kind, is one entry of the MAP."""
    from ..bundles.makers import unet_bundle

    models = tmp_path / "models"
    unet_bundle(models / "spleen_ct")  # a bundle folder
    (models / "pancreas_ct").mkdir()
    (models / "pancreas_ct" / "model.ts").write_bytes(b"a bundle archive")  # the App SDK's MODELS/<name>/model.ts
    shutil.copytree(MODELS / "brain_tissue_seg", models / "fold0")  # Triton model folders
    shutil.copytree(MODELS / "brain_tissue_seg", models / "fold1")
    context = write_context(
        PackageRequest(app=ROOT_APP, models=models, output=tmp_path / "out", wheel=wheel), base_image=BASE
    )
    names = ["fold0", "fold1", "pancreas_ct", "spleen_ct"]
    assert read_json(context.path / "map/pkg.json")["models"] == [{"name": n, "path": n} for n in names]
    assert (context.path / "models/spleen_ct/configs/inference.json").is_file()
    assert (context.path / "models/pancreas_ct/model.ts").read_bytes() == b"a bundle archive"
    for fold in ("fold0", "fold1"):
        assert (context.path / f"models/{fold}/1/model.pt").read_bytes() == (
            MODELS / "brain_tissue_seg/1/model.pt"
        ).read_bytes()


def test_default_tags_are_valid_image_names(tmp_path: Path) -> None:
    assert default_tag(APP, "1.0.0") == "brain-tissue-seg:1.0.0"
    odd = tmp_path / "My App__v2"
    odd.mkdir()
    assert default_tag(odd, "1.0.0") == "my-app-v2:1.0.0"
    # buildah resolves short names against the images it has (it re-tagged another image): always qualified
    assert qualified_tag("seg:1") == "localhost/seg:1"
    assert qualified_tag("team/seg:1") == "localhost/team/seg:1"
    for kept in ("localhost/seg:1", "registry.example/ai/seg:1", "registry:5000/seg:1"):
        assert qualified_tag(kept) == kept


def test_the_command_writes_a_context_without_building(wheel: Path, tmp_path: Path, capsys, restore_console) -> None:
    out = tmp_path / "cli"
    argv = ["package", str(APP), "-m", str(MODELS), "-o", str(out), "--no-build", "--wheel", str(wheel)]
    assert cli.main([*argv, "--base-image", "docker.io/library/ubuntu:24.04", "-t", "seg:9"]) == 0
    printed = capsys.readouterr().out
    assert f"context {out}" in printed
    assert "not built" in printed
    assert "localhost/seg:9" in printed
    assert "FROM docker.io/library/ubuntu:24.04\n" in (out / "Dockerfile").read_text()
    assert read_json(out / "map/app.json")["version"] == "0.1.0"
    assert cli.main(["package", str(tmp_path / "nowhere"), "--no-build", "-o", str(tmp_path / "x")]) == 2


def test_four_packagers_of_one_checkout_at_once_each_get_the_wheel(tmp_path: Path) -> None:
    """setuptools builds in the checkout's own ``build/``: without a lock, builds at once failed with ``File exists``
    (3 runs of 3 with four; two at once collided under parallel tests)."""
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        wheels = list(pool.map(project_wheel, [tmp_path / n for n in "abcd"]))
    for built in wheels:
        with zipfile.ZipFile(built) as archive:
            assert archive.testzip() is None
            assert "monai_triton_ops/packaging/wheel.py" in archive.namelist()
