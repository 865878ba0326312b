"""The warning category `remat` uses, so users can filter all of its warnings at once."""


class RematWarning(UserWarning):
    """A checkpointing choice that probably does not do what was meant.

    Example:
      >>> import warnings, remat
      >>> warnings.simplefilter("ignore", remat.RematWarning)
    """

    __module__ = "remat"  # printed as remat.RematWarning, the name users filter by
