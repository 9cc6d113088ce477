"""Typed backend options: spec query strings and keywords become the annotated types, or a clear error."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest

from monai_triton_ops.backends.options import BackendOptions, describe_options, parse_options
from monai_triton_ops.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class RemoteLike(BackendOptions):
    """The kinds of option a remote backend has."""

    timeout_s: float | None = 30.0
    verify_tls: bool = True
    shared_memory: Literal["none", "system", "cuda"] = "none"
    headers: tuple[str, ...] = ()
    window: tuple[int, int] = (1, 1)
    ca_file: Path | None = None
    retries: int = 0


def test_query_strings_are_typed_from_the_annotations() -> None:
    raw = {
        "timeout_s": "3",
        "verify_tls": "no",
        "shared_memory": "system",
        "headers": "a, b",
        "window": "2,4",
        "ca_file": "/etc/ca.pem",
        "retries": "2",
        "max_in_flight": "8",
    }
    options = parse_options(RemoteLike, raw, backend="grpc")
    assert options == RemoteLike(
        timeout_s=3.0,
        verify_tls=False,
        shared_memory="system",
        headers=("a", "b"),
        window=(2, 4),
        ca_file=Path("/etc/ca.pem"),
        retries=2,
        max_in_flight=8,
    )
    assert isinstance(options.timeout_s, float)


def test_none_and_keyword_values() -> None:
    assert parse_options(RemoteLike, {"timeout_s": "none", "output_name": ""}, backend="grpc").timeout_s is None
    typed = parse_options(RemoteLike, {"timeout_s": 2, "headers": ["x"], "ca_file": None}, backend="grpc")
    assert (typed.timeout_s, typed.headers, typed.ca_file) == (2.0, ("x",), None)


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ({"retries": "2.5"}, r"backend 'grpc': option retries='2.5' is not a int"),
        ({"retries": True}, r"option retries=True is not a int"),
        ({"verify_tls": "maybe"}, r"option verify_tls='maybe' is not a bool"),
        ({"shared_memory": "gpu"}, r"option shared_memory='gpu' is not a 'none' \| 'system' \| 'cuda'"),
        ({"window": "1,2,3"}, r"option window='1,2,3' is not a tuple\[int, int\]"),
        ({"timeout_s": "soon"}, r"option timeout_s='soon' is not a float \| None"),
        ({"timeout_s": "-1"}, r"backend 'grpc': option timeout_s must be > 0"),
        ({"max_in_flight": "0"}, r"max_in_flight must be an integer >= 1"),
    ],
)
def test_mistyped_options_name_the_option_and_its_type(raw: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_options(RemoteLike, raw, backend="grpc")


def test_unknown_options_list_every_accepted_option_with_its_type() -> None:
    with pytest.raises(ConfigError) as info:
        parse_options(RemoteLike, {"timeout": "3"}, backend="grpc")
    message = str(info.value)
    assert "backend 'grpc' has no option(s) ['timeout']" in message
    assert describe_options(RemoteLike) in message
    assert "timeout_s (float | None)" in message
    assert "headers (tuple[str, ...])" in message
    assert "ca_file (Path | None)" in message


def test_a_literal_option_is_checked_however_the_options_are_built() -> None:
    """One check of every ``Literal`` option, in ``BackendOptions``: no backend repeats it for its own fields."""
    from monai_triton_ops.backends.remote.options import RemoteOptions

    for name, bad in (("shared_memory", "gpu"), ("compression", "zstd"), ("mode", "slab"), ("fallback", "onnx")):
        with pytest.raises(ConfigError, match=rf"option {name}='{bad}' is not a '"):
            RemoteOptions(**{name: bad})  # type: ignore[arg-type]
    assert RemoteOptions(shared_memory="none", volume_output="scores").volume_output == "scores"
