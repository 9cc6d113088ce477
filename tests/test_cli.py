"""``monai-triton``: ``exec`` mirrors ``monai-deploy exec``; every command starts light, has help, fails in one line."""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from monai_triton_ops import __version__
from monai_triton_ops.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.usefixtures("restore_console")

RECORDER = """\
import json, os, resource, sys
from pathlib import Path
out = Path(sys.argv[sys.argv.index("-o") + 1])
out.mkdir(parents=True, exist_ok=True)
(out / "argv.json").write_text(json.dumps(sys.argv[1:]))
(out / "stack.json").write_text(json.dumps(resource.getrlimit(resource.RLIMIT_STACK)))
(out / "env.json").write_text(json.dumps({k: v for k, v in os.environ.items() if k.startswith("MONAI_TRITON_")}))
"""


def cli(*args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    """``monai-triton ARGS`` as its own process, the worktree's code first."""
    command = [sys.executable, "-m", "monai_triton_ops.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, check=False, **kwargs)  # type: ignore[call-overload]


@pytest.fixture
def recorder(tmp_path: Path) -> Path:
    app = tmp_path / "app"
    app.mkdir()
    (app / "__main__.py").write_text(RECORDER)
    return app


def test_exec_runs_a_folder_app_with_the_sdk_arguments_and_ours(recorder: Path, tmp_path: Path) -> None:
    """The App SDK's options reach the app's command line, ours (before or after APP) its environment: an App SDK
    app's own parser (``Application.init_app_context``) refuses options it does not know."""
    out = tmp_path / "out"
    code = main(
        ["exec", "--backend", "torch", str(recorder), "-i", "in", "-o", str(out), "-m", "models", "-l", "debug",
         "-w", "work", "-t", "triton:8000", "--allow-non-finite", "--timeout-s", "30", "--backend", "seg=triton",
         "--model-name", "seg", "--holoscan-option", "x"]
    )  # fmt: skip
    assert code == 0
    assert json.loads((out / "argv.json").read_text()) == [
        "-i", "in", "-o", str(out), "-m", "models", "-l", "DEBUG", "-w", "work", "-t", "triton:8000",
        "--holoscan-option", "x",
    ]  # fmt: skip
    assert json.loads((out / "env.json").read_text()) == {
        "MONAI_TRITON_BACKEND": "torch;seg=triton",
        "MONAI_TRITON_TIMEOUT_S": "30",
        "MONAI_TRITON_MODEL_NAME": "seg",
        "MONAI_TRITON_ALLOW_NON_FINITE": "1",
        "MONAI_TRITON_COMMAND_LINE": "MONAI_TRITON_ALLOW_NON_FINITE,MONAI_TRITON_BACKEND,MONAI_TRITON_MODEL_NAME,"
        "MONAI_TRITON_TIMEOUT_S",
    }
    assert "MONAI_TRITON_BACKEND" not in os.environ  # the run's environment is the app's, not left behind


def test_exec_runs_a_script_and_refuses_a_non_app(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "app.py"
    script.write_text(RECORDER)
    assert main(["exec", str(script), "-i", "in", "-o", str(tmp_path / "o"), "-m", "m"]) == 0
    assert json.loads((tmp_path / "o" / "argv.json").read_text())[-2:] == ["-m", "m"]
    capsys.readouterr()
    assert main(["exec", str(tmp_path), "-i", "in", "-o", "o", "-m", "m"]) == 2
    assert capsys.readouterr().err == (
        f"error: {str(tmp_path)!r} is neither a .py file nor a folder with __main__.py\n"
    )


def test_exec_refuses_a_backend_that_cannot_load_before_the_app_runs(
    recorder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from monai_triton_ops.backends import registry

    monkeypatch.setattr(registry, "_registry", dict(registry._registry))
    registry.register_backend("planned", "monai_triton_ops.backends.not_built_here:Planned")
    out = tmp_path / "out"
    assert main(["exec", str(recorder), "-i", "in", "-o", str(out), "-m", "m", "--backend", "planned"]) == 3
    assert capsys.readouterr().err.startswith("error: backend 'planned' cannot be imported")
    assert not out.exists()
    assert main(["exec", str(recorder), "-i", "in", "-o", str(out), "-m", "m", "--backend", "tensorrt"]) == 2
    assert capsys.readouterr().err.startswith("error: unknown backend spec 'tensorrt'")


def test_usage_errors_are_one_line_with_exit_code_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["exec", "app", "-i"]) == 2
    assert capsys.readouterr().err == (
        "error: monai-triton exec: argument -i/--input: expected one argument (see 'monai-triton exec --help')\n"
    )
    assert main(["nonsense"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_every_option_of_every_command_has_help() -> None:
    def walk(parser: argparse.ArgumentParser, where: str) -> list[str]:
        missing = []
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    missing += walk(sub, f"{where} {name}")
            elif not action.help:
                missing.append(f"{where} {'/'.join(action.option_strings) or action.dest}")
        return missing

    assert walk(build_parser(), "monai-triton") == []


def test_repo_check_waits_on_a_server_as_long_as_every_control_call() -> None:
    """``repo check --server``'s ``--timeout`` default is the one control-call timeout, written out in the parser."""
    from monai_triton_ops.client.timeouts import CONTROL_TIMEOUT_S

    args = build_parser().parse_args(["repo", "check", "--server", "grpc://h:8001"])
    assert args.timeout == CONTROL_TIMEOUT_S


def test_help_and_version_start_without_torch_or_holoscan() -> None:
    """What makes them fast (timed in benchmarks/bench_cli.py, not here): nothing heavy is imported."""
    probe = (
        "import sys, monai_triton_ops.cli; print(sorted(m for m in ('torch', 'monai', 'holoscan') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[]"
    version = cli("--version")
    assert (version.returncode, version.stdout, version.stderr) == (0, f"monai-triton {__version__}\n", "")
    helped = cli("--help")
    assert helped.returncode == 0
    assert helped.stderr == ""
    assert "Exit codes: 0 success" in " ".join(helped.stdout.split())


def test_repo_commands_on_a_model_folder_import_no_torch_monai_or_holoscan() -> None:
    """A command that runs no app loads none of the heavy imports it does not need (torch alone is 2.5 s of CPU): a
    Triton model folder is read from its ``config.pbtxt``; asking whether it is a bundle loads no ``monai.bundle``.
    Nor does it print Holoscan's stack-size warning, even under a soft stack limit below the 32 MiB Holoscan wants."""
    folder = ROOT / "model_repository" / "brain_tissue_seg"
    probe = (
        "import sys\nfrom monai_triton_ops.cli import main\n"
        f"codes = [main(['repo', 'describe', {str(folder)!r}]), main(['repo', 'check', {str(folder.parent)!r}])]\n"
        "print(codes, sorted(m for m in ('torch', 'monai', 'holoscan') if m in sys.modules))"
    )
    _, hard = resource.getrlimit(resource.RLIMIT_STACK)
    low = 8 * 1024 * 1024 if hard == resource.RLIM_INFINITY else min(8 * 1024 * 1024, hard)

    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_STACK, (low, hard))

    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True, preexec_fn=lower
    )
    assert "brain_tissue_seg" in result.stdout
    assert result.stdout.splitlines()[-1] == "[0, 0] []"
    assert result.stderr == ""


def test_exec_raises_the_stack_limit_for_the_app(recorder: Path, tmp_path: Path) -> None:
    """Holoscan wants 32 MiB: ``exec`` raises the soft limit (within the hard one) and restarts once."""
    _, hard = resource.getrlimit(resource.RLIMIT_STACK)
    low = 8 * 1024 * 1024
    if hard != resource.RLIM_INFINITY and hard <= low:
        pytest.skip(f"the hard stack limit ({hard}) leaves nothing to raise")

    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_STACK, (low, hard))

    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "MONAI_TRITON_STACK_RAISED"}
    result = cli("exec", str(recorder), "-i", "in", "-o", str(out), "-m", "m", preexec_fn=lower, env=env)
    assert result.returncode == 0, result.stderr
    soft_in_app, _ = json.loads((out / "stack.json").read_text())
    assert soft_in_app == 32 * 1024 * 1024 or (hard != resource.RLIM_INFINITY and soft_in_app == hard)
    assert result.stderr == ""
