"""A client of a fleet behind one name, in a process of its own.

    python -m tests.backends.remote.fleet_child SPEC MODEL
    python -m tests.backends.remote.fleet_child balanced grpc://NAME:PORT MODEL

The test runs it under ``unshare -m`` with its own ``/etc/hosts`` bind-mounted, so the name in ``SPEC``
resolves to several loopback addresses through the system's real resolver, as a headless Service's name
does, without touching the machine's file. It opens the backend, prints ``ready <servers>``, then sends
requests one after another and checks every answer until a line ``stop`` arrives on stdin, and prints
``done <summary>`` (JSON: sent, answered, wrong, errors, servers and their states).

``balanced``: the channel a TLS name with several addresses gets (gRPC's ``round_robin``), here over the
plaintext name, one request that connects every address, then 40 straight through the transport; prints
``done <answered>``.
"""

from __future__ import annotations

import json
import sys
import threading
import time

import numpy as np

from monai_triton_ops import create_backend


def main(spec: str, model: str) -> int:
    backend = create_backend(spec, model).open()
    print("ready", json.dumps(backend.servers), flush=True)  # type: ignore[attr-defined]
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
    sent = answered = wrong = 0
    errors: list[str] = []
    while not stop.is_set():
        sent += 1
        x = np.arange(16, dtype=np.float32) + sent
        try:
            out = backend.infer({"INPUT__0": x}, timeout_s=30)["OUTPUT__0"]
        except Exception as exc:  # the summary carries it: the test asserts there is none
            errors.append(f"{type(exc).__name__}: {exc}")
            continue
        answered += 1
        wrong += int(not np.array_equal(out, x))
    summary = {"sent": sent, "answered": answered, "wrong": wrong, "errors": errors[:5], "servers": backend.servers}  # type: ignore[attr-defined]
    backend.close()
    print("done", json.dumps(summary), flush=True)
    return 0


def balanced(url: str, model: str) -> int:
    from monai_triton_ops.client.endpoints import Endpoint
    from monai_triton_ops.client.transports.base import TransportSettings, WireInput, WireOutput
    from monai_triton_ops.client.transports.grpc import GrpcTransport

    transport = GrpcTransport(Endpoint.parse(url), TransportSettings(), balanced=True)
    x = np.arange(16, dtype=np.float32)
    first = [WireInput("INPUT__0", "FP32", x.shape, data=x)]
    transport.infer(model, "", first, [WireOutput("OUTPUT__0")], timeout_s=30)
    time.sleep(0.5)  # the first call connects every address; round robin only picks those already connected
    answered = 0
    for i in range(40):
        x = np.arange(16, dtype=np.float32) + i
        result = transport.infer(
            model, "", [WireInput("INPUT__0", "FP32", x.shape, data=x)], [WireOutput("OUTPUT__0")], timeout_s=30
        )
        answered += int(np.array_equal(result.array("OUTPUT__0"), x))
    transport.close()
    print("done", answered, flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "balanced":
        sys.exit(balanced(*sys.argv[2:4]))
    sys.exit(main(*sys.argv[1:3]))
