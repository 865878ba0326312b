"""Sharded programs: shardings of arguments and outputs, and per-device bytes of values and
residuals. May import `_core`, `_scan` and `_trace`.
"""
