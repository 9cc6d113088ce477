"""Files copied verbatim into a model repository; ``model.py`` is the Python-backend TorchScript runner."""
