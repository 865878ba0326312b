"""`remat.plan`: the cost model, the MILP and its options, calibration, the verification
rounds, `remat.Plan` and its JSON form.

May import `_core`, `_scan`, `_trace`, `_shard` and `_measure`.
"""
