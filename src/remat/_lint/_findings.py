"""What `remat.lint` reports: a `Finding` per problem, and the catalogue of finding codes."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Finding:
    """One checkpointing problem found in a traced program.

    Attributes:
      code: the finding's code, e.g. ``"RM001"`` (see `CODES` and docs/lint.md).
      message: one line saying what is wrong.
      source: ``"file.py:123"`` in the user's code where the checkpoint (or scan) is made,
        or None when JAX recorded no location.
      fix: one line saying what to do instead.

    Example:
      >>> from remat import Finding
      >>> print(Finding("RM003", "uses save_anything_except_these_names", "m.py:3", "use ..."))
      m.py:3: RM003 uses save_anything_except_these_names (fix: use ...)
    """

    code: str
    message: str
    source: str | None
    fix: str

    def __str__(self) -> str:
        return f"{self.source or '<unknown>'}: {self.code} {self.message} (fix: {self.fix})"

    @property
    def title(self) -> str:
        """The short title of this finding's code."""
        return CODES[self.code][0]


# code -> (title, why it matters). docs/lint.md has the same table with examples.
CODES: dict[str, tuple[str, str]] = {
    "RM001": (
        "policy names a value the program never produces",
        "a misspelt or stale `checkpoint_name` is silently ignored, so the value is "
        "recomputed (or saved) against the author's intent",
    ),
    "RM002": (
        "name both saved and offloaded",
        "a saved name wins: the value stays in device memory and is silently not offloaded",
    ),
    "RM003": (
        "save_anything_except_these_names ignores its names",
        "in this JAX version it saves every value, so the checkpoint recomputes nothing "
        "and saves no memory",
    ),
    "RM004": (
        "dots_with_no_batch_dims_saveable keeps nothing",
        "under `vmap` (or with batched einsums) every matmul has a batch dimension, so the "
        "policy saves no dot and the checkpoint recomputes everything",
    ),
    "RM005": (
        "the compiler removed the recomputation",
        "XLA merged the recomputed values with the forward ones, so the checkpoint costs "
        "nothing and saves nothing",
    ),
    "RM006": (
        "checkpoint saves no memory",
        "the residuals kept for the backward pass are as large as without the checkpoint; "
        "it only adds work",
    ),
    "RM007": (
        "checkpoint around a whole scan",
        "during the backward pass of that scan all of its per-step residuals are rebuilt "
        "and held at once, so peak memory does not drop",
    ),
    "RM009": (
        "checkpoint recomputes but the peak does not fall",
        "the compiled step does the extra work (more FLOPs) yet its peak is not 2% below the "
        "same program without checkpoints: outside a loop XLA may schedule the recomputation "
        "early, so the recomputed values live as long as the originals",
    ),
    "RM008": (
        "inner checkpoint policy overridden by the outer checkpoint",
        "JAX applies the outer policy to everything inside it when choosing residuals, so "
        "the inner policy does not decide what is kept from the forward pass",
    ),
}
