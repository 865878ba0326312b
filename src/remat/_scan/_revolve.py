"""Binomial checkpointing: the Revolve schedule for reversing ``n`` steps with ``s`` snapshots.

The problem (Griewank 1992): a program is a chain of ``n`` steps ``x_{i+1} = F_i(x_i)``, and
its reverse pass needs the input ``x_i`` of every step, last step first. Storing all of them
costs ``n`` carries; storing none costs ``n(n-1)/2`` recomputed steps. With room for ``s``
carries besides the initial one, the fewest recomputed steps ("advances") is

    A(1, s) = 0
    A(n, 0) = n(n-1)/2                      (restart from x_0 before every reversal)
    A(n, s) = min over 1 <= m < n of  m + A(n-m, s-1) + A(m, s)

(advance ``m`` steps and store ``x_m``; reverse the last ``n-m`` steps with one slot fewer,
since ``x_m`` occupies one; then free that slot and reverse the first ``m`` steps from
``x_0``). Griewank's closed form: with ``c = s + 1`` checkpoints (the initial carry counts)
and ``beta(c, t) = C(c + t, c)`` the number of steps that can be reversed when every step
is advanced at most ``t`` times, let ``t`` be the least integer with ``beta(c, t) >= n``
(the *repetition number*); then

    A(n, s) = t*n - C(c + t, t - 1).

``A(., s)`` is piecewise linear and convex in ``n``, with slope ``t(n)``:
``A(n, s) - A(n-1, s) = t(n, c)``. Hence the cost of a first split at ``m`` is convex in
``m`` with forward difference ``1 + t(m+1, c) - t(n-m, c-1)``, and the smallest optimal
``m`` is the first where that difference is not negative: a binary search, so a schedule
of ``n`` steps takes ``O(n log n)`` time to write down, not the ``O(n^2 s)`` of the
recurrence. This is the offline ("Revolve") variant: it needs ``n`` in advance, which a
scan provides.

References:
  A. Griewank, "Achieving logarithmic growth of temporal and spatial complexity in reverse
  automatic differentiation", Optimization Methods and Software 1(1), 1992.
  A. Griewank and A. Walther, "Algorithm 799: Revolve: an implementation of checkpointing
  for the reverse or adjoint mode of computational differentiation", ACM TOMS 26(1), 2000.
"""

from __future__ import annotations

import math
from typing import Literal

Action = tuple[Literal["advance", "store", "restore", "reverse"], int]

_BAD_N = "`{where}` got n={got!r}; expected an int >= 1 (the number of steps to reverse)."
_BAD_SNAPSHOTS = (
    "`{where}` got snapshots={got!r}; expected an int >= 0 (the number of stored carries "
    "besides the initial one), e.g. snapshots=8."
)


def _check(n: object, snapshots: object, where: str) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(_BAD_N.format(where=where, got=n))
    if not isinstance(snapshots, int) or isinstance(snapshots, bool) or snapshots < 0:
        raise ValueError(_BAD_SNAPSHOTS.format(where=where, got=snapshots))


def _repetitions(n: int, c: int) -> int:
    """The least ``t`` with ``C(c + t, c) >= n``: how often the busiest step is advanced."""
    t, beta = 0, 1
    while beta < n:
        t += 1
        beta = beta * (c + t) // t  # C(c+t, c) from C(c+t-1, c)
    return t


def revolve_cost(n: int, snapshots: int) -> int:
    """The fewest step advances needed to reverse ``n`` steps with ``snapshots`` free slots.

    Griewank's closed form ``t*n - C(c+t, t-1)`` with ``c = snapshots + 1`` and ``t`` the
    repetition number; equal to the recurrence in this module's docstring. The advances
    exclude the one forward evaluation inside each step's reversal.

    Args:
      n: number of steps (``>= 1``).
      snapshots: stored carries allowed besides the initial one (``>= 0``).

    Returns:
      The number of steps advanced by `revolve_schedule` ``(n, snapshots)``.

    Raises:
      ValueError: if ``n < 1`` or ``snapshots < 0``.

    Example:
      >>> import remat
      >>> remat.revolve_cost(10, 0)  # 0 + 1 + ... + 9
      45
      >>> remat.revolve_cost(10, 9)  # every carry stored: one forward sweep of 9 steps
      9
      >>> remat.revolve_cost(1000, 8)
      3999
    """
    _check(n, snapshots, "remat.revolve_cost")
    c = snapshots + 1
    t = _repetitions(n, c)
    return t * n - (math.comb(c + t, t - 1) if t >= 1 else 0)


def _split(n: int, c: int) -> int:
    """The smallest optimal first advance ``m`` for ``n`` steps and ``c >= 2`` checkpoints."""
    lo, hi = 1, n - 1  # answer in [lo, hi]; D(m) = 1 + t(m+1, c) - t(n-m, c-1) is monotone
    while lo < hi:
        mid = (lo + hi) // 2
        if 1 + _repetitions(mid + 1, c) - _repetitions(n - mid, c - 1) >= 0:
            hi = mid
        else:
            lo = mid + 1
    return lo


def revolve_schedule(n: int, snapshots: int) -> tuple[Action, ...]:
    """The optimal (binomial, "Revolve") schedule that reverses ``n`` steps.

    Slot 0 always holds the initial carry (index 0) and is not counted; slots
    ``1..snapshots`` are free. The current carry starts as index 0. Actions:

    - ``("advance", k)``: apply ``k >= 1`` steps to the current carry (index ``i -> i + k``);
    - ``("store", j)``: copy the current carry into slot ``j`` (``1 <= j <= snapshots``);
    - ``("restore", j)``: make the carry in slot ``j`` (``0 <= j <= snapshots``) current;
    - ``("reverse", i)``: back-propagate through step ``i``; the current carry is step
      ``i``'s input. Steps are reversed in the order ``n-1, ..., 0``.

    The actions before the first ``reverse`` are advances and stores only: a forward sweep
    of ``n - 1`` steps that a forward pass can perform while it computes the result. The
    advance counts sum to `revolve_cost` ``(n, snapshots)``, the minimum possible.

    Args:
      n: number of steps (``>= 1``).
      snapshots: free slots besides slot 0 (``>= 0``).

    Returns:
      A tuple of ``(kind, arg)`` actions.

    Raises:
      ValueError: if ``n < 1`` or ``snapshots < 0``.

    Example:
      >>> import remat
      >>> remat.revolve_schedule(3, 1)  # doctest: +NORMALIZE_WHITESPACE
      (('advance', 1), ('store', 1), ('advance', 1), ('reverse', 2), ('restore', 1),
       ('reverse', 1), ('restore', 0), ('reverse', 0))
    """
    _check(n, snapshots, "remat.revolve_schedule")
    actions: list[Action] = []
    current = 0  # index of the current carry
    free = list(range(snapshots, 0, -1))  # free slots; pop() gives the lowest
    # Work items: ("reverse", base, slot, length) reverses steps base..base+length-1 starting
    # from the carry ``base`` held in ``slot``; ("free", slot) returns a slot to the pool.
    work: list[tuple] = [("reverse", 0, 0, n)]
    while work:
        item = work.pop()
        if item[0] == "free":
            free.append(item[1])
            free.sort(reverse=True)
            continue
        _, base, slot, length = item
        if current != base:
            actions.append(("restore", slot))
            current = base
        if length == 1:
            actions.append(("reverse", base))
        elif not free:
            # No free slot: restart from ``base`` before every reversal, A(n, 0) = n(n-1)/2.
            for i in range(length - 1, -1, -1):
                if current != base:
                    actions.append(("restore", slot))
                    current = base
                if i:
                    actions.append(("advance", i))
                    current = base + i
                actions.append(("reverse", base + i))
        else:
            m = _split(length, len(free) + 1)
            j = free.pop()
            actions.append(("advance", m))
            actions.append(("store", j))
            current = base + m
            # Run order: the right part, then free slot j, then the left part.
            work.append(("reverse", base, slot, m))
            work.append(("free", j))
            work.append(("reverse", base + m, j, length - m))
    return tuple(actions)
