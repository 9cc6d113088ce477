"""The ``triton`` backend: Triton's core loaded into this process through ``bindings/``.

``backend`` (``InProcessBackend``: one model's requests), ``server`` (``InProcessServer``: the server's whole life),
``settings`` (what the server is started with), ``shared`` (which backends hold the process's one server),
``stubs`` (the Python backend's stubs as only this process sees them). Nothing is imported here: the registry
names ``backend`` lazily, and the server's owner imports without torch (``server`` and ``settings`` need only the
binding).
"""
