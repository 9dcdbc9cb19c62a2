"""Do a notebook's `!command` or `%%writefile` once per machine, without a collective.

A barrier would need every rank to make the call, and notebooks put these under conditions
(`if not os.path.exists(path): !wget ...`, true on a rank that gets there first, false on one that comes after
the download) and in cells that only rank 0 runs. So the ranks of one machine coordinate through files instead:
the first to claim a piece of work does it while holding a lock, and leaves a marker; a rank that claims it later
waits for the lock, finds the marker and goes on. A rank that never claims it waits for nothing.

Pieces of work are told apart by their text and by how many times this process has claimed that text before,
so that a loop's repeated command runs once per iteration. The files live in the temporary directory, in a folder
named after the launcher process that all ranks of a machine share (torchrun's agent, `os.getppid()`), so that
another job, or a run launched afterwards, starts afresh (workers that torchrun restarts keep their agent, so
they do not repeat work done before the restart: its files are still there). Work that raises (a file that
cannot be written) leaves no marker, and the next rank tries it itself; a command that merely exits non-zero
has been done (`ddp.shell` reports it and goes on, as a notebook does).
"""
import collections
import contextlib
import fcntl
import hashlib
import os
import tempfile
from pathlib import Path


class OncePerMachine:
    def __init__(self, local_world_size: int):
        self.local_world_size = local_world_size  # processes on this machine
        self._claims = collections.Counter()

    @contextlib.contextmanager
    def claim(self, work: str):
        """Yields True to the process that should do `work` (then marks it done), False to one that finds it done."""
        if self.local_world_size == 1:
            yield True
            return
        self._claims[work] += 1
        key = hashlib.sha256(f"{self._claims[work]}\0{work}".encode()).hexdigest()[:24]
        folder = Path(tempfile.gettempdir()) / f"nbddp-once-{os.getuid()}-{os.getppid()}"
        folder.mkdir(parents=True, exist_ok=True)
        done = folder / f"{key}.done"
        with open(folder / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also when the work raises
            first = not done.exists()
            yield first
            if first:
                done.touch()
