import sys

from ._cli._cli import main

sys.exit(main())
