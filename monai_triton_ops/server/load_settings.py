"""How a ``tritonserver`` loads a repository: whether it completes the models' configs.

A Python-backend model's load is CPU work in a stub process (its interpreter starts and imports torch), and the
backend gives a stub fixed windows to answer (10 s to start, a health beat within 1 s: python_backend
``src/stub_launcher.cc``, ``src/python_be.cc``); a stub starved of CPU at the wrong moment makes the backend abort the
whole server (``boost::interprocess::lock_exception``, triton-inference-server/server#8882). Triton's auto-complete
starts one more stub per Python model, only to ask ``model.py`` for an ``auto_complete_config`` that the configs
``monai-triton repo build`` writes do not need, so it is turned off (``--disable-auto-complete-config``, as the
in-process server's strict config already is) when no model needs it: a third less CPU and half the time for four
Python models (``benchmarks/bench_server_start.py``). Loading fewer models at once saves no CPU and doubled that
time, so Triton's own load concurrency stays (``--model-load-thread-count``, an option).
"""

from __future__ import annotations

from pathlib import Path

from .capabilities import read_config


def needs_auto_complete(repository: Path) -> bool:
    """Whether a model in ``repository`` relies on Triton to complete its configuration.

    It does when it has no ``config.pbtxt`` or one Triton cannot parse (Triton then derives or reports it), when
    its config declares no input or no output, or when its ``model.py`` defines ``auto_complete_config``.
    """
    if not repository.is_dir():
        return True
    for folder in sorted(p for p in repository.iterdir() if p.is_dir() and not p.name.startswith(".")):
        config = read_config(folder)
        if config is None or not config.input or not config.output or _completes_itself(folder):
            return True
    return False


def _completes_itself(folder: Path) -> bool:
    """Whether a version's ``model.py`` defines the Python backend's ``auto_complete_config`` hook."""
    for script in folder.glob("*/model.py"):
        try:
            if "def auto_complete_config" in script.read_text(encoding="utf-8", errors="replace"):
                return True
        except OSError:
            return True
    return False
