"""The remote Triton backend (``grpc://``, ``grpcs://``, ``http://``, ``https://``), one module per concern.

A request, from the base's ``submit()`` to the wire, passes five of them (``docs/remote.md``):

backend.py         RemoteBackend: open (readiness, signature, shared memory choice); per request, on a worker,
                   the attempt loop over the fleet bounded by the deadline; close
fleet.py           the servers: which one takes the next attempt, which are down, a mixed fleet refused
exchange.py        one attempt: where its tensors go (slot or body), the blocking call, outputs (leased views)
transports/        tritonclient gRPC (one thread-safe client) and HTTP (one client per worker thread), TLS and
                   credentials, the tensor codec, and connect(): the transport for one endpoint

and around them:

workers.py         the one worker pool: threads that run whole requests and own per-thread clients
endpoints.py       where the servers are (Endpoint, a name's addresses)
health.py          is the model ready on a server, and why not (refused, loading...); the visible wait at open;
                   each server's state, and its probes off the request path
fallback.py        fallback=torch: the model in this process when no server can take a request
protocol.py        what a server speaks (Triton's extensions or the bare Open Inference Protocol), and so
                   where the signature comes from: the model config, or the model metadata; compared with a
                   local config.pbtxt and between servers
shm/               system shared memory: regions (naming, cleanup at close/exit/SIGTERM/fork), the pool of
                   slots and leases and the choice at open, the janitor process for a client that died
options.py         RemoteOptions
"""

from .options import RemoteOptions as RemoteOptions

__all__ = ["RemoteOptions"]
