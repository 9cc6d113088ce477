"""The remote backend against KServe's own model server (``kserve.ModelServer`` 0.21.0), over gRPC and HTTP.

KServe lists no protocol extension but takes binary HTTP tensors (``protocol.UNLISTED_BINARY``); a JSON body
must say it is JSON, or its FastAPI reads the body as bytes and refuses it. One server for the module
(``kserve.py``: its own virtualenv, made by ``make setup``).
"""

from __future__ import annotations

import io
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from monai_triton_ops import create_backend, exits
from monai_triton_ops.backends.remote import protocol
from monai_triton_ops.errors import ModelNotFoundError, ServerInternalError

from .conftest import Open
from .kserve import VERSION, KServe, running

pytestmark = pytest.mark.slow
SCHEMES = ["grpc", "http"]
TRANSPORT = {"grpc": "gRPC", "http": "HTTP"}


@pytest.fixture(scope="module")
def kserve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KServe]:
    with running(tmp_path_factory.mktemp("kserve")) as server:
        yield server


def _volume(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((2, 1, 10, 8, 6)).astype(np.float32)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_exact_over_both_transports_with_binary_tensors_and_the_run_line_names_the_server(
    kserve: KServe, open_backend: Open, scheme: str
) -> None:
    backend = open_backend(kserve.url(scheme), "seg")
    signature = backend.signature
    assert [(s.name, s.dtype, s.shape) for s in signature.inputs] == [("INPUT__0", "FP32", (-1, 1, -1, -1, -1))]
    volume = _volume(seed=0)
    np.testing.assert_array_equal(backend.infer({"INPUT__0": volume})["OUTPUT__0"], volume * 2)
    tensor = backend(torch.from_numpy(_volume(seed=1)))
    torch.testing.assert_close(tensor, torch.from_numpy(_volume(seed=1) * 2), rtol=0, atol=0)
    host = kserve.url(scheme).split("://")[1]
    assert backend.describe() == f"{scheme} (kserve {VERSION} at {host} over {TRANSPORT[scheme]}, binary tensors)"


def test_json_tensors_say_they_are_json(kserve: KServe, open_backend: Open, monkeypatch: pytest.MonkeyPatch) -> None:
    """As for a KServe before 0.14, which takes no binary tensors: a JSON body without its content type is what
    KServe 0.21 refused ("received byte inputs, but the 'inference-header-content-length' header is missing")."""
    monkeypatch.setattr(protocol, "UNLISTED_BINARY", {})
    backend = open_backend(kserve.url("http"), "seg")
    assert backend.describe().endswith(", JSON tensors)")
    volume = _volume(seed=2)
    np.testing.assert_array_equal(backend.infer({"INPUT__0": volume})["OUTPUT__0"], volume * 2)


@pytest.mark.parametrize(("scheme", "said"), [("grpc", "Internal server error"), ("http", "deliberate model error")])
def test_a_model_that_raises_is_the_server_failing_not_bad_input(
    kserve: KServe, open_backend: Open, scheme: str, said: str
) -> None:
    backend = open_backend(kserve.url(scheme), "raising")
    with pytest.raises(ServerInternalError, match=r"the server failed on the request .* its log says why") as info:
        backend.infer({"INPUT__0": _volume(seed=3)})
    assert said in str(info.value)
    stream = io.StringIO()
    assert exits.report(info.value, stream=stream) == exits.SERVER_FAILED == 4
    assert stream.getvalue().startswith(f"error: model 'raising' on {kserve.url(scheme)}: the server failed")


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_model_the_server_does_not_have_is_not_found_on_both_transports(kserve: KServe, scheme: str) -> None:
    """Not waited out as "not ready" over HTTP, where KServe answers readiness with a bare 404 and has no repository
    index to say why: its model metadata says the model is not there, as gRPC's NOT_FOUND does."""
    with pytest.raises(ModelNotFoundError, match=r"model 'nope' on .*: not found: Model with name nope does not exist"):
        create_backend(f"{kserve.url(scheme)}?ready_timeout_s=120", "nope").open()


@pytest.mark.parametrize(
    ("name", "version", "extensions", "binary"),
    [
        ("triton", "2.51.0", {"binary_tensor_data"}, True),
        ("mlserver", "1.7.1", set(), False),
        ("kserve", "0.13.0", set(), False),  # no inference-header-content-length in 0.13's data plane
        ("kserve", "0.14.0", set(), True),
        ("kserve", "0.21.0rc1", set(), True),
        ("kserve", "", set(), False),  # a version it does not say: JSON, which every release takes
    ],
)
def test_which_servers_get_binary_http_tensors(name: str, version: str, extensions: set[str], binary: bool) -> None:
    assert protocol.ServerInfo(name, version, frozenset(extensions)).binary_tensors is binary
