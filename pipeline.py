"""`python pipeline.py ...` in a clone: the `nbddp` command (nbddp/cli.py; `python pipeline.py --help`)."""
import sys

from nbddp.cli import main

if __name__ == "__main__":
    sys.exit(main())
