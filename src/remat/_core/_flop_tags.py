"""Named scopes that tell the HLO FLOP counter what it cannot read from the HLO.

A ``while`` loop whose trip count depends on data (`remat.Binomial`'s backward sweep
advances a different number of steps from each restored snapshot) and a branch taken a
known number of times are counted exactly by `remat._measure._hlo.hlo_flops` when the
program that built them knows the totals and says so in the name of a `jax.named_scope`
directly around the loop or branch. XLA keeps scope names in each instruction's
``op_name``, so the totals survive compilation.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

# The scope must directly enclose the loop or branch (its name is the last path component of
# the instruction's ``op_name``), so a loop nested inside a tagged loop's body is not taken
# for it.
TRIPS_TAG = re.compile(r'op_name="[^"]*remat_trips_(\d+)_per_(\d+)/[^"/]*while[^"/]*"')
BRANCHES_TAG = re.compile(r'op_name="[^"]*remat_branches_((?:\d+_)+)of_(\d+)/[^"/]*cond[^"/]*"')


def trip_scope(total: int, entries: int) -> str:
    """The `jax.named_scope` name that tells `hlo_flops` a ``while`` loop entered ``entries``
    times runs ``total`` iterations in all.

    Example:
      >>> from remat._core._flop_tags import trip_scope
      >>> trip_scope(12, 5)
      'remat_trips_12_per_5'
    """
    return f"remat_trips_{int(total)}_per_{int(entries)}"


def branch_scope(counts: Sequence[int], entries: int) -> str:
    """The `jax.named_scope` name that tells `hlo_flops` branch ``k`` of a ``cond``/``switch``
    entered ``entries`` times is taken ``counts[k]`` times.

    Example:
      >>> from remat._core._flop_tags import branch_scope
      >>> branch_scope([3, 2], 5)
      'remat_branches_3_2_of_5'
    """
    return "remat_branches_" + "".join(f"{int(c)}_" for c in counts) + f"of_{int(entries)}"
