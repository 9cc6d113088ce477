"""The warm interpreter the app tests fork from: a forked run must look, to the command, like ``python`` itself."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from . import warm_python

pytestmark = pytest.mark.skipif(os.environ.get("WARM_PYTHON") == "0", reason="WARM_PYTHON=0: every run is fresh")

PROBE = """
import json, os, resource, sys
seen = {"argv": sys.argv[1:], "path0": sys.path[0], "cwd": os.getcwd(), "name": __name__,
        "file": os.path.basename(__file__), "env": os.environ.get("MONAI_TRITON_PROBE"), "stdin": sys.stdin.read(),
        "main": sys.modules["__main__"].__dict__.get("MARK")}
print(json.dumps(seen))
print("to stderr", file=sys.stderr)
if sys.argv[1] == "raise":
    raise ValueError("the probe fails")
sys.exit(int(sys.argv[1]))
"""


Run = subprocess.CompletedProcess[str]


def both(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> tuple[Run, Run]:
    """The command fresh and forked, in the environment the warm interpreter started with (other tests of this
    worker may have changed the worker's own meanwhile: an in-process server's library path)."""
    env = env or warm_python.environment()
    fresh = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=False)
    forked = warm_python.run(command, cwd=cwd, env=env, timeout=60)
    assert forked.forked, f"the command ran fresh ({forked.why_fresh}): nothing compared"
    return fresh, forked


@pytest.mark.parametrize("how", ["path", "module"])
def test_a_forked_run_sees_what_a_fresh_python_sees(how: str, tmp_path: Path) -> None:
    (tmp_path / "probe_main.py").write_text("MARK = 'main'\n" + PROBE)
    target = [str(tmp_path / "probe_main.py")] if how == "path" else ["-m", "probe_main"]
    command = [sys.executable, *target]
    env = warm_python.environment(MONAI_TRITON_PROBE="set for this run")
    fresh, forked = both([*command, "3", "--flag"], tmp_path, env)
    assert (forked.returncode, forked.stderr) == (fresh.returncode, fresh.stderr) == (3, "to stderr\n")
    assert json.loads(forked.stdout) == json.loads(fresh.stdout)
    assert json.loads(forked.stdout)["env"] == "set for this run"


def test_an_uncaught_exception_is_a_traceback_and_exit_1(tmp_path: Path) -> None:
    (tmp_path / "probe_main.py").write_text(PROBE)
    fresh, forked = both([sys.executable, str(tmp_path / "probe_main.py"), "raise"], tmp_path)
    assert forked.returncode == fresh.returncode == 1
    assert forked.stderr.splitlines()[-1] == fresh.stderr.splitlines()[-1] == "ValueError: the probe fails"


def test_an_app_gets_the_stack_limit_a_restarted_entry_point_has(tmp_path: Path) -> None:
    """Holoscan wants 32 MiB stacks: the zygote raised its limit before starting, as every entry point does."""
    import resource

    (tmp_path / "stack.py").write_text("import resource; print(resource.getrlimit(resource.RLIMIT_STACK)[0])")
    forked = warm_python.run([sys.executable, str(tmp_path / "stack.py")], cwd=tmp_path, env=warm_python.environment())
    assert forked.forked
    _, hard = resource.getrlimit(resource.RLIMIT_STACK)
    if hard != resource.RLIM_INFINITY and hard < 32 * 1024 * 1024:
        pytest.skip("the hard stack limit is below 32 MiB here")
    assert int(forked.stdout) >= 32 * 1024 * 1024


def test_a_run_past_its_timeout_is_killed_and_raises(tmp_path: Path) -> None:
    (tmp_path / "sleep.py").write_text("import time; print('started', flush=True); time.sleep(300)")
    with pytest.raises(subprocess.TimeoutExpired) as raised:
        warm_python.run([sys.executable, str(tmp_path / "sleep.py")], cwd=tmp_path, timeout=3)
    assert raised.value.output == "started\n"
    done = warm_python.run([sys.executable, "-m", "json.tool", "--help"], cwd=tmp_path, timeout=60)
    assert done.returncode == 0  # the zygote still serves


def test_an_environment_that_changes_what_imports_read_runs_fresh(tmp_path: Path) -> None:
    (tmp_path / "pid.py").write_text("import os; print(os.getppid())")
    env = warm_python.environment(OMP_NUM_THREADS="1")
    result = warm_python.run([sys.executable, str(tmp_path / "pid.py")], cwd=tmp_path, env=env, timeout=60)
    assert not result.forked
    assert int(result.stdout) == os.getpid()


SCRIPT_PROBE = """
import json, os, sys
seen = {"argv": sys.argv[1:], "cwd": os.getcwd(), "env": os.environ.get("MONAI_TRITON_PROBE"),
        "stdin": sys.stdin.read(), "path": sys.path[1] == os.environ["PYTHONPATH"]}
print(json.dumps(seen), flush=True)
print("to stderr", file=sys.stderr, flush=True)
print(json.dumps({"torch": "torch" in sys.modules}), file=sys.stderr)
if sys.argv[1] == "wait":
    import signal
    signal.signal(signal.SIGINT, lambda *_: sys.exit(7))
    signal.pause()
sys.exit(int(sys.argv[1]))
"""


def test_a_console_script_stand_in_forks_with_the_shells_redirections(tmp_path: Path) -> None:
    """A shell line's ``monai-triton``: its arguments, folder, stdin and redirections reach the fork, as a fresh
    script's do; SIGINT to the stand-in reaches the fork and the exit code comes back."""
    real = tmp_path / "real" / "probe"
    real.parent.mkdir()
    real.write_text(f"#!{sys.executable}\n{SCRIPT_PROBE}")
    real.chmod(0o755)
    (tmp_path / "bin").mkdir()
    warm_python.console_script(tmp_path / "bin", "probe", real)
    env = warm_python.environment(MONAI_TRITON_PROBE="set", PYTHONPATH=str(tmp_path))
    line = "echo input | {} 3 --flag > out.txt 2> err.txt || echo code=$? >> out.txt; cat out.txt err.txt"
    shell = ["bash", "-c"]
    fresh = subprocess.run(
        [*shell, line.format(real)], cwd=tmp_path, env=env, capture_output=True, text=True, check=True
    )
    forked = subprocess.run(
        [*shell, line.format(tmp_path / "bin" / "probe")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    *same, loaded = forked.stdout.splitlines()
    assert same == fresh.stdout.splitlines()[:-1]
    assert same[1:] == ["code=3", "to stderr"]
    assert json.loads(same[0]) == {
        "argv": ["3", "--flag"],
        "cwd": str(tmp_path),
        "env": "set",
        "stdin": "input\n",
        "path": True,
    }
    assert json.loads(loaded) == {"torch": True}, "the stand-in ran the script fresh, not forked"
    interrupted = "{} wait & sleep 1; kill -INT $!; wait $! || echo code=$?"
    waited = subprocess.run(
        [*shell, interrupted.format(tmp_path / "bin" / "probe")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert waited.stdout.splitlines()[-1] == "code=7"


@pytest.mark.parametrize("ending", ["message", "interrupt"])
def test_a_forked_run_ends_as_the_interpreter_ends_one(ending: str, tmp_path: Path) -> None:
    """A forked run skips the teardown of the heap it shares with the zygote (``warm_python._exit``), not what comes
    before it: non-daemon threads are joined, ``atexit`` functions run, ``SystemExit``'s message is printed, an
    uncaught ``KeyboardInterrupt`` is death by SIGINT."""
    (tmp_path / "ending.py").write_text(
        "import atexit, sys, threading, time\n"
        "atexit.register(lambda: print('atexit ran', flush=True))\n"
        "threading.Thread(target=lambda: (time.sleep(0.2), print('thread joined', flush=True))).start()\n"
        "print('buffered', end='')\n"
        "if sys.argv[1] == 'interrupt':\n"
        "    raise KeyboardInterrupt\n"
        "sys.exit('the message')\n"
    )
    fresh, forked = both([sys.executable, str(tmp_path / "ending.py"), ending], tmp_path)
    assert (
        (forked.returncode, forked.stdout)
        == (fresh.returncode, fresh.stdout)
        == (
            (1 if ending == "message" else -signal.SIGINT),
            "bufferedthread joined\natexit ran\n",
        )
    )
    assert forked.stderr.splitlines()[-1] == fresh.stderr.splitlines()[-1]
