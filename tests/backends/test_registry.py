"""Spec strings -> backends: the run-time choice apps and hospital IT type by hand."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from monai_triton_ops import available_backends, create_backend, register_backend
from monai_triton_ops.backends import registry
from monai_triton_ops.backends.mock import MockBackend
from monai_triton_ops.backends.registry import parse_backend_spec
from monai_triton_ops.backends.torchscript import TorchScriptBackend
from monai_triton_ops.errors import BackendSpecError, BackendUnavailableError, ConfigError, DeviceUnavailableError


def test_default_and_torch_specs_create_the_torchscript_backend(unet_repo: Path) -> None:
    assert isinstance(create_backend(None, "unet", model_repository=unet_repo), TorchScriptBackend)
    backend = create_backend(" TORCH ", "unet", model_repository=unet_repo)
    assert isinstance(backend, TorchScriptBackend)
    assert backend.device.type == "cpu"


@pytest.mark.parametrize(
    ("spec", "scheme", "urls", "options"),
    [
        ("grpc://triton.hospital.org:8001", "grpc", ("grpc://triton.hospital.org:8001",), {}),
        ("https://10.0.0.5:8443?timeout_s=3", "https", ("https://10.0.0.5:8443",), {"timeout_s": "3"}),
        ("grpc://h1:8001,h2:8001/", "grpc", ("grpc://h1:8001", "grpc://h2:8001"), {}),
        ("http://[::1]:8000", "http", ("http://[::1]:8000",), {}),
        ("torch?device=cpu", "torch", (), {"device": "cpu"}),
        ("triton", "triton", (), {}),
    ],
)
def test_specs_parse_into_scheme_urls_and_options(spec: str, scheme: str, urls: tuple, options: dict) -> None:
    parsed = parse_backend_spec(spec)
    assert (parsed.scheme, parsed.urls, dict(parsed.options)) == (scheme, urls, options)


@pytest.mark.parametrize(
    "spec", ["triton", "grpc://localhost:8001", "grpcs://h:1", "http://localhost:8000", "https://h:1"]
)
def test_backends_not_in_this_installation_say_so(spec: str, unet_repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_registry", dict(registry._registry))
    scheme = spec.split(":")[0]
    entry = registry._registry[scheme]
    registry._registry[scheme] = registry.BackendEntry(
        target="monai_triton_ops.backends.not_built_here:Backend", hint=entry.hint, takes_urls=entry.takes_urls
    )
    with pytest.raises(BackendUnavailableError, match=f"backend '{spec}' is not available yet"):
        create_backend(spec, "unet", model_repository=unet_repo)


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("tensorrt", "unknown backend spec 'tensorrt'; expected one of: torch, onnx, triton, grpc://HOST:PORT"),
        ("", "empty backend spec"),
        ("grpc://localhost", r"expected grpc://HOST:PORT"),
        ("http://:8000", r"expected http://HOST:PORT"),
        ("grpc://host:port", "invalid port"),
        ("grpc://h1:8001,", r"expected grpc://HOST:PORT\[,HOST:PORT...\], got ''"),
        ("grpc", r"expected grpc://HOST:PORT"),
        ("torch://h:1", "takes no server URL"),
        ("ftp://host:21", "unknown backend spec"),
    ],
)
def test_bad_specs_name_what_is_accepted(spec: str, match: str) -> None:
    with pytest.raises(BackendSpecError, match=match):
        parse_backend_spec(spec)


def test_query_options_are_typed_and_unknown_options_refused(unet_repo: Path) -> None:
    accepted = (
        r"accepted: device \(str\), max_in_flight \(int\), output_name \(str \| None\), timeout_s \(float \| None\)"
    )
    with pytest.raises(ConfigError, match=r"has no option\(s\) \['bogus'\]; " + accepted):
        create_backend("torch?bogus=1", "unet", model_repository=unet_repo)
    with pytest.raises(ConfigError, match=r"option max_in_flight='two' is not a int"):
        create_backend("torch?max_in_flight=two", "unet", model_repository=unet_repo)
    with pytest.raises(ConfigError, match=r"max_in_flight must be an integer >= 1"):
        create_backend("torch", "unet", model_repository=unet_repo, max_in_flight=0)
    backend = create_backend(
        "torch?output_name=OUTPUT__0&timeout_s=3", "unet", model_repository=unet_repo, device="cpu"
    )
    assert backend.options.output_name == "OUTPUT__0"
    assert backend.options.timeout_s == 3.0  # typed from the annotation, not the string '3'
    overridden = create_backend("torch?timeout_s=3&max_in_flight=4", "unet", model_repository=unet_repo, timeout_s=None)
    assert (overridden.options.timeout_s, overridden.options.max_in_flight) == (None, 4)


def test_cuda_on_a_machine_without_it_is_an_environment_error(unet_repo: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(DeviceUnavailableError, match="CUDA is not available"):
        create_backend("torch?device=cuda", "unet", model_repository=unet_repo)
    with pytest.raises(ConfigError, match="device='gpu0' is not a torch device"):
        create_backend("torch?device=gpu0", "unet", model_repository=unet_repo)


def test_registration_never_silently_replaces_a_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_registry", dict(registry._registry))
    with pytest.raises(BackendSpecError, match="already registered"):
        register_backend("torch", MockBackend)
    with pytest.raises(BackendSpecError, match=r"already registered to monai_triton_ops\.backends\.remote"):
        register_backend("grpc", MockBackend, takes_urls=True)
    register_backend("mine", MockBackend, takes_urls=True)
    assert available_backends()["mine"].target == "monai_triton_ops.backends.mock:MockBackend"
    assert parse_backend_spec("mine://h:1").urls == ("mine://h:1",)  # the entry, not a list, says it takes URLs
    register_backend("torch", MockBackend, clobber=True)
    assert available_backends()["torch"].target.endswith(":MockBackend")
    with pytest.raises(TypeError):
        available_backends()["x"] = None  # type: ignore[index]


def test_a_backend_whose_package_is_missing_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_registry", dict(registry._registry))
    register_backend("fancy", "not_installed_pkg.backend:Fancy", hint="pip install fancy-backend")
    with pytest.raises(BackendUnavailableError, match="pip install fancy-backend"):
        create_backend("fancy", "m")


def test_is_installed_tells_an_importable_backend_from_a_missing_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_registry", dict(registry._registry))
    register_backend("later", "monai_triton_ops.backends.not_built_here:Later")
    register_backend("thirdparty", "not_installed_pkg.backend:Fancy", hint="pip install fancy-backend")
    assert registry.is_installed("torch")
    assert not registry.is_installed("later")
    assert not registry.is_installed("thirdparty")
    assert not registry.is_installed("nonsense")


class _NeedsAWidget(MockBackend):
    """A third-party backend that says itself why it cannot run here."""

    @classmethod
    def availability(cls, scheme: str) -> registry.Availability:
        return registry.Availability(False, f"{scheme}: no widget on this machine")


def test_each_backend_says_whether_it_runs_here_through_the_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """A new backend joins ``monai-triton backends`` by its registration alone; the app layer knows no scheme."""
    from monai_triton_ops.app_settings import backend_statuses

    monkeypatch.setattr(registry, "_registry", dict(registry._registry))
    register_backend("widget", _NeedsAWidget)
    register_backend("plain", MockBackend)
    register_backend("absent", "not_installed_pkg.backend:Fancy", hint="pip install fancy-backend")
    assert registry.backend_availability("widget") == (False, "widget: no widget on this machine")
    assert registry.backend_availability("plain") == (True, "a third-party backend")
    runs, detail = registry.backend_availability("absent")
    assert not runs
    assert "pip install fancy-backend" in detail
    assert registry.backend_availability("torch").detail.startswith("TorchScript in the app's process")
    assert registry.backend_availability("grpcs") == (True, "TLS; needs a Triton server: grpcs://HOST:PORT")
    statuses = {s.scheme: s for s in backend_statuses()}
    assert (statuses["widget"].runs_here, statuses["widget"].detail) == (False, "widget: no widget on this machine")
    assert statuses["widget"].options == statuses["plain"].options
    assert (statuses["absent"].runs_here, statuses["absent"].options) == (False, ())
