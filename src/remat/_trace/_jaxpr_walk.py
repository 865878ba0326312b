"""Walking and editing traced programs: where the checkpoints, scans and names of a jaxpr are.

`sites` walks a jaxpr depth first through every sub-jaxpr (checkpoint, scan, while, cond,
jit, custom derivatives) and returns one `Site` per equation, with its path from the top, the
nearest enclosing checkpoint and whether a loop lies between the two. `replace_eqn` rebuilds
the program with one equation changed, so a check can compare a program with and without a
given checkpoint policy.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Iterator

import numpy as np
from jax._src import source_info_util  # user frames of an equation's traceback
from jax.extend import core

CHECKPOINT = "remat2"  # `jax.checkpoint` / `jax.remat`
LOOPS = frozenset({"scan", "while"})
_REMAT_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_LIBRARIES = ("flax", "equinox", "optax", "haiku")  # their frames are not the user's code

# One step down into a sub-jaxpr: (equation index, parameter name, branch index or None).
Step = tuple[int, str, int | None]


@dataclasses.dataclass(frozen=True, eq=False)
class Site:
    """One equation of a traced program and where it sits.

    Attributes:
      eqn: the equation.
      steps: how to reach the jaxpr that holds it from the top-level jaxpr.
      index: its position in that jaxpr.
      checkpoint: the nearest enclosing checkpoint, if any.
      loop_since_checkpoint: whether a scan/while lies between it and that checkpoint.
      loops: how many scans/whiles enclose it.
      parents: the equations that enclose it, outermost first.
    """

    eqn: core.JaxprEqn
    steps: tuple[Step, ...]
    index: int
    checkpoint: Site | None
    loop_since_checkpoint: bool
    loops: int
    parents: tuple[Site, ...] = ()

    @property
    def primitive(self) -> str:
        return self.eqn.primitive.name

    def inside(self, other: Site) -> bool:
        """Whether this equation lies (at any depth) inside equation ``other``."""
        return any(p is other for p in self.parents)


def subjaxprs(eqn: core.JaxprEqn) -> Iterator[tuple[str, int | None, core.Jaxpr]]:
    """(parameter, branch, jaxpr) for every jaxpr an equation carries."""
    for key, value in eqn.params.items():
        values = value if isinstance(value, tuple | list) else (value,)
        branched = isinstance(value, tuple | list)
        for i, v in enumerate(values):
            if isinstance(v, core.ClosedJaxpr):
                yield key, i if branched else None, v.jaxpr
            elif isinstance(v, core.Jaxpr):
                yield key, i if branched else None, v


def sites(jaxpr: core.Jaxpr) -> list[Site]:
    """Every equation of ``jaxpr`` and of its sub-jaxprs, depth first, parents first."""
    out: list[Site] = []

    def walk(j, steps, checkpoint, loop_since, loops, parents=()):
        for i, eqn in enumerate(j.eqns):
            site = Site(eqn, steps, i, checkpoint, loop_since, loops, parents)
            out.append(site)
            name = eqn.primitive.name
            for key, branch, sub in subjaxprs(eqn):
                if name == CHECKPOINT:
                    walk(sub, (*steps, (i, key, branch)), site, False, loops, (*parents, site))
                else:
                    is_loop = name in LOOPS
                    walk(
                        sub,
                        (*steps, (i, key, branch)),
                        checkpoint,
                        loop_since or is_loop,
                        loops + is_loop,
                        (*parents, site),
                    )

    walk(jaxpr, (), None, False, 0)
    return out


def within(all_sites: list[Site], parent: Site) -> list[Site]:
    """The sites that lie inside ``parent``."""
    return [s for s in all_sites if s.inside(parent)]


def replace_eqn(
    jaxpr: core.Jaxpr, site: Site, make: Callable[[core.JaxprEqn], core.JaxprEqn]
) -> core.Jaxpr:
    """``jaxpr`` with the equation at ``site`` replaced by ``make(equation)``."""

    def rebuild(j: core.Jaxpr, steps: tuple[Step, ...]) -> core.Jaxpr:
        eqns = list(j.eqns)
        if not steps:
            eqns[site.index] = make(eqns[site.index])
            return j.replace(eqns=eqns)
        (i, key, branch), rest = steps[0], steps[1:]
        eqn = eqns[i]
        value = eqn.params[key]
        sub = value if branch is None else value[branch]
        if isinstance(sub, core.ClosedJaxpr):
            new_sub = sub.replace(jaxpr=rebuild(sub.jaxpr, rest))
        else:
            new_sub = rebuild(sub, rest)
        if branch is not None:
            new_sub = type(value)(new_sub if b == branch else v for b, v in enumerate(value))
        eqns[i] = eqn.replace(params={**eqn.params, key: new_sub})
        return j.replace(eqns=eqns)

    return rebuild(jaxpr, site.steps)


def source(eqn: core.JaxprEqn) -> str | None:
    """``"file.py:12"``: the innermost frame of the user's code (not JAX's, not remat's).

    An equation made by a library (a checkpoint that `remat.apply` or `flax.linen.scan`
    inserted) gets the location of its first inner equation in the user's code, else the
    innermost frame outside JAX.
    """
    return _strict_source(eqn) or _own_source(eqn, strict=False)


def site(eqn: core.JaxprEqn) -> tuple[str, ...]:
    """Every frame outside JAX that made ``eqn``, innermost first, as ``"file.py:12:8"``.

    One operation run again by a Python loop has the same site at every iteration; two
    operations of one source line (``jnp.tanh(x @ w1) @ w2``, or a layer's internals called
    there) have different sites and the same `source`.
    """
    frames = source_info_util.user_frames(eqn.source_info.traceback)
    return tuple(f"{display_path(f.file_name)}:{f.start_line}:{f.start_column}" for f in frames)


def _strict_source(eqn: core.JaxprEqn, depth: int = 0) -> str | None:
    found = _own_source(eqn, strict=True)
    if found is None and depth < 8:
        for _, _, sub in subjaxprs(eqn):
            for inner in sub.eqns:
                found = _strict_source(inner, depth + 1)
                if found is not None:
                    return found
    return found


def library_dirs(names: tuple[str, ...] = _LIBRARIES) -> tuple[str, ...]:
    """Directories whose frames are not the user's: remat's own, and those of the imported
    packages among ``names`` (layer libraries)."""
    dirs = [_REMAT_DIR]
    for name in names:
        module = sys.modules.get(name)
        if module is not None and getattr(module, "__file__", None):
            dirs.append(os.path.dirname(module.__file__) + os.sep)
    return tuple(dirs)


def display_path(path: str) -> str:
    """``path`` relative to the working directory where it lies below it, else unchanged."""
    try:
        rel = os.path.relpath(path)
    except ValueError:  # another drive on Windows
        return path
    return rel if not rel.startswith("..") else path


def _own_source(eqn: core.JaxprEqn, strict: bool) -> str | None:
    library = library_dirs() if strict else ()
    for frame in source_info_util.user_frames(eqn.source_info.traceback):
        if library and frame.file_name.startswith(library):
            continue
        return f"{display_path(frame.file_name)}:{frame.start_line}"
    return None


def nbytes(aval) -> int:
    """Bytes of one array of this abstract value (0 for tokens and other non-arrays)."""
    shape, dtype = getattr(aval, "shape", None), getattr(aval, "dtype", None)
    if shape is None or dtype is None:
        return 0
    try:
        return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    except TypeError:  # extended dtypes (PRNG keys, float0)
        return 0
