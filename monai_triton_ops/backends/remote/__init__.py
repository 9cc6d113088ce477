"""The remote Triton backend (``grpc://``, ``grpcs://``, ``http://``, ``https://``), one module per concern.

A request, from the base's ``submit()`` to the wire, passes four of them (``docs/remote.md``):

backend.py         RemoteBackend: open (readiness, signature, shared memory choice); per request, on a worker,
                   the attempt loop bounded by the deadline; close
exchange.py        one attempt: where its tensors go (slot or body), the blocking call, outputs (leased views)
grpc_transport.py  tritonclient gRPC: one thread-safe client, blocking calls, a deadline on each
http_transport.py  tritonclient HTTP: one client per worker thread (gevent is not thread-safe)

and around them:

workers.py         the one worker pool: threads that run whole requests and own per-thread clients
transport.py       the neutral transport interface, and the request builder both protocols share
endpoints.py       where the servers are (Endpoint), how to reach them (TransportSettings, connect)
credentials.py     TLS material and auth headers, secrets named by env:/file: references, redaction
tls.py             what gRPC and HTTP are given for TLS; a handshake at open that says what TLS failure it is
protocol.py        what a server speaks (Triton's extensions or the bare Open Inference Protocol), and so
                   where the signature comes from: the model config, or the model metadata
shm.py, pool.py    system shared memory regions: naming, cleanup at close/exit/SIGTERM/fork; slots and leases
janitor.py         a watcher process that cleans up the regions of a client that died
server_model.py    readiness within one deadline, the signature from a Triton server's model config
translate.py       tritonclient errors -> status -> this package's errors, by status code
retry.py           bounded exponential backoff inside the deadline
options.py         RemoteOptions
"""

from .options import RemoteOptions as RemoteOptions

__all__ = ["RemoteOptions"]
