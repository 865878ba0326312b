"""`remat.compare` and `remat.Report`: tables, JSON and the Pareto plot of measured strategies.

May import `_core`, `_scan`, `_trace`, `_shard`, `_measure` and `_plan`.
"""
