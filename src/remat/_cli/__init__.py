"""The ``remat`` command line: `main` and one module per command (``_cli_<command>.py``).

The top stage: may import every other stage.
"""

from ._cli import main as main
