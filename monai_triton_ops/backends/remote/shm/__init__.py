"""System shared memory between this process and a Triton server on the same host (``shared_memory=auto|system``).

owner.py    the one owner of every region's life: it alone creates, registers, hands to the janitor, unregisters
            and unlinks (the pool, the exit and fork hooks, the backend's close ask it); states.py, its states
            and the moves allowed between them
region.py   one region: a file in /dev/shm created with O_EXCL and mapped once; leftovers of processes that died
pool.py     slots for requests in flight: one region each, registered once, grown, leased to the caller's
            output views, quarantined after a request ended without its response
choice.py   open_pool, the choice at open between a pool and the request body
layout.py   where a request's tensors sit in its slot
janitor.py  a watcher process that unregisters and unlinks the regions of a client that died, reaching each
            server with the client's own endpoint, TLS material and headers
"""
