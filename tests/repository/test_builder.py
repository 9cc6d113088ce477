"""The repository builder: the layout every backend reads, all or nothing, and the same answers in-process."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from monai_triton_ops import create_backend
from monai_triton_ops.errors import ConfigError, RepositoryError
from monai_triton_ops.repository.builder import RUNNER, build_repository, check_config_text, generate_config
from monai_triton_ops.repository.config import ConfigOptions, read_config, signature_from_config
from monai_triton_ops.repository.signatures import model_filename

from .conftest import CASES, snapshot


def build(model_files: dict[str, Path], case: str, repo: Path, **options: object) -> Path:
    return build_repository(model_files[case], repo, case, **{**CASES[case].build, **options})  # type: ignore[arg-type]


def test_python_flavour_layout(model_files: dict[str, Path], tmp_path: Path) -> None:
    folder = build(model_files, "unet_meta", tmp_path / "repo")
    assert folder == tmp_path / "repo" / "unet_meta"
    assert sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) == [
        "1", "1/model.pt", "1/model.py", "config.pbtxt",
    ]  # fmt: skip
    assert (folder / "1" / "model.pt").read_bytes() == model_files["unet_meta"].read_bytes()
    assert (folder / "1" / "model.py").read_bytes() == RUNNER.read_bytes()
    assert sorted(p.name for p in (tmp_path / "repo").iterdir()) == ["unet_meta"]  # no staging folder left


def test_libtorch_flavour_layout_and_version(model_files: dict[str, Path], tmp_path: Path) -> None:
    folder = build(model_files, "two_in_two_out", tmp_path / "repo", flavor="libtorch", version=3)
    assert sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) == ["3", "3/model.pt", "config.pbtxt"]
    config = read_config(folder / "config.pbtxt", name="two_in_two_out")
    assert config.platform == "pytorch_libtorch"
    assert [t.name for t in config.input] == ["image", "offset"]  # forward() argument names
    assert [t.name for t in config.output] == ["OUTPUT__0", "OUTPUT__1"]


@pytest.mark.parametrize(
    ("case", "flavor"),
    # libtorch cannot serve dict outputs: refused in test_libtorch_refuses_dict_outputs
    [(c, f) for c in sorted(CASES) for f in ("python", "libtorch") if (c, f) != ("dict_output", "libtorch")],
)
def test_the_torchscript_backend_serves_what_was_built_exactly(
    model_files: dict[str, Path], tmp_path: Path, case: str, flavor: str
) -> None:
    repo = tmp_path / "repo"
    build(model_files, case, repo, flavor=flavor)
    inputs = example_inputs(case)
    expected = run_module(model_files[case], inputs)
    with create_backend("torch", case, model_repository=repo) as backend:
        assert backend.signature == signature_from_config(read_config(repo / case / "config.pbtxt"), version=1)
        outputs = backend.infer(dict(zip(backend.signature.input_names, inputs, strict=True)))
    for name, want in zip(backend.signature.output_names, expected, strict=True):
        assert outputs[name].dtype == want.dtype
        assert np.array_equal(outputs[name], want)


def example_inputs(case: str) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    dtypes = CASES[case].example_dtypes or ["float32"] * len(CASES[case].example)
    return [
        rng.standard_normal(shape).astype(np.float32)
        if dtype == "float32"
        else rng.integers(-3, 3, shape).astype(dtype)
        for shape, dtype in zip(CASES[case].example, dtypes, strict=True)
    ]


def run_module(path: Path, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """The model file run directly: what every serving path must reproduce bit for bit."""
    with torch.inference_mode():
        result = torch.jit.load(str(path))(*(torch.from_numpy(x) for x in inputs))
    values = result.values() if isinstance(result, dict) else result if isinstance(result, tuple) else [result]
    return [v.numpy() for v in values]


def test_libtorch_refuses_dict_outputs(model_files: dict[str, Path], tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    with pytest.raises(ConfigError, match=r"returns a dict of outputs \['probs', 'labels'\], which the libtorch"):
        build(model_files, "dict_output", tmp_path / "repo", flavor="libtorch")
    assert snapshot(tmp_path / "repo") == {}


def test_a_pt2_file_is_served_by_the_runner_and_refused_by_libtorch(unet_pt2: Path, tmp_path: Path) -> None:
    folder = build_repository(unet_pt2, tmp_path / "repo", "unet")
    assert (folder / "1" / "model.pt2").is_file()
    assert (folder / "1" / "model.py").is_file()
    with pytest.raises(ConfigError, match=r"\(\.pt2\), which Triton's pytorch_libtorch backend cannot load"):
        build_repository(unet_pt2, tmp_path / "repo", "libtorch", flavor="libtorch")
    assert not (tmp_path / "repo" / "libtorch").exists()


@pytest.mark.parametrize("name", ["../escape", "a/b", ".hidden", "", "with space", "x" * 129, "..", "-dash"])
def test_unsafe_names_are_refused_before_anything_is_written(
    model_files: dict[str, Path], tmp_path: Path, name: str
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    with pytest.raises(ConfigError, match="is not a safe folder name"):
        build_repository(model_files["unet_meta"], repo, name)
    assert snapshot(tmp_path) == {"repo/": b""}


def test_a_clashing_name_is_refused_without_force_and_leaves_the_repository_unchanged(
    model_files: dict[str, Path], tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    build(model_files, "unet_meta", repo)
    build(model_files, "fixed_shape", repo)
    before = snapshot(repo)
    with pytest.raises(RepositoryError, match=r"model 'unet_meta' already exists in repository .* pass --force"):
        build_repository(model_files["unet_probed"], repo, "unet_meta", input_shapes=[(1, 1, 16, 16, 16)])
    assert snapshot(repo) == before


def test_force_replaces_the_whole_entry_atomically(model_files: dict[str, Path], tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    build(model_files, "unet_meta", repo, version=2)
    build_repository(model_files["fixed_shape"], repo, "unet_meta", input_shapes=[(1, 1, 4, 4)], force=True)
    folder = repo / "unet_meta"
    assert sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) == [
        "1", "1/model.pt", "1/model.py", "config.pbtxt",
    ]  # fmt: skip
    assert (folder / "1" / "model.pt").read_bytes() == model_files["fixed_shape"].read_bytes()
    assert sorted(p.name for p in repo.iterdir()) == ["unet_meta"]  # no retired or staging folder left


def test_force_never_replaces_something_that_is_not_a_model_folder(
    model_files: dict[str, Path], tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "unet_meta").write_text("a file, not a model")
    with pytest.raises(RepositoryError, match="is not a model folder"):
        build(model_files, "unet_meta", repo, force=True)
    assert snapshot(repo) == {"unet_meta": b"a file, not a model"}


def test_a_failed_build_leaves_nothing_half_written(make_model: Callable[..., Path], tmp_path: Path) -> None:
    """Metadata that contradicts the model fails the build; the repository keeps exactly what it had."""
    from .conftest import UNET16_META, save_scripted
    from .test_metadata import two_channel_unet

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "other").mkdir()
    (repo / "other" / "config.pbtxt").write_text('name: "other"')
    before = snapshot(repo)
    liar = save_scripted(two_channel_unet(), tmp_path / "liar.pt", UNET16_META)
    with pytest.raises(ConfigError, match="to have 2 channels"):
        build_repository(liar, repo, "liar")
    with pytest.raises(ConfigError, match="pass --input-shape"):
        build_repository(make_model(torch.nn.Identity()), repo, "plain")
    assert snapshot(repo) == before


@pytest.mark.usefixtures("restore_console")
def test_a_failed_build_into_a_new_folder_creates_no_folder(
    make_model: Callable[..., Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from monai_triton_ops.cli import main

    plain = make_model(torch.nn.Identity())
    assert main(["repo", "build", str(plain), "-o", str(tmp_path / "new" / "repo"), "--name", "plain"]) == 2
    assert capsys.readouterr().err.startswith("error: model 'plain': ")
    assert not (tmp_path / "new").exists()


def test_a_repository_path_that_is_a_file_or_a_bad_version(model_files: dict[str, Path], tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(RepositoryError, match="exists and is not a folder"):
        build(model_files, "unet_meta", tmp_path / "file")
    for version in (0, -1, True, "2"):
        with pytest.raises(ConfigError, match="version must be an integer >= 1"):
            build(model_files, "unet_meta", tmp_path / "repo", version=version)


def test_the_self_check_catches_text_that_does_not_parse_back(model_files: dict[str, Path]) -> None:
    signature, options, text = generate_config(model_files["unet_meta"], "unet_meta")
    check_config_text(text, signature, options)
    with pytest.raises(RepositoryError, match="does not parse back to what was generated"):
        check_config_text(text.replace("dims: [-1, 3,", "dims: [-1, 4,"), signature, options)
    with pytest.raises(RepositoryError, match="does not parse back"):
        check_config_text(text, signature, ConfigOptions(flavor="libtorch"))


def test_model_filename_follows_the_config(model_files: dict[str, Path], tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    folder = build(model_files, "unet_meta", repo, flavor="libtorch")
    assert model_filename(repo, "unet_meta") == "model.pt"
    config = folder / "config.pbtxt"
    config.write_text(
        config.read_text().replace('default_model_filename: "model.pt"', 'default_model_filename: "n.ts"')
    )
    (folder / "1" / "model.pt").rename(folder / "1" / "n.ts")
    assert model_filename(repo, "unet_meta") == "n.ts"
    with create_backend("torch", "unet_meta", model_repository=repo) as backend:
        assert backend.signature.inputs[0].name == "x"
    (folder / "config.pbtxt").unlink()
    assert model_filename(repo, "unet_meta") == "model.pt"  # no config: the default
