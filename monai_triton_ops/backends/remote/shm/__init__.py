"""System shared memory between this process and a Triton server on the same host (``shared_memory=auto|system``).

region.py   one region: a file in /dev/shm created with O_EXCL and mapped once, and its cleanup whatever
            ends the process (close, atexit, fork, leftovers of processes that died; no signal handler)
pool.py     slots for requests in flight: one region each, registered once, grown, leased to the caller's
            output views, quarantined after a request ended without its response; and open_pool, the
            choice at open between a pool and the request body
janitor.py  a watcher process that unregisters and unlinks the regions of a client that died, reaching each
            server with the client's own endpoint, TLS material and headers
"""
