"""The remote Triton backend (``grpc://``, ``grpcs://``, ``http://``, ``https://``), one module per concern.

backend.py         RemoteBackend: open (readiness, signature, shared memory choice), submit, close
calls.py           one request: where its tensors go, attempts and retries, results copied out once
grpc_transport.py  tritonclient gRPC, async API, a deadline on every call
http_transport.py  tritonclient HTTP, one client per worker thread (gevent is not thread-safe)
shm.py, pool.py    system shared memory regions: naming, cleanup at close/exit/SIGTERM/fork; slots
server_model.py    readiness within one deadline, signature from the server's config
translate.py       tritonclient errors -> status -> this package's errors, by status code
retry.py           bounded exponential backoff inside the deadline
options.py         RemoteOptions
"""

from .options import RemoteOptions as RemoteOptions

__all__ = ["RemoteOptions"]
