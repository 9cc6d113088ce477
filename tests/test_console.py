"""One ``-l`` level for every log, Holoscan's included; the stack limit raised where the hard limit allows."""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest

from monai_triton_ops import console

pytestmark = pytest.mark.usefixtures("restore_console")

MIB = 1024 * 1024


@pytest.mark.parametrize(
    ("argv", "level"),
    [
        (["app", "-l", "debug"], "DEBUG"),
        (["app", "--log-level=INFO"], "INFO"),
        (["app", "-lERROR", "-i", "x"], "ERROR"),
        (["app", "-l", "LOUD"], "WARN"),
        (["app", "-i", "x"], "WARN"),
    ],
)
def test_the_level_is_read_like_the_app_sdk_parser_reads_it(argv: list[str], level: str) -> None:
    assert console.level_from_argv(argv) == level


def test_holoscan_follows_the_level_unless_the_user_chose(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(console, "_holoscan_level_is_ours", False)
    monkeypatch.setenv(console.HOLOSCAN_ENV, "INFO")
    console.configure_holoscan("DEBUG")
    assert console.os.environ[console.HOLOSCAN_ENV] == "INFO"  # the user's choice stays
    monkeypatch.delenv(console.HOLOSCAN_ENV)
    console.configure_holoscan("INFO")
    assert console.os.environ[console.HOLOSCAN_ENV] == "CRITICAL"  # its errors repeat ours: quiet below DEBUG
    console.configure_holoscan("DEBUG")
    assert console.os.environ[console.HOLOSCAN_ENV] == "DEBUG"


def raise_under(soft: int, hard: int) -> subprocess.CompletedProcess[str]:
    """``raise_stack_limit()`` twice in a process started with these limits; prints the result and the limits."""
    probe = (
        "import resource; from monai_triton_ops import console; "
        "print(console.raise_stack_limit(), console.raise_stack_limit(), resource.getrlimit(resource.RLIMIT_STACK))"
    )

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_STACK, (soft, hard))

    return subprocess.run(
        [sys.executable, "-c", probe], preexec_fn=limit, capture_output=True, text=True, timeout=60, check=True
    )


def test_the_soft_stack_limit_is_raised_up_to_the_hard_one() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_STACK)
    if hard != resource.RLIM_INFINITY and hard < 16 * MIB:
        pytest.skip("the hard stack limit is below 16 MiB here")
    result = raise_under(8 * MIB, 16 * MIB)
    assert result.stdout.strip() == f"True False ({16 * MIB}, {16 * MIB})"
    assert result.stderr.count("note: the stack limit is 16 MiB") == 1  # once, though asked twice
    at_hard = raise_under(8 * MIB, 8 * MIB)
    assert at_hard.stdout.strip() == f"False False ({8 * MIB}, {8 * MIB})"
    assert at_hard.stderr.count("Holoscan recommends 32 MiB") == 1
