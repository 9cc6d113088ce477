"""The remote Triton backend (``grpc://``, ``grpcs://``, ``http://``, ``https://``), one room per concern.

A request, from the contract's queue to the wire (``docs/architecture.md`` draws the whole path):

backend.py         RemoteBackend: the contract's hooks; per request (_infer), on a thread of the contract's pool
                   (client/workers.py, whose threads own HTTP clients) or the caller's over gRPC, the attempt
                   loop over the fleet bounded by the deadline and the request's cancel, with its Backoff
fleet.py           which server takes the next attempt, which are down, probing them back (health and choice)
members.py         a fleet's members: the servers its endpoints stand for and their transports (names resolved
                   again)
exchange.py        one attempt: where its tensors go (slot or body), the blocking call, outputs (leased views)
shm/               system shared memory: regions (naming, cleanup at close/exit/fork), the pool of
                   slots and leases and the choice at open, the janitor process for a client that died

and around them:

opening.py         what open builds: the fleet ready and described, how tensors travel, the exchange
health.py          is the model ready on a server, and why not (refused, loading...); the visible wait at open;
                   each server's state, and its probes off the request path
protocol.py        what a server speaks (Triton's extensions or the bare Open Inference Protocol), and so
                   where the signature comes from: the model config, or the model metadata; compared with a
                   local config.pbtxt and between servers
volume.py          mode=volume: the whole-volume model beside the network
fallback.py        fallback=torch: the model in this process when no server can take a request
options.py         RemoteOptions

How it speaks to a server is the client layer's (``monai_triton_ops/client/``): endpoints, TLS and credentials,
the status table, and the transports (gRPC over one thread-safe channel, HTTP with clients per worker thread,
each mapping its library's exceptions in one place).
"""

from .options import RemoteOptions as RemoteOptions

__all__ = ["RemoteOptions"]
