"""Run directories: `runs/<UTC timestamp>-<kind>/`, one per smoke, run or regress invocation."""

import time
from pathlib import Path

RUNS_ROOT = Path("runs")


def new_run_dir(kind, root=RUNS_ROOT):
    """Create and return a fresh `<root>/<UTC timestamp>-<kind>` directory, absolute (the scripts we start change
    their working directory into the notebooks' folder).

    Two runs started in the same second get `-2`, `-3`, ... suffixes instead of sharing a directory.
    """
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    root = Path(root).absolute()
    root.mkdir(parents=True, exist_ok=True)
    name, attempt = f"{stamp}-{kind}", 1
    while True:
        path = root / name
        try:
            path.mkdir()
            return path
        except FileExistsError:
            attempt += 1
            name = f"{stamp}-{kind}-{attempt}"
