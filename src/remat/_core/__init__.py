"""Configuration and helpers every stage shares: strategies, schedules, budgets, offloading,
warnings, atomic writes and dataclasses as JSON data.

Imports nothing else from `remat`.
"""
