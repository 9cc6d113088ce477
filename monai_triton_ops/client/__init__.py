"""The one way this package talks to a Triton (or any Open Inference Protocol) server.

    endpoints.py    a server's URL: schemes, ``HOST:PORT``, one name standing for several servers
    credentials.py  TLS material and auth headers, secrets named by env:/file: references, redaction
    tls.py          what gRPC and HTTP are given for TLS; a handshake that says what TLS failure it is
    timeouts.py     how long a control call may take
    status.py       the one status table: every wire's failure read into one ``Status``, and the error raised
    workers.py      the thread pool whose threads own their HTTP clients (gevent is not thread-safe)
    transports/     gRPC and HTTP: the calls, each wire's exceptions mapped in one place; ``connect``
    loopback.py     stdlib-only HTTP polls of a local server starting up (no gevent, no tritonclient)

Its users: the remote backend (``backends/remote/``: attempts, fleet, health policy, shared memory), the
in-process backend (its status table), ``repo check --server`` (``repository/served.py``), the shared memory
janitor and the local server's launcher (``server/``). Importing this package imports nothing: each user
imports the modules it needs, so the in-process backend reads the status table without ``tritonclient``.
"""
