"""Spec strings -> backends: the run-time choice apps and hospital IT type by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from monai_triton_ops import available_backends, create_backend, register_backend
from monai_triton_ops.backends import registry
from monai_triton_ops.backends.mock import MockBackend
from monai_triton_ops.backends.registry import parse_backend_spec
from monai_triton_ops.backends.torchscript import TorchScriptBackend
from monai_triton_ops.errors import BackendSpecError, BackendUnavailableError, ConfigError


def test_default_and_torch_specs_create_the_torchscript_backend(unet_repo: Path) -> None:
    assert isinstance(create_backend(None, unet_repo, "unet"), TorchScriptBackend)
    backend = create_backend(" TORCH ", unet_repo, "unet")
    assert isinstance(backend, TorchScriptBackend)
    assert backend.device.type == "cpu"


@pytest.mark.parametrize(
    ("spec", "scheme", "url"),
    [
        ("grpc://triton.hospital.org:8001", "grpc", "grpc://triton.hospital.org:8001"),
        ("https://10.0.0.5:8443?timeout_s=3", "https", "https://10.0.0.5:8443"),
        ("torch?device=cpu", "torch", None),
        ("triton", "triton", None),
    ],
)
def test_specs_parse_into_scheme_url_and_options(spec: str, scheme: str, url: str | None) -> None:
    parsed = parse_backend_spec(spec)
    assert (parsed.scheme, parsed.url) == (scheme, url)


@pytest.mark.parametrize(
    "spec", ["triton", "grpc://localhost:8001", "grpcs://h:1", "http://localhost:8000", "https://h:1"]
)
def test_reserved_backends_say_they_are_not_available_yet(spec: str, unet_repo: Path) -> None:
    with pytest.raises(BackendUnavailableError, match=f"backend '{spec}' is not available yet"):
        create_backend(spec, unet_repo, "unet")


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("tensorrt", "unknown backend spec 'tensorrt'; expected one of: torch, triton, grpc://HOST:PORT"),
        ("", "empty backend spec"),
        ("grpc://localhost", r"expected grpc://HOST:PORT"),
        ("http://:8000", r"expected http://HOST:PORT"),
        ("grpc://host:port", "invalid port"),
        ("ftp://host:21", "unknown backend spec"),
    ],
)
def test_bad_specs_name_what_is_accepted(spec: str, match: str) -> None:
    with pytest.raises(BackendSpecError, match=match):
        parse_backend_spec(spec)


def test_query_options_are_typed_and_unknown_options_refused(unet_repo: Path) -> None:
    with pytest.raises(ConfigError, match=r"has no option\(s\) \['bogus'\]; accepted: \['device', 'output_name'\]"):
        create_backend("torch?bogus=1", unet_repo, "unet")
    with pytest.raises(ConfigError, match="CUDA is not available"):
        create_backend("torch?device=cuda", unet_repo, "unet")
    backend = create_backend("torch?output_name=OUTPUT__0", unet_repo, "unet", device="cpu")
    assert backend.output_name == "OUTPUT__0"


def test_registration_never_silently_replaces_a_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_registry", dict(registry._registry))
    with pytest.raises(BackendSpecError, match="already registered"):
        register_backend("torch", MockBackend)
    register_backend("triton", MockBackend)  # filling a reserved scheme is allowed
    assert available_backends()["triton"].target == "monai_triton_ops.backends.mock:MockBackend"
    register_backend("torch", MockBackend, clobber=True)
    assert available_backends()["torch"].target.endswith(":MockBackend")
    with pytest.raises(TypeError):
        available_backends()["x"] = None  # type: ignore[index]


def test_a_backend_whose_package_is_missing_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_registry", dict(registry._registry))
    register_backend("fancy", "not_installed_pkg.backend:Fancy", hint="pip install fancy-backend")
    with pytest.raises(BackendUnavailableError, match="pip install fancy-backend"):
        create_backend("fancy", None, "m")
