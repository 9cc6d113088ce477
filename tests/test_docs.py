"""The user guide cannot rot: it builds in strict mode, and every code block of the docs runs or says who runs it.

Each ``python``/``bash`` block of ``README.md``, ``CONTRIBUTING.md`` and ``docs/*.md`` (found by globbing, so new
pages are held to it too) carries a marker on the line before its opening fence::

    <!-- docs-test: run -->                        run here, as written, in a sandbox (below)
    <!-- docs-test: run with patch, server -->     the same, after the named givens (GIVENS)
    <!-- docs-test: tested by tests/apps/x.py -->  another test runs it (the file must exist)
    <!-- docs-test: not run: REASON -->           it cannot run in a test (Docker, minutes of benchmark, ...)

The sandbox is a fresh folder per block holding what the examples name: a copy of ``model_repository/``,
``model.pt`` / ``model.ts`` (a small UNet with MONAI metadata), ``plain.pt`` (the same without),
``models_client_side/seg`` (a client-side config like the App SDK remote example's), and ``.venv`` and ``apps``
linked from the checkout; ``monai-triton`` is on ``PATH``, a stand-in that forks it from the worker's warm
interpreter (``tests/warm_python.py``: a command pays no import of torch, MONAI and Holoscan of its own). Bash runs
with ``-euo pipefail``; a ``monai-triton serve`` line runs until it has listed its models, then gets Ctrl-C (SIGINT)
and must exit 0; a ``monai-triton package`` line runs with ``--no-build``: it checks its arguments, the app and the
models and writes the whole build context, and the image build itself (minutes) is
``tests/packaging/test_map_image.py``'s. Python blocks run in a fresh interpreter. The ``server`` given is the
session's local tritonserver over the committed repository (``committed_server``, the same files as the sandbox's
copy); its address replaces the docs' placeholder ``triton.example``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from . import warm_python

if TYPE_CHECKING:
    from monai_triton_ops.server import LocalTritonServer

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
CODE = {"python", "bash", "sh", "shell"}
_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)
_MARKER = re.compile(r"^<!-- docs-test: (?P<what>.+?) -->$")
_SERVE = re.compile(r"^(\s*)((?:\.venv/bin/)?monai-triton serve .*)$", re.M)
#: ``monai-triton package ...`` up to a comment or the end of the line: ``--no-build`` goes there.
_PACKAGE = re.compile(r"^(\s*(?:\.venv/bin/)?monai-triton package [^#\n]*?)(\s*(?:#.*)?)$", re.M)

GIVENS = {
    "patch": """
        import numpy as np
        patch = np.random.default_rng(0).standard_normal((1, 1, 64, 64, 64)).astype(np.float32)
        volume = batch = patch
    """,
    "inputs": """
        import numpy as np
        import tritonclient.grpc as grpcclient
        inputs = [grpcclient.InferInput("x", [1, 1, 32, 32, 32], "FP32")]
        inputs[0].set_data_from_numpy(np.zeros((1, 1, 32, 32, 32), np.float32))
    """,
    "server": "",  # the address of the module's server, put in place of triton.example
}


#: ``models_client_side/seg``: the App SDK remote example's client-side config, for the sandbox's UNet (3 classes).
CLIENT_SIDE_CONFIG = """
platform: "pytorch_libtorch"
max_batch_size: 16
default_model_filename: "model_seg_v1.ts"
input [ { name: "INPUT_0" data_type: TYPE_FP32 dims: [ 1, 96, 96, 96 ] } ]
output [ { name: "OUTPUT_0" data_type: TYPE_FP32 dims: [ 3, 96, 96, 96 ] } ]
version_policy: { latest: { num_versions: 1 } }
instance_group [ { kind: KIND_GPU count: 1 } ]
dynamic_batching { preferred_batch_size: [ 4, 8, 16 ] max_queue_delay_microseconds: 1000 }
parameters: { key: "DISABLE_OPTIMIZED_EXECUTION" value: { string_value: "true" } }
"""


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    language: str
    body: str
    marker: str | None

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def code_blocks() -> list[Block]:
    found = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for match in _FENCE.finditer(text):
            if match.group(1) not in CODE:
                continue
            before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            marker = _MARKER.match(before.strip())
            line = text[: match.start()].count("\n") + 1
            found.append(Block(path, line, match.group(1), match.group(2), marker["what"] if marker else None))
    return found


BLOCKS = code_blocks()
RUN = [b for b in BLOCKS if b.marker is not None and (b.marker == "run" or b.marker.startswith("run with "))]


def givens(block: Block) -> list[str]:
    return [g.strip() for g in block.marker.removeprefix("run").removeprefix(" with ").split(",") if g.strip()]  # type: ignore[union-attr]


def test_every_code_block_says_how_it_is_tested() -> None:
    unmarked = [b.where for b in BLOCKS if b.marker is None]
    assert not unmarked, (
        f"code blocks without a '<!-- docs-test: ... -->' line before them: {unmarked} "
        "(run / run with GIVENS / tested by FILE / not run: WHY; see tests/test_docs.py's docstring)"
    )
    for block in BLOCKS:
        what = block.marker or ""
        if what.startswith("tested by "):
            assert (ROOT / what.removeprefix("tested by ")).is_file(), f"{block.where}: no {what}"
        elif what.startswith("not run: "):
            assert len(what) > len("not run: ") + 10, f"{block.where}: say why it is not run"
        else:
            assert what == "run" or what.startswith("run with "), f"{block.where}: unknown marker {what!r}"
            unknown = set(givens(block)) - set(GIVENS)
            assert not unknown, f"{block.where}: unknown givens {sorted(unknown)}; known: {sorted(GIVENS)}"


# -- running them -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``model.pt`` and ``model.ts`` (a small UNet with MONAI metadata), ``plain.pt`` (the same without)."""
    from .conftest import UNET_META, save_model, tiny_unet

    folder = tmp_path_factory.mktemp("doc_models")
    save_model(tiny_unet(), folder / "model.pt", UNET_META)
    shutil.copyfile(folder / "model.pt", folder / "model.ts")
    save_model(tiny_unet(), folder / "plain.pt", None)
    return folder


@pytest.fixture
def sandbox(model_files: Path, tmp_path: Path) -> Path:
    """A fresh folder per block: what the examples name, so no block sees another's output."""
    shutil.copytree(
        ROOT / "model_repository", tmp_path / "model_repository", ignore=shutil.ignore_patterns("__pycache__")
    )
    for name in ("model.pt", "model.ts", "plain.pt"):
        shutil.copyfile(model_files / name, tmp_path / name)
    for name in (".venv", "apps"):
        (tmp_path / name).symlink_to(ROOT / name, target_is_directory=True)
    client_side = tmp_path / "models_client_side" / "seg"
    client_side.mkdir(parents=True)
    (client_side / "config.pbtxt").write_text(CLIENT_SIDE_CONFIG)
    return tmp_path


@pytest.fixture
def server(committed_server: LocalTritonServer) -> dict[str, str]:
    """The docs' ``triton.example`` ports -> the addresses of the session's server over the committed repository."""
    return {"triton.example:8001": committed_server.grpc_address, "triton.example:8000": committed_server.http_address}


@pytest.fixture(scope="module")
def scripts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding ``monai-triton``, forked from the worker's warm interpreter (``warm_python.console_script``)."""
    folder = tmp_path_factory.mktemp("warm_scripts")
    warm_python.console_script(folder, "monai-triton")
    return folder


def environment(scripts: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{scripts}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(ROOT)
    return env


SERVE_UNTIL_READY = """
serve_until_ready() {  # run 'monai-triton serve ...' until it lists its models, then Ctrl-C it: it must exit 0
  "$@" > serve.log 2>&1 &
  local pid=$! i
  for i in $(seq 1 600); do
    if grep -q '^model .* READY$' serve.log; then kill -INT "$pid"; wait "$pid"; return; fi
    kill -0 "$pid" 2>/dev/null || { cat serve.log >&2; wait "$pid"; return 1; }
    sleep 0.5
  done
  kill -KILL "$pid"; cat serve.log >&2; return 1
}
"""


def as_tested(bash: str) -> str:
    """``serve`` lines until their models are listed, ``package`` lines with ``--no-build`` (see the docstring)."""
    return _PACKAGE.sub(r"\1 --no-build\2", _SERVE.sub(r"\1serve_until_ready \2", bash))


def test_package_lines_build_the_context_only_and_serve_lines_stop_when_ready() -> None:
    bash = (
        "monai-triton package apps/x -m repo          # the app as a MAP image\n"
        "  .venv/bin/monai-triton package apps/x -m repo\n"
        "monai-triton serve repo   # Ctrl-C stops\n"
    )
    assert as_tested(bash).splitlines() == [
        "monai-triton package apps/x -m repo --no-build          # the app as a MAP image",
        "  .venv/bin/monai-triton package apps/x -m repo --no-build",
        "serve_until_ready monai-triton serve repo   # Ctrl-C stops",
    ]
    assert any("monai-triton package" in b.body for b in RUN), "no block runs package: drop the rewrite"


@pytest.mark.slow
@pytest.mark.triton
@pytest.mark.parametrize("block", RUN, ids=[b.where for b in RUN])
def test_the_block_runs_as_written(block: Block, sandbox: Path, scripts: Path, request: pytest.FixtureRequest) -> None:
    body = block.body
    if "server" in givens(block):
        for placeholder, address in request.getfixturevalue("server").items():
            body = body.replace(placeholder, address)
    if block.language == "python":
        prelude = "".join(textwrap.dedent(GIVENS[g]) for g in givens(block))
        command = [sys.executable, "-c", prelude + body]
    else:
        command = ["bash", "-euo", "pipefail", "-c", SERVE_UNTIL_READY + as_tested(body)]
    result = subprocess.run(
        command, cwd=sandbox, env=environment(scripts), capture_output=True, text=True, timeout=600, check=False
    )
    assert result.returncode == 0, f"{block.where} failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"


# -- the guide ---------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_user_guide_builds_in_strict_mode(tmp_path: Path) -> None:
    """mkdocs --strict: a broken link or anchor, a missing page or an unreadable docstring fails it."""
    site = tmp_path / "site"
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    for page in DOCS[2:]:
        assert (site / page.stem / "index.html").is_file(), page.name
    home = (site / "index.html").read_text(encoding="utf-8")
    assert "Use it in an app" in home  # the README is the home page
    api = (site / "api" / "repository" / "index.html").read_text(encoding="utf-8")
    assert "build_repository" in api
    assert "Write model" in api  # build_repository's docstring, rendered
