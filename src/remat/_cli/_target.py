"""Loading a command-line target ``FILE_OR_MODULE:FACTORY`` into ``(fn, args)``.

``remat measure``, ``remat compare`` (and other commands) take a target such as
``examples/mlp.py:make`` or ``mypkg.models:make_gpt``: a Python file or an importable module,
a colon, and the name of a factory function that takes no arguments and returns
``(fn, args)``, where ``args`` is a tuple of the arguments to call ``fn`` with: arrays, or
`jax.ShapeDtypeStruct` s for a model too large to hold here (every command compiles and
measures from shapes; only timing needs values, see `repeats_for`).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._errors import EXIT_USAGE, CliError

_NO_COLON = (
    "target {target!r} has no factory; write FILE_OR_MODULE:FACTORY, e.g. "
    "'model.py:make' where make() returns (fn, args)"
)


_NO_FACTORY = (
    "{spec} has no function {name!r}; {found}. Write {spec}:FACTORY, where FACTORY() "
    "returns (fn, args)"
)


def _factories(module) -> str:
    """The functions ``module`` defines that can be called without arguments, in the order
    they are defined: the names a target may end with."""
    names = []
    for name, value in vars(module).items():
        if not (inspect.isfunction(value) and value.__module__ == module.__name__):
            continue
        try:
            inspect.signature(value).bind()
        except TypeError:  # a required argument: not a factory
            continue
        names.append(name)
    if not names:
        return "it defines no function that takes no arguments"
    return "its functions that take no arguments: " + ", ".join(names)


def _load_module(spec: str):
    looks_like_file = spec.endswith(".py") or "/" in spec or "\\" in spec
    if looks_like_file:
        path = Path(spec)
        if not path.is_file():
            raise CliError(f"no such file: {spec}", EXIT_USAGE)
        name = f"_remat_target_{abs(hash(str(path.resolve())))}"
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:
            raise CliError(f"cannot import {spec} as a Python file", EXIT_USAGE)
        module = importlib.util.module_from_spec(module_spec)
        sys.path.insert(0, str(path.resolve().parent))  # let the file import its neighbours
        # registered before it runs, as an import does: dataclasses (and so Flax modules)
        # defined in the file look their module up in sys.modules
        sys.modules[name] = module
        try:
            module_spec.loader.exec_module(module)
        except Exception as err:
            del sys.modules[name]
            raise CliError(f"importing {spec} failed: {_one_line(err)}", EXIT_USAGE) from err
        finally:
            sys.path.remove(str(path.resolve().parent))
        return module
    try:
        return importlib.import_module(spec)
    except ModuleNotFoundError as err:
        if err.name and spec.startswith(err.name):
            raise CliError(
                f"no such module: {spec} (nor a file; give a path ending in .py)", EXIT_USAGE
            ) from err
        raise CliError(f"importing {spec} failed: {_one_line(err)}", EXIT_USAGE) from err
    except Exception as err:
        raise CliError(f"importing {spec} failed: {_one_line(err)}", EXIT_USAGE) from err


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


def load_target(target: str) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """Imports ``FILE_OR_MODULE:FACTORY``, calls ``FACTORY()`` and returns its ``(fn, args)``.

    Args:
      target: ``path/to/file.py:factory`` or ``package.module:factory``.

    Returns:
      ``(fn, args)`` with ``fn`` callable and ``args`` a tuple.

    Raises:
      remat._cli._errors.CliError: (exit code 2) with a one-line message when the file or module
        does not exist or fails to import, the factory does not exist or is not callable,
        the factory raises, or it returns anything but ``(callable, tuple)``.

    Example:
      >>> import pathlib, tempfile
      >>> from remat._cli._target import load_target
      >>> path = pathlib.Path(tempfile.mkdtemp()) / "model.py"
      >>> _ = path.write_text("def make():\\n    return sum, ([1.0, 2.0],)\\n")
      >>> fn, args = load_target(f"{path}:make")
      >>> fn(*args)
      3.0
    """
    module_spec, colon, factory_name = target.rpartition(":")
    if not colon or not module_spec or not factory_name:
        raise CliError(_NO_COLON.format(target=target), EXIT_USAGE)
    module = _load_module(module_spec)
    factory = getattr(module, factory_name, None)
    if factory is None:
        raise CliError(
            _NO_FACTORY.format(spec=module_spec, name=factory_name, found=_factories(module)),
            EXIT_USAGE,
        )
    if not callable(factory):
        raise CliError(f"{module_spec}:{factory_name} is not callable", EXIT_USAGE)
    try:
        result = factory()
    except Exception as err:
        raise CliError(f"{target}() raised {_one_line(err)}", EXIT_USAGE) from err
    if (
        not isinstance(result, tuple)
        or len(result) != 2
        or not callable(result[0])
        or not isinstance(result[1], tuple)
    ):
        raise CliError(
            f"{target}() returned {_describe(result)}; expected (fn, args) with fn callable "
            "and args a tuple",
            EXIT_USAGE,
        )
    return result


def add_step_arguments(parser: Any) -> None:
    """``--argnums`` and ``--has-aux``: which arguments the step differentiates, and whether
    the loss returns ``(loss, aux)``, as `jax.value_and_grad` takes them."""
    parser.add_argument("--argnums", default="0", help="arguments to differentiate (default 0)")
    parser.add_argument(
        "--has-aux",
        action="store_true",
        help="fn returns (loss, aux), as for jax.value_and_grad(..., has_aux=True)",
    )


def add_compile_target(parser: Any) -> None:
    """``--target NAME``: compile for a TPU slice (`remat.Target`) instead of this machine."""
    parser.add_argument(
        "--target",
        dest="compile_target",
        metavar="SLICE",
        default=None,
        help="compile for this TPU slice from this machine, e.g. tpu:v5e:2x2 or tpu:v5p-8 "
        "(needs libtpu: pip install 'remat[tpu]'; FSDP over its chips)",
    )


def compile_target_of(args: Any, command: str) -> Any:
    """The parsed ``--target`` (None without one); a bad name exits 2 before any import."""
    if args.compile_target is None:
        return None
    from .._shard._target import parse_target, require_libtpu

    try:
        target = parse_target(args.compile_target, f"{command} --target")
        require_libtpu(target, f"{command} --target")
    except (TypeError, ValueError, RuntimeError) as err:
        raise CliError(str(err).replace("`", "").replace("target=", ""), EXIT_USAGE) from err
    return target


def repeats_for(repeats: int | None, args: tuple[Any, ...], target: Any = None) -> int:
    """``--repeats`` as given, else its default: 5 timed runs, or 0 when an argument is a
    `jax.ShapeDtypeStruct` (shapes can be compiled and measured, not run). An explicit
    ``--repeats`` above 0 with shapes is refused by `remat.measure`, which names the leaf.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from remat._cli._target import repeats_for
      >>> repeats_for(None, (jnp.ones(2),)), repeats_for(None, (jax.ShapeDtypeStruct((2,), jnp.float32),))
      (5, 0)
    """
    if repeats is not None:
        return repeats
    if target is not None:  # compiled for, never run
        return 0
    import jax

    abstract = any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree_util.tree_leaves(args))
    return 0 if abstract else 5


def _describe(value: object) -> str:
    if isinstance(value, tuple):
        inner = ", ".join(type(v).__name__ for v in value)
        return f"a tuple ({inner})"
    return f"a {type(value).__name__}"
