"""A backend per model: ``--backend NAME=SPEC``, ``MONAI_TRITON_BACKEND="SPEC;NAME=SPEC"`` and ``app.yaml``, one rule,
and the bad choices refused before anything runs (``monai_triton_ops/deployment.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from monai_triton_ops.cli import main
from monai_triton_ops.deployment import check_models, resolve
from monai_triton_ops.errors import BackendSpecError, UsageError

pytestmark = pytest.mark.usefixtures("restore_console")

FLEET = "grpc://gpu1:8001,gpu2:8001?ready_timeout_s=5"


def backends(choice_models: dict[str, object]) -> dict[str, tuple[str, str]]:
    return {name: (s.value, s.source) for name, s in choice_models.items()}  # type: ignore[attr-defined]


def test_a_model_takes_its_own_entry_else_the_app_wide_one_of_the_first_source_that_sets_either() -> None:
    # a fleet's commas and a query's '=' stay inside one spec
    choice = resolve(["torch", f"spleen={FLEET}"], environ={})
    assert (choice.default.value, choice.default.source) == ("torch", "command line")
    assert backends(choice.models) == {"spleen": (FLEET, "command line")}
    assert choice.of("pancreas").value == "torch"
    # the command line names spleen only: pancreas and the app-wide value come from the environment
    env = {"MONAI_TRITON_BACKEND": "triton;pancreas=http://h:8000"}
    choice = resolve(["spleen=grpc://h:8001"], environ=env)
    assert (choice.default.value, choice.default.source) == ("triton", "environment")
    assert backends(choice.models) == {
        "spleen": ("grpc://h:8001", "command line"),
        "pancreas": ("http://h:8000", "environment"),
    }
    # an app-wide value on the command line wins over a model's entry in a later source
    choice = resolve(["http://h:8000"], environ={"MONAI_TRITON_BACKEND": "spleen=torch"})
    assert choice.of("spleen").value == "http://h:8000"
    # -t is the command line's app-wide value; app.yaml's entries rank below the environment's
    env = {"MONAI_TRITON_BACKEND": "spleen=triton", "TRITON_SERVER_NETLOC": "h:8000"}
    choice = resolve([], environ=env, from_yaml={"MONAI_TRITON_BACKEND": "spleen=triton"})
    assert (choice.default.value, choice.default.source) == ("http://h:8000", "environment")
    assert choice.of("spleen").value == "http://h:8000"  # the environment's app-wide value: a source before app.yaml
    choice = resolve(
        [], environ={"MONAI_TRITON_BACKEND": "spleen=triton"}, from_yaml={"MONAI_TRITON_BACKEND": "spleen=triton"}
    )
    assert backends(choice.models) == {"spleen": ("triton", "app.yaml")}
    assert resolve([], netloc="h:8000", environ={"MONAI_TRITON_BACKEND": "triton"}).default.value == "http://h:8000"


@pytest.mark.parametrize(
    ("values", "env", "message"),
    [
        (["spleen=grpc://a:8001", "spleen=torch"], {}, "--backend: two backends for model 'spleen', 'grpc://a:8001'"),
        ([], {"MONAI_TRITON_BACKEND": "spleen=torch;spleen=triton"}, "MONAI_TRITON_BACKEND (environment): two"),
        (["torch", "triton"], {}, "--backend: two app-wide backends, 'torch' and 'triton'"),
    ],
)  # fmt: skip
def test_two_backends_for_one_model_are_refused(values: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(UsageError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        resolve(values, environ=env)


def test_a_bad_spec_for_a_model_is_named() -> None:
    with pytest.raises(BackendSpecError, match="trition"):
        resolve(["spleen=trition"], environ={})


def test_a_backend_for_a_model_that_is_not_in_the_models_folder_is_refused(tmp_path: Path) -> None:
    for name in ("spleen", "pancreas"):
        (tmp_path / name).mkdir()
    check_models(resolve(["spleen=torch"], environ={}), tmp_path)
    with pytest.raises(UsageError) as raised:
        check_models(resolve([], environ={"MONAI_TRITON_BACKEND": "torch;liver=triton"}), tmp_path)
    assert str(raised.value) == (
        f"MONAI_TRITON_BACKEND (environment): backend for model 'liver', which is not in the models folder "
        f"'{tmp_path}' (models there: pancreas, spleen); NAME must be a model's folder name"
    )
    check_models(resolve(["liver=torch"], environ={}), tmp_path / "spleen" / "missing")  # not a models folder


RECORDER = """\
import sys
from pathlib import Path
Path(sys.argv[sys.argv.index("-o") + 1], "ran").write_text("the app ran")
"""


@pytest.mark.parametrize(
    ("backend", "message"),
    [
        (["liver=torch"], "--backend: backend for model 'liver', which is not in the models folder"),
        (["spleen=torch", "spleen=triton"], "--backend: two backends for model 'spleen', 'torch' and 'triton'"),
    ],
)
def test_exec_refuses_a_bad_backend_map_before_the_app_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], backend: list[str], message: str
) -> None:
    app = tmp_path / "app.py"
    app.write_text(RECORDER)
    (tmp_path / "models" / "spleen").mkdir(parents=True)
    (tmp_path / "out").mkdir()
    flags = [part for value in backend for part in ("--backend", value)]
    code = main(["exec", str(app), "-i", str(app), "-o", str(tmp_path / "out"), "-m", str(tmp_path / "models"), *flags])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(f"error: {message}")
    assert err.count("\n") == 1  # one line, no traceback
    assert list((tmp_path / "out").iterdir()) == []  # nothing ran


def test_exec_hands_a_backend_map_to_the_app_as_one_variable(tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text(
        "import json, os, sys\nfrom pathlib import Path\n"
        "out = Path(sys.argv[sys.argv.index('-o') + 1])\n"
        "(out / 'env.json').write_text(json.dumps(os.environ['MONAI_TRITON_BACKEND']))\n"
    )
    out = tmp_path / "out"
    out.mkdir()
    code = main(
        ["exec", "--backend", f"spleen={FLEET}", str(app), "-i", "x", "-o", str(out), "-m", "m", "--backend", "torch"]
    )
    assert code == 0
    assert json.loads((out / "env.json").read_text()) == f"spleen={FLEET};torch"


def test_an_app_with_our_context_gives_each_model_its_backend_and_that_backends_options(tmp_path: Path) -> None:
    """``app_args.init_app_context`` takes the repeated flag; an option goes to each chosen backend that has it."""
    from monai_triton_ops.app_args import init_app_context
    from monai_triton_ops.operators.arguments import deployed_options, spec_from

    for name in ("small", "big"):
        (tmp_path / "models" / name).mkdir(parents=True)
    (tmp_path / "in.nii.gz").write_bytes(b"x")
    line = ["app", "-i", str(tmp_path / "in.nii.gz"), "-o", str(tmp_path / "out"), "-m", str(tmp_path / "models")]
    remote = "grpc://127.0.0.1:9"
    context = init_app_context([*line, "--backend", "torch", "--backend", f"big={remote}", "--shared-memory", "none"])
    assert spec_from(None, context, "big") == (remote, "command line")
    assert spec_from("triton", context, "small") == ("torch", "command line")  # deploy-time over the code's
    assert {k: v.value for k, v in deployed_options(context, "big").items()} == {"shared_memory": "none"}
    assert deployed_options(context, "small") == {}  # torch has no shared_memory: not given to it, and no error
    with pytest.raises(UsageError, match=r"^--shared-memory: backend 'torch' has no option 'shared_memory'"):
        init_app_context([*line, "--backend", "torch", "--shared-memory", "none"])
