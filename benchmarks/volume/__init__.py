"""``bench_volume.py``'s parts: the shaped link (``link.py``) and one link's server and client (``worker.py``)."""
