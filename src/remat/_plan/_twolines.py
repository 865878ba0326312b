"""A mix's scan-alone memory as the larger of two lines, from memories learnt per save set.

A per-layer mix runs the ``L - c`` layers saving set ``b`` (less), then the ``c`` saving set
``a`` (more), as two segments (`remat._plan._perlayer`). Its backward pass starts with every
layer's saved values live and differentiates an ``a`` layer beside them; when it reaches the
first run, the ``a`` layers' values are gone and a ``b`` layer is differentiated beside the
``b`` layers' values. With ``S`` a set's bytes saved per layer and ``U`` the scan-alone
memory of the set in every layer as segments (one run), the mix keeps the larger of

    U_a - (L - c) * (S_a - S_b)     and     U_b - c * S_b,

which is not the line through the two sets (`_alone.priced_mix`'s): a mix can keep less than
either set in every layer. Every mix whose last run has two layers or more that
`benchmarks/perlayer_predict.py` compiles alone (on the fronts of the vs_torch GPT and MLP
stack) is this larger line to within 20 KiB, where the line through the two sets is off by
up to 7.62 MiB. A last run of one layer is not: XLA inlines a loop of one step, so such
mixes are neither priced nor used to price (`lone_last`).

``U`` is learnt per save set, so one mix compiled alone tells about every mix sharing a set
with it: a one-run program gives its set's ``U``; a mix gives upper bounds on both its sets'
(each line is at most the mix's memory), and the exact ``U`` of one set where the other's
line is known to lie below the mix's memory (`learnt`). A mix whose two sets are known is
priced (`exact`); one with a single set known has that line as a floor (`least`), enough to
know it is over the budget without a compile.
"""

from __future__ import annotations

from typing import Any

# A set's line lies below a mix's memory (so the other set's line is the mix's) when it does
# by more than this fraction of that memory: the larger line matched the compiles to 20 KiB.
BELOW = 1e-3
# A mix is priced where its floor and ceiling are this close (the same line, learnt twice).
MEET = 1e-6


def _runs(pattern) -> list[tuple[Any, int]]:
    """``pattern`` (a save set per layer) as its runs: ``[(set, layers), ...]``."""
    runs: list[tuple[Any, int]] = []
    for saved in pattern:
        if runs and runs[-1][0] == saved:
            runs[-1] = (saved, runs[-1][1] + 1)
        else:
            runs.append((saved, 1))
    return runs


def lone_last(pattern) -> bool:
    """Whether ``pattern`` has more than one run and its last run is a single layer (a loop of
    one step, which XLA inlines: see the module docstring)."""
    runs = _runs(pattern)
    return len(runs) > 1 and runs[-1][1] == 1


def _mix_of(pattern):
    """``(b, a, c)`` for a pattern of two runs whose last has two layers or more, ``(a, a, L)``
    for one run, else None."""
    runs = _runs(pattern)
    if len(runs) == 1:
        return runs[0][0], runs[0][0], runs[0][1]
    if len(runs) == 2 and runs[1][1] >= 2:
        return runs[0][0], runs[1][0], runs[1][1]
    return None


class Sets:
    """What the scan-alone programs compiled so far tell about each save set of one scan: its
    bytes saved per layer (``step``), the exact ``U`` where learnt (``exact``) and upper bounds
    (``upper``); see the module docstring.

    Example (a scan of 4 layers; sets ``a`` saving 3 bytes a layer, ``b`` 1):
      >>> from remat._plan._twolines import Sets
      >>> sets = Sets(4, {"a": 3.0, "b": 1.0})
      >>> sets.learn(("a",) * 4, 20.0)  # set a in every layer: U_a = 20
      >>> sets.bounds(("b", "b", "a", "a"))  # max(20 - 2 * 2, U_b - 2), U_b unknown: a floor
      (16.0, None)
      >>> sets.learn(("b",) * 4, 19.0)  # U_b = 19
      >>> sets.price(("b", "b", "a", "a")), sets.price(("b", "a", "a", "a"))
      (17.0, 18.0)
      >>> sets.price(("b", "b", "b", "a")) is None  # a lone last layer: not priced
      True

      The same from two mixes: each bounds both sets' U from above (each line is at most
      its memory), and where one line is then surely below, the other is the memory.

      >>> mixed = Sets(4, {"a": 3.0, "b": 1.0})
      >>> mixed.learn(("b", "b", "a", "a"), 17.0)
      >>> mixed.exact, mixed.upper
      ({'a': None, 'b': None}, {'a': 21.0, 'b': 19.0})
      >>> mixed.learn(("b", "a", "a", "a"), 18.0)
      >>> mixed.exact
      {'a': 20.0, 'b': 19.0}
    """

    def __init__(self, length: int, step: dict) -> None:
        self.length = length
        self.step = dict(step)
        self.exact: dict = dict.fromkeys(step)
        self.upper: dict = dict.fromkeys(step)
        self.mixes: list[tuple[Any, Any, int, float]] = []

    def learn(self, pattern, memory: float) -> None:
        """Records a scan-alone program of ``pattern`` (a save set per layer) compiled alone
        and keeping ``memory``, and what follows from it."""
        mix = _mix_of(pattern)
        if mix is None or len(pattern) != self.length:
            return
        b, a, c = mix
        if b == a:
            self.exact[a] = self.upper[a] = float(memory)
        else:
            self.mixes.append((b, a, c, float(memory)))
        self._settle()

    def _lines(self, b, a, c, u_a, u_b) -> tuple[float | None, float | None]:
        L, s_a, s_b = self.length, self.step[a], self.step[b]
        line_a = None if u_a is None else u_a - (L - c) * (s_a - s_b)
        line_b = None if u_b is None else u_b - c * s_b
        return line_a, line_b

    def _settle(self) -> None:
        changed = True
        while changed:
            changed = False
            for b, a, c, memory in self.mixes:
                # Each line is at most the mix's memory: upper bounds on both sets' U.
                for s, bound in ((a, memory + (self.length - c) * (self.step[a] - self.step[b])),
                                 (b, memory + c * self.step[b])):  # fmt: skip
                    if self.upper[s] is None or bound < self.upper[s] - 1e-6:
                        self.upper[s] = bound
                        changed = True
                line_a, line_b = self._lines(b, a, c, self.upper[a], self.upper[b])
                # One set's line surely below the memory: the other's line is the memory.
                if line_b is not None and line_b < memory * (1 - BELOW) and self.exact[a] is None:
                    self.exact[a] = memory + (self.length - c) * (self.step[a] - self.step[b])
                    changed = True
                if line_a is not None and line_a < memory * (1 - BELOW) and self.exact[b] is None:
                    self.exact[b] = memory + c * self.step[b]
                    changed = True
            for s, u in self.exact.items():
                if u is not None and (self.upper[s] is None or u < self.upper[s]):
                    self.upper[s] = u

    def price(self, pattern) -> float | None:
        """The memory of ``pattern`` where its floor and ceiling meet (`bounds`), else None."""
        low, high = self.bounds(pattern)
        if low is None or high is None or abs(high - low) > MEET * high:
            return None  # unknown, or what was learnt disagrees with itself
        return high

    def bounds(self, pattern) -> tuple[float | None, float | None]:
        """``(floor, ceiling)`` of ``pattern``'s memory (either None where unknown)."""
        mix = _mix_of(pattern)
        if mix is None or len(pattern) != self.length:
            return None, None
        b, a, c = mix
        if b == a:
            return self.exact[a], self.upper[a]
        low = [x for x in self._lines(b, a, c, self.exact[a], self.exact[b]) if x is not None]
        high = self._lines(b, a, c, self.upper[a], self.upper[b])
        return (
            max(low) if low else None,
            None if None in high else max(high),  # type: ignore[type-var]
        )


def sets_of(prep: Any, know: Any, o: int) -> Sets:
    """The `Sets` of per-layer option ``o``'s scan, learnt from every program of that scan
    compiled alone with a per-layer pattern of its length (``know.alone``)."""
    scan = prep.cands[o].scan
    model = prep.models[scan]
    seen = [
        (prep.cands[key[0]].pattern, memory)
        for key, memory in know.alone.items()
        if prep.cands[key[0]].scan == scan
        and len(prep.cands[key[0]].pattern) == model.length
        and not key[2]  # nothing offloaded
    ]
    step = {
        saved: float(sum(model.values[i].bytes for i in saved if not model.values[i].invariant))
        for pattern in [prep.cands[o].pattern, *(p for p, _ in seen)]
        for saved in pattern
    }
    sets = Sets(model.length, step)
    for pattern, memory in seen:
        sets.learn(pattern, memory)
    return sets
