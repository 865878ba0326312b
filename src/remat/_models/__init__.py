"""The demo GPT and its sharded twin, used by ``remat demo``, the benchmarks and the examples;
a MaxText-style decoder with MaxText's remat presets (`_maxtext`), for the planner's benchmark
and tests.

May import every stage below it (`_core` to `_lint`).
"""

from ._gpt import make_gpt as make_gpt
from ._gpt_sharded import make_mesh as make_mesh
from ._gpt_sharded import make_sharded_gpt as make_sharded_gpt
