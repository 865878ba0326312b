"""`remat.lint`: checks of a checkpointed function's policies, names and compiled program,
reported as `remat.Finding`s. May import every stage below it (`_core` to `_report`).
"""
