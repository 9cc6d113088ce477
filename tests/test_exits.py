"""The one translation point: every failure becomes one line and its documented exit code."""

from __future__ import annotations

import io

import pytest

from monai_triton_ops import errors, exits


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (errors.BackendSpecError("x"), exits.USAGE),
        (errors.InputValidationError("x"), exits.USAGE),
        (errors.InputDataError("x"), exits.USAGE),
        (errors.ConfigError("x"), exits.USAGE),
        (errors.ModelNotFoundError("x"), exits.USAGE),
        (errors.ModelLoadError("x"), exits.USAGE),
        (errors.RepositoryError("x"), exits.USAGE),
        (errors.InferenceError("x"), exits.USAGE),
        (errors.PortInUseError("x"), exits.USAGE),
        (errors.BackendUnavailableError("x"), exits.UNAVAILABLE),
        (errors.InferenceTimeoutError("x"), exits.UNAVAILABLE),
        (errors.ServerInternalError("x"), exits.SERVER_FAILED),
        (errors.ServerNotFoundError("x"), exits.UNAVAILABLE),
        (errors.ServerStartError("x", log_tail="tail"), exits.UNAVAILABLE),
        (errors.BackendStateError("x"), exits.BUG),
        (PermissionError(13, "Permission denied", "/out/seg.nii.gz"), exits.USAGE),
        (ValueError("Missing expected input"), exits.BUG),
        (KeyboardInterrupt(), exits.INTERRUPTED),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v),
)
def test_each_error_has_its_documented_code(exc: BaseException, code: int) -> None:
    assert exits.exit_code(exc) == code
    assert code in exits.MEANINGS


def test_the_line_is_one_line_and_a_bug_says_so() -> None:
    stream = io.StringIO()
    assert exits.report(errors.ServerStartError("did not start", log_tail="a\nb"), stream=stream) == 3
    assert stream.getvalue() == "error: did not start [3 more line(s) with -l DEBUG]\n"
    stream = io.StringIO()
    assert exits.report(ValueError("odd"), stream=stream) == 1
    assert stream.getvalue() == (
        "error: internal error: ValueError: odd (a bug: rerun with -l DEBUG and report the traceback)\n"
    )
    stream = io.StringIO()
    exits.report(PermissionError(13, "Permission denied"), stream=stream)
    assert stream.getvalue() == "error: PermissionError: [Errno 13] Permission denied\n"


def test_debug_adds_the_traceback_before_the_line() -> None:
    stream = io.StringIO()
    try:
        raise errors.InputDataError("bad image")
    except errors.InputDataError as exc:
        exits.report(exc, debug=True, stream=stream)
    text = stream.getvalue()
    assert text.startswith("Traceback (most recent call last)")
    assert text.endswith("error: bad image\n")


def test_run_guarded_passes_exit_statuses_through() -> None:
    assert exits.run_guarded(lambda: None) == 0
    assert exits.run_guarded(lambda: 4) == 4

    def leave() -> int:
        raise SystemExit(3)

    assert exits.run_guarded(leave) == 3
