"""A client process for the multi-process tests: ``python -m tests.backends.remote.child MODE SPEC MODEL [OPTIONS]``.

``OPTIONS`` is a JSON object of backend options (TLS files, ``env:`` references to keys), default none.

``loop``   open, print ``ready default <regions>``, then infer until killed (the SIGTERM test)
``hold``   open, infer, print ``ready <regions>``, then wait for stdin to end (killed first: the SIGKILL test)
``host-before`` / ``host-after``  a host program's own SIGTERM handler (prints ``host handler ran``, then
           ``os._exit(7)``: no cleanup of ours runs), installed before or after the backend opens; prints
           ``ready <handler> <regions>`` (whose handler SIGTERM has then: host, default) and infers until killed
``run``    open, 200 exact requests, print ``regions <names>``, close
``fork``   open, infer, fork: the child opens its own backend and infers, the parent infers again after it
``stuck``  open, infer, then close while every unregister call fails (the server refusing "in use", which a
           test cannot time for real), print ``closed <regions>`` and exit 0: the janitor must clean up
"""

from __future__ import annotations

import json
import os
import signal
import sys

import numpy as np

from monai_triton_ops import create_backend
from monai_triton_ops.backends.remote.shm import region as shm
from monai_triton_ops.backends.remote.shm.owner import owner


def _check(backend, value: float) -> None:  # type: ignore[no-untyped-def]
    rank = len(backend.signature.inputs[0].shape)  # an identity model of one or two dims
    x = np.full((1,) * (rank - 1) + (64,), value, np.float32)
    out = backend.infer({"INPUT__0": x})["OUTPUT__0"]
    if not np.array_equal(out, x):
        raise SystemExit(f"wrong result for {value}")


def _host_handler(signum: int, frame: object) -> None:
    print("host handler ran", flush=True)
    os._exit(7)


def main(mode: str, spec: str, model: str, options: str = "{}") -> int:
    if mode == "host-before":
        signal.signal(signal.SIGTERM, _host_handler)
    backend = create_backend(spec, model, **json.loads(options)).open()
    _check(backend, 1.0)
    if mode == "host-after":
        unchanged = signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        signal.signal(signal.SIGTERM, _host_handler)
        print("default before the host's" if unchanged else "changed by the library", flush=True)
    if mode == "hold":
        print("ready", json.dumps(owner.names()), flush=True)
        sys.stdin.read()
        return 0
    if mode in ("loop", "host-before", "host-after"):
        handler = signal.getsignal(signal.SIGTERM)
        who = "host" if handler is _host_handler else "default" if handler is signal.SIG_DFL else repr(handler)
        print("ready", who, json.dumps(owner.names()), flush=True)
        i = 0
        while True:
            i += 1
            _check(backend, float(i))
    if mode == "run":
        for i in range(200):
            _check(backend, float(i))
        print("regions", json.dumps(owner.names()), flush=True)
        backend.close()
        return 0
    if mode == "fork":
        mine = owner.names()
        pid = os.fork()
        if pid == 0:
            try:
                with create_backend(spec, model) as other:
                    _check(other, 2.0)
            except BaseException as exc:  # report, never run the parent's code in the child
                print(f"child failed: {exc!r}", flush=True)
                os._exit(1)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        _check(backend, 3.0)
        alive = all((shm.SHM_DIR / name).exists() for name in mine)
        print("fork", os.waitstatus_to_exitcode(status), "parent regions intact" if alive else "parent regions gone")
        backend.close()
        return 0
    if mode == "stuck":
        mine = owner.names()
        transport = backend._fleet.members.only_server().transport  # type: ignore[attr-defined]

        def refuse(name: str, *, timeout_s: float) -> None:
            raise RuntimeError(f"shared memory region '{name}' is currently in use (simulated)")

        transport.unregister_system_shm = refuse
        backend.close(timeout_s=2)  # retried until then, then handed to the janitor
        print("closed", json.dumps(mine), flush=True)
        return 0
    raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
