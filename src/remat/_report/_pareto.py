"""The Pareto front of measured strategies (peak memory against FLOPs or time), shared by the
report's table and its plot."""

from __future__ import annotations

from collections.abc import Sequence


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points that no other point dominates (both coordinates minimised).

    A point dominates another when it is no worse in both coordinates and better in one;
    equal points do not dominate each other, so all copies of a front point are on it.

    Example:
      >>> from remat._report._pareto import pareto_front
      >>> pareto_front([(1, 9), (2, 5), (3, 6), (4, 1), (2, 5)])
      [0, 1, 3, 4]
    """
    front = []
    for i, (x, y) in enumerate(points):
        dominated = any(
            (u <= x and v <= y) and (u < x or v < y) for j, (u, v) in enumerate(points) if j != i
        )
        if not dominated:
            front.append(i)
    return front
