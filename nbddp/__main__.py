"""`python -m nbddp ...`: the `nbddp` command (nbddp/cli.py)."""
import sys

from nbddp.cli import main

sys.exit(main())
