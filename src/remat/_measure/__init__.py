"""Compiling and measuring a gradient step: `remat.Measurement`, peak memory from XLA's
memory analysis, FLOPs from the optimised HLO, and saved residuals.

May import `_core`, `_scan`, `_trace` and `_shard`.
"""
