"""`remat.scan` and its schedules (``per_step``, `remat.Nested`, `remat.Binomial`) and the
Revolve schedule of binomial checkpointing.

May import `_core`.
"""
