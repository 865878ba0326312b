"""Fitting the planner's linear memory model through compiled points (`calibrate` on two,
`calibrate3` on three); `remat._plan._calibrate` chooses the points.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# The memory model (fitted by `calibrate` on two compiled points) is
#   peak = base + stored_weight * (saved bytes + SLICE_WEIGHT * one step's saved bytes)
#          + transient_weight * (one step's materialised recomputed bytes)
# The backward pass of a step reads its saved values out of the stacked per-step buffers into
# buffers of its own, so one step's saved values are live twice (measured on the demo GPT:
# with every needed value saved, the memory beyond parameters, gradients and saved values is
# 18.3 MiB for 20.0 MiB of one step's saved values). Without this term the memory that the
# all-saved calibration point shows was charged to every plan, and plans that save a few
# values per step were overestimated by up to 25%.
SLICE_WEIGHT = 1.0
MAX_TRANSIENT_WEIGHT = 2.0


def calibrate(
    peak_all: float, stored_all: float, peak_none: float, stored_none: float, transient: float
) -> tuple[float, float, float]:
    """Fits ``peak = base + stored_weight * stored + transient_weight * transient``.

    Two compiled points: every needed value saved (``stored_all``, no transient) and nothing
    saved (``stored_none`` and ``transient``). With ``stored_weight = 1`` the two give
    ``base`` and ``transient_weight``; when that weight falls outside ``[0, 2]`` it is clamped
    and ``stored_weight`` is fitted instead. (A weight above 1 is real: XLA keeps transposed
    copies of some recomputed values for the weight-gradient matmuls.)

    Returns:
      ``(base, stored_weight, transient_weight)``.

    Example:
      >>> from remat._plan._fit import calibrate
      >>> calibrate(peak_all=100, stored_all=80, peak_none=40, stored_none=10, transient=20)
      (20.0, 1.0, 0.5)
      >>> [round(x, 3) for x in calibrate(100, 80, peak_none=20, stored_none=10, transient=20)]
      [8.571, 1.143, 0.0]
    """
    base = peak_all - stored_all
    weight = (peak_none - base - stored_none) / transient if transient else 1.0
    if 0.0 <= weight <= MAX_TRANSIENT_WEIGHT or stored_all == stored_none:
        return float(base), 1.0, float(min(max(weight, 0.0), MAX_TRANSIENT_WEIGHT))
    weight = 0.0 if weight < 0 else MAX_TRANSIENT_WEIGHT
    # peak_all = base + s * stored_all;  peak_none = base + s * stored_none + weight * transient
    s = (peak_all - peak_none + weight * transient) / (stored_all - stored_none)
    s = max(s, 0.0)
    return float(peak_all - s * stored_all), float(s), weight


def calibrate3(points: Sequence[tuple[Any, float]]) -> tuple[float, float, float, float] | None:
    """Fits ``peak = base + stored + slice_weight * sliced + transient_weight * transient``
    exactly through three compiled points (`Choice`, measured peak).

    When the exact fit gives a slice weight above ``MAX_TRANSIENT_WEIGHT`` (a scan whose
    every step keeps more than its saved values, e.g. float32 copies of bfloat16 ones: the
    excess grows with the bytes stored), ``peak = base + stored_weight * stored + sliced +
    transient_weight * transient`` is fitted exactly instead. Otherwise, or when that fit
    fails, a slice weight outside ``[0, MAX_TRANSIENT_WEIGHT]`` is clamped to that range and
    ``base`` and ``transient_weight`` are fitted to the three points by least squares.

    Returns ``(base, stored_weight, slice_weight, transient_weight)``, or None when the three
    points do not determine it or the transient weight falls outside
    ``[0, MAX_TRANSIENT_WEIGHT]``.

    Example:
      >>> from remat._plan._fit import calibrate3
      >>> from remat._plan._options import Choice
      >>> c = lambda s, sl, t: Choice({}, (), 0.0, 0.0, stored=s, sliced=sl, transient=t)
      >>> # base 10, slice weight 0.5, transient weight 1.5:
      >>> calibrate3([(c(80, 10, 0), 95.0), (c(8, 1, 20), 48.5), (c(40, 5, 4), 58.5)])
      (10.0, 1.0, 0.5, 1.5)
      >>> # base 10, stored weight 1.25, transient weight 0.5 (a slice weight of 3.5 exactly):
      >>> calibrate3([(c(80, 10, 0), 120.0), (c(8, 1, 20), 31.0), (c(40, 5, 4), 67.0)])
      (10.0, 1.25, 1.0, 0.5)
    """
    import numpy as np

    a = np.array([[1.0, c.sliced, c.transient] for c, _ in points])
    b = np.array([peak - c.stored for c, peak in points])
    if abs(np.linalg.det(a)) < 1e-6 * max(1.0, float(np.abs(a).max()) ** 2):
        return None
    base, slice_weight, weight = (float(round(v, 9)) for v in np.linalg.solve(a, b))
    if slice_weight > MAX_TRANSIENT_WEIGHT:
        scaled = _stored_fit(points)
        if scaled is not None:
            return scaled
    if not 0.0 <= slice_weight <= MAX_TRANSIENT_WEIGHT:
        slice_weight = min(max(slice_weight, 0.0), MAX_TRANSIENT_WEIGHT)
        rest = b - slice_weight * a[:, 1]
        (base, weight), *_ = np.linalg.lstsq(a[:, [0, 2]], rest, rcond=None)
        base, weight = float(base), float(weight)
    if not 0.0 <= weight <= MAX_TRANSIENT_WEIGHT:
        return None
    return base, 1.0, slice_weight, weight


def _stored_fit(points: Sequence[tuple[Any, float]]) -> tuple[float, float, float, float] | None:
    """``peak = base + stored_weight * stored + SLICE_WEIGHT * sliced + weight * transient``
    exactly through three points (see `calibrate3`), or None when it does not hold."""
    import numpy as np

    a = np.array([[1.0, c.stored, c.transient] for c, _ in points])
    b = np.array([peak - SLICE_WEIGHT * c.sliced for c, peak in points])
    if abs(np.linalg.det(a)) < 1e-6 * max(1.0, float(np.abs(a).max()) ** 2):
        return None
    base, stored, weight = (float(round(v, 9)) for v in np.linalg.solve(a, b))
    if stored < 0 or not 0.0 <= weight <= MAX_TRANSIENT_WEIGHT:
        return None
    return base, stored, SLICE_WEIGHT, weight
