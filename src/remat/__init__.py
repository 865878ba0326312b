"""remat: activation checkpointing for JAX that is measured, automatic and sublinear.

Example:
  >>> import remat
  >>> remat.Strategy("dots")
  Strategy(policy='dots', scans=None, schedule='per_step')
"""

__version__ = "0.1.0"

# --- strategies and schedules ---
from ._schedule import Binomial as Binomial
from ._schedule import Nested as Nested
from ._strategy import STRATEGY_NAMES as STRATEGY_NAMES
from ._strategy import Strategy as Strategy

from ._warnings import RematWarning as RematWarning

# --- measurement data ---
from ._measurement import Measurement as Measurement
from ._measurement import Residual as Residual
from ._measurement import Timing as Timing

# --- apply (issue 3) ---
from ._rewrite import ScanInfo as ScanInfo
from ._rewrite import apply as apply
from ._rewrite import list_scans as list_scans
from ._rewrite import rewrite_scans as rewrite_scans

# --- measure, compare, report (issue 3) ---
from ._compare import compare as compare
from ._measure import measure as measure
from ._report import Machine as Machine
from ._report import Report as Report

# --- scan, revolve (issue 4) ---
from ._revolve import Action as Action
from ._revolve import revolve_cost as revolve_cost
from ._revolve import revolve_schedule as revolve_schedule
from ._scan import scan as scan

# --- plan (issue 5) ---
from ._plan import InfeasibleBudget as InfeasibleBudget
from ._plan import Plan as Plan
from ._plan_json import load_plan as load_plan
from ._plan import plan as plan

# --- lint (issue 7) ---
from ._findings import Finding as Finding
from ._lint import lint as lint

# --- sharding, offload (issue 6) ---
from ._sharding import per_device_bytes as per_device_bytes
