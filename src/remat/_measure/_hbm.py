"""The HBM a TPU program allocates, read from the TPU compiler's own buffer assignment.

XLA's memory analysis of a TPU program does not give it. Its ``temp_size_in_bytes`` counts
bytes that no allocation of the buffer assignment holds, so ``temp + argument + output -
alias`` is above the HBM the program allocates: by 0.2-64 MiB on scanned MLPs, by 0.79 GiB
on a 2-layer Llama-3-8B step with FSDP and at least 3.84 GiB at 32 layers (docs/tpu.md); and
its ``peak_memory_in_bytes`` adds VMEM in on some programs and is below the HBM on others. The buffer assignment XLA writes when asked to dump
(``xla_dump_to``) has the allocations themselves, each with its memory space ("color"):
memory space 0 is HBM, and the compiler's capacity check ("Ran out of memory on HBM") is
made on those allocations.

So every TPU program remat compiles goes through `compile_measured`, which writes the dump
into a temporary folder, reads the HBM allocations and records them for `compiled_hbm`; the
peak rule (`remat._measure._peak`) takes that figure where it is recorded.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import tempfile
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ._read_options import read_options

_ALLOCATION = re.compile(r"^allocation \d+: size (\d+)(.*):$", re.M)
_COLOR = re.compile(r"\bcolor (\d+)\b")
_HBM: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


_CACHE_LOCK = threading.Lock()


@contextlib.contextmanager
def no_persistent_cache() -> Iterator[None]:
    """Compiles inside skip JAX's persistent compilation cache: its key leaves
    ``xla_dump_to`` out, so a program compiled before (in this process or an earlier one)
    would come from the cache and XLA would write no dump. JAX decides once per process
    whether the cache is used (``jax._src.compilation_cache``); that decision is set aside
    for the compile and restored after it (where this JAX has it)."""
    try:
        from jax._src import compilation_cache as cache
    except ImportError:  # pragma: no cover - another JAX layout
        yield
        return
    enabled = getattr(cache, "_is_cache_enabled", None)
    if enabled is not None and not enabled():  # no cache: nothing to set aside, no lock
        yield
        return
    with _CACHE_LOCK:
        if not hasattr(cache, "_cache_checked") or not hasattr(cache, "_cache_used"):
            yield  # pragma: no cover - another JAX layout
            return
        saved = (cache._cache_checked, cache._cache_used)
        cache._cache_checked, cache._cache_used = True, False
        try:
            yield
        finally:
            cache._cache_checked, cache._cache_used = saved


def hbm_of_buffer_assignment(text: str) -> int:
    """Bytes of HBM (memory space 0) in one buffer assignment's text: its allocations of
    colour 0 (an allocation without a colour is colour 0), thread-local scratch left out.

    Example:
      >>> from remat._measure._hbm import hbm_of_buffer_assignment
      >>> hbm_of_buffer_assignment('''allocation 0: size 1024, parameter 0, shape |f32[256]|:
      ... allocation 1: size 4096, maybe-live-out:
      ... allocation 2: size 512, thread-local:
      ... allocation 3: size 8192, preallocated-temp:
      ... allocation 4: size 65536, color 1, preallocated-temp:''')
      13312
    """
    total = 0
    for match in _ALLOCATION.finditer(text):
        color = _COLOR.search(match[2])
        if (color is None or color[1] == "0") and "thread-local" not in match[2]:
            total += int(match[1])
    return total


def hbm_of_dump(folder: str | Path) -> int | None:
    """The HBM of the module XLA dumped into ``folder`` (its entry module: the one whose
    buffer assignment is largest), or None where no buffer assignment was written."""
    files = sorted(Path(folder).glob("*after_optimizations-buffer-assignment.txt"))
    if not files:
        return None
    return max(hbm_of_buffer_assignment(f.read_text()) for f in files)


def record(compiled: Any, folder: str | Path) -> None:
    """Records the HBM of ``compiled`` from the dump its compile wrote into ``folder``."""
    hbm = hbm_of_dump(folder)
    if hbm is not None:
        _HBM[compiled] = hbm


def compiled_hbm(compiled: Any) -> int | None:
    """The HBM recorded for ``compiled`` by `compile_measured`, or None (not compiled by it,
    or not for a TPU)."""
    try:
        return _HBM.get(compiled)
    except TypeError:  # an object that cannot be weakly referenced
        return None


def lowered_platform(lowered: Any) -> str:
    """The platform ``lowered`` compiles for (``"tpu"`` for a `remat.Target`'s shapes)."""
    import jax

    try:
        return str(lowered._lowering.compile_args["backend"].platform)
    except (AttributeError, KeyError, TypeError):  # another JAX layout: the shardings' devices
        for arg in jax.tree_util.tree_leaves(getattr(lowered, "args_info", ())):
            sharding = getattr(arg, "sharding", None)
            for device in getattr(sharding, "device_set", ()):
                return str(device.platform)
        return jax.default_backend()


def compile_measured(lowered: Any, options: dict[str, Any] | None = None) -> Any:
    """``lowered.compile(options)``; for a TPU, with XLA's dump written into a temporary
    folder (removed after) and the program's HBM recorded from it (`compiled_hbm`). A TPU
    compile also skips JAX's persistent compilation cache, which could not load a deviceless
    program back ("PjRtCompiler must be constructed with a Client").

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from remat._measure._hbm import compile_measured, compiled_hbm
      >>> compiled = compile_measured(jax.jit(jnp.sin).lower(jnp.ones(4)))
      >>> compiled_hbm(compiled) is None  # a CPU program: its memory analysis is exact
      True
    """
    platform = lowered_platform(lowered)
    options = read_options(options, platform)
    if platform != "tpu" or "xla_dump_to" in (options or {}):
        return lowered.compile(options)
    folder = tempfile.mkdtemp(prefix="remat-hbm-")
    try:
        with no_persistent_cache():
            compiled = lowered.compile({**(options or {}), "xla_dump_to": folder})
        record(compiled, folder)
        return compiled
    finally:
        shutil.rmtree(folder, ignore_errors=True)
