"""The pieces of ``benchmarks/run.py``: the paths to a model (``paths``), timing them interleaved (``timing``),
and the Markdown tables and plots made of the times (``report``)."""
