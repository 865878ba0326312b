"""remat: activation checkpointing for JAX that is measured, automatic and sublinear.

Example:
  >>> import remat
  >>> remat.Strategy("dots")
  Strategy(policy='dots', scans=None, schedule='per_step')
"""

__version__ = "0.1.0"

# --- strategies and schedules ---
from ._core._schedule import Binomial as Binomial
from ._core._schedule import Nested as Nested
from ._core._strategy import STRATEGY_NAMES as STRATEGY_NAMES
from ._core._strategy import Strategy as Strategy
from ._core._warnings import RematWarning as RematWarning

# --- scan schedules, revolve ---
from ._scan._revolve import Action as Action
from ._scan._revolve import revolve_cost as revolve_cost
from ._scan._revolve import revolve_schedule as revolve_schedule
from ._scan._scan import scan as scan

# --- apply ---
from ._trace._rewrite import ScanInfo as ScanInfo
from ._plan._apply import apply as apply
from ._trace._rewrite import list_scans as list_scans
from ._trace._rewrite import rewrite_scans as rewrite_scans

# --- sharding, compile targets ---
from ._shard._sharding import per_device_bytes as per_device_bytes
from ._shard._target import Target as Target
from ._shard._target import parse_target as parse_target

# --- measure ---
from ._measure._measurement import Measurement as Measurement
from ._measure._measurement import Residual as Residual
from ._measure._measurement import Timing as Timing
from ._measure._measure import measure as measure
from ._measure._memory import LiveValue as LiveValue
from ._measure._memory import MemoryView as MemoryView

# --- plan ---
from ._plan._json import load_plan as load_plan
from ._plan._plan import plan as plan
from ._plan._plan import plan_budgets as plan_budgets
from ._plan._result import InfeasibleBudget as InfeasibleBudget
from ._plan._result import Plan as Plan

# --- compare, report ---
from ._report._compare import compare as compare
from ._report._memory import memory as memory
from ._report._memory_plot import plot_memory as plot_memory
from ._report._report import Machine as Machine
from ._report._report import Report as Report

# --- lint ---
from ._lint._findings import Finding as Finding
from ._lint._lint import lint as lint

__all__ = [
    "STRATEGY_NAMES",
    "Action",
    "Binomial",
    "Finding",
    "InfeasibleBudget",
    "LiveValue",
    "Machine",
    "Measurement",
    "MemoryView",
    "Nested",
    "Plan",
    "RematWarning",
    "Report",
    "Residual",
    "ScanInfo",
    "Strategy",
    "Target",
    "Timing",
    "apply",
    "compare",
    "lint",
    "list_scans",
    "load_plan",
    "measure",
    "memory",
    "parse_target",
    "per_device_bytes",
    "plan",
    "plan_budgets",
    "plot_memory",
    "revolve_cost",
    "revolve_schedule",
    "rewrite_scans",
    "scan",
]
