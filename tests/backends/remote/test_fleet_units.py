"""The fleet's pure parts, without a server: where the servers are (spec, option, names), the gRPC channel's
arguments (pitfall C5), the options' checks, and what a probe says about an address where nothing listens."""

from __future__ import annotations

import pytest

from monai_triton_ops import create_backend
from monai_triton_ops.client.endpoints import Endpoint, addresses_of, is_name, resolve, spec_endpoints
from monai_triton_ops.client.transports.grpc import channel_args
from monai_triton_ops.errors import ConfigError, ServerUnavailableError

TWO = {"triton-headless.triton.svc": ["10.0.0.5", "10.0.0.6"], "one.example": ["10.0.0.7"]}


def lookup(host: str, port: int) -> list[str]:
    """A resolver with fixed answers: ``addresses_of`` takes the resolver as an argument, so no DNS is needed."""
    if host not in TWO:
        raise OSError(f"{host}: no such name")
    return TWO[host]


def test_the_spec_and_the_servers_option_make_one_list_of_servers() -> None:
    found = spec_endpoints(["grpc://h1:8001", "grpc://h2:8001"], ["h3:8001", "grpc://h1:8001", " h4:9 "])
    assert [e.url for e in found] == ["grpc://h1:8001", "grpc://h2:8001", "grpc://h3:8001", "grpc://h4:9"]
    backend = create_backend("http://h1:8000", "m", servers="h2:8000,h3:8000")
    assert backend.url == "http://h1:8000,http://h2:8000,http://h3:8000"  # type: ignore[attr-defined]


@pytest.mark.parametrize("entry", ["h2", "h2:port", "http://h2:8000", "h2:8000/path", ":8000"])
def test_a_servers_entry_that_is_not_host_port_of_the_specs_scheme_is_refused(entry: str) -> None:
    with pytest.raises(ConfigError, match=r"option servers: .* is not HOST:PORT"):
        create_backend("grpc://h1:8001", "m", servers=entry)


def test_a_name_with_several_addresses_is_several_servers_an_address_or_loopback_name_is_one() -> None:
    headless = addresses_of(Endpoint.parse("grpc://triton-headless.triton.svc:8001"), lookup)
    assert [(a.endpoint.url, a.label) for a in headless] == [
        ("grpc://10.0.0.5:8001", "grpc://triton-headless.triton.svc:8001 (10.0.0.5)"),
        ("grpc://10.0.0.6:8001", "grpc://triton-headless.triton.svc:8001 (10.0.0.6)"),
    ]
    for url in ("grpc://one.example:8001", "grpc://nothing.example:8001", "grpc://10.1.2.3:8001", "grpc://[::1]:8001"):
        (only,) = addresses_of(Endpoint.parse(url), lookup)
        assert (only.endpoint.url, only.label, only.balanced) == (url, url, False)  # dialled as written
    assert not is_name(Endpoint.parse("http://localhost:8000"))
    assert resolve("localhost", 8000)  # the system resolver answers for loopback


def test_a_tls_name_with_several_addresses_is_one_balanced_server() -> None:
    """Dialling an address would fail the certificate's name check: gRPC's round_robin spreads inside the channel."""
    (grpcs,) = addresses_of(Endpoint.parse("grpcs://triton-headless.triton.svc:8001"), lookup)
    assert (grpcs.endpoint.host, grpcs.balanced) == ("triton-headless.triton.svc", True)
    (https,) = addresses_of(Endpoint.parse("https://triton-headless.triton.svc:8000"), lookup)
    assert (https.endpoint.host, https.balanced) == ("triton-headless.triton.svc", False)


def test_the_grpc_channel_keeps_tritonclients_2_gb_limits_when_it_sets_its_own_arguments() -> None:
    """Pitfall C5: channel arguments replace tritonclient's defaults, whose message limits fall back to 4 MB."""
    args = dict(channel_args(None, reconnect_s=5.0))
    assert args["grpc.max_receive_message_length"] == args["grpc.max_send_message_length"] == 2**31 - 1
    assert args["grpc.max_reconnect_backoff_ms"] == 5000  # a restarted server is reconnected to within 5 s
    assert "grpc.service_config" not in args
    assert "round_robin" in str(dict(channel_args(None, balanced=True))["grpc.service_config"])


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"probe_backoff_s": 10.0}, "probe_backoff_s <= max_probe_backoff_s"),
        ({"resolve_interval_s": 0}, "resolve_interval_s must be"),
        ({"fallback": "onnx"}, "fallback"),
        ({"shared_memory": "system"}, "shared_memory=system needs one server on this host"),
    ],
)
def test_fleet_options_are_checked(options: dict[str, object], error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        create_backend("grpc://h1:8001,h2:8001", "m", **options)


@pytest.mark.parametrize("scheme", ["grpc", "http"])
def test_nothing_listening_is_told_as_connection_refused_naming_every_server(scheme: str) -> None:
    with pytest.raises(ServerUnavailableError) as caught:
        create_backend(f"{scheme}://127.0.0.1:9,127.0.0.1:7?ready_timeout_s=0.5", "m").open()
    message = str(caught.value)
    assert "was not ready on any of its 2 servers within 0.5 s (ready_timeout_s)" in message
    assert f"{scheme}://127.0.0.1:9 connection refused (nothing listens on 127.0.0.1:9)" in message
    assert f"{scheme}://127.0.0.1:7 connection refused (nothing listens on 127.0.0.1:7)" in message
