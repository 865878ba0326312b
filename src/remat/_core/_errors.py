"""Errors of one public function's checks, raised again in another's name: `renamed`.

`remat.plan` and `remat.compare` run `remat.measure`'s input checks before anything is
compiled, and say who is speaking. Rebuilding an error as ``type(err)(new_text)`` works only
for classes made from a message alone; a JAX error (``TracerBoolConversionError`` takes the
tracer) would fail in the middle of being raised and show the user an internal traceback.
So the class is kept only when it carries the new message, and an error that is not one of
remat's messages (the user's function failed while it was traced) is raised as it is.

Example:
  >>> from remat._core._errors import renamed
  >>> err = renamed(ValueError("`remat.measure` got x"), "`remat.measure`", "`remat.plan`")
  >>> type(err).__name__, str(err), err.__cause__
  ('ValueError', '`remat.plan` got x', None)
"""

from __future__ import annotations


def renamed(err: Exception, old: str, new: str) -> Exception:
    """The error to raise for ``err``, with ``old`` (a public name in backticks) replaced by
    ``new`` in its message.

    Returns ``err`` itself when its message does not name ``old`` (it is not remat's: the
    user's function raised it while traced, and it is raised unchanged). Otherwise an error
    of ``err``'s class with the new message when the class can be made from a message alone,
    else a `TypeError` (for a `TypeError`) or `ValueError` with it, whose ``__cause__`` is
    ``err``.
    """
    text = str(err)
    if old not in text:
        return err
    text = text.replace(old, new)
    try:
        out = type(err)(text)
        kept = str(out) == text
    except Exception:  # a class that is not made from a message alone
        kept = False
    if not kept:
        out = (TypeError if isinstance(err, TypeError) else ValueError)(text)
    out.__cause__ = None if kept else err
    out.__suppress_context__ = True
    return out


def brief(value: object, limit: int = 80) -> str:
    """``repr(value)`` for an error message, cut to about ``limit`` characters: a model's
    parameters passed where a function belongs would otherwise print every weight.

    Example:
      >>> from remat._core._errors import brief
      >>> brief(3)
      '3'
      >>> brief({"w": list(range(100))})
      "a dict: {'w': [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 1..."
    """
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"a {type(value).__name__}: {text[: limit - 10]}..."
