"""Do a notebook's `!command` or `%%writefile` once per machine, without a collective.

A barrier would need every rank to make the call, and notebooks put these under conditions
(`if not os.path.exists(path): !wget ...`, true on a rank that gets there first, false on one that comes after
the download) and in cells that only rank 0 runs. So the ranks of one machine coordinate through files instead:
the first to claim a piece of work does it while holding a lock on its file, and marks the file done; a rank that
claims it later waits for the lock, finds the mark and goes on. A rank that never claims it waits for nothing.

Pieces of work are told apart by their text and by how many times this process has claimed that text before,
so that a loop's repeated command runs once per iteration. The files live in a folder of the temporary directory
that is this job's alone: named after torchrun's run id (TORCHELASTIC_RUN_ID: a random uuid under `--standalone`
and on one node without a rendezvous endpoint, `--rdzv-id` otherwise) and the agent that all ranks of a machine
share (`os.getppid()`), so another job, or a run launched afterwards, starts afresh; workers that torchrun restarts keep both, so they do
not repeat work done before the restart. The folder is created with mode 0700 and refused unless it is a folder
of this user that no one else can write in; its files are opened without following symbolic links, so another
user cannot point them at a file of theirs to be truncated, nor mark work done. Local rank 0 removes it at the end
of the job (`ddp.shutdown`, after its barrier); a job that crashes leaves it behind, for a later job to take only
with the same `--rdzv-id` under an agent of the same pid. Work that raises (a file that cannot be written) leaves
no mark, and the next rank tries it itself; a command that merely exits non-zero has been done (`ddp.shell` reports it and goes on, as a notebook does).

fcntl.flock rather than the filelock package: the file nbddp locks is the one it opens itself (O_NOFOLLOW, 0600)
and also holds the done mark, which filelock, owning its lock file's descriptor, would need a second file for;
and the private-folder checks are POSIX either way.
"""
import collections
import contextlib
import errno
import fcntl
import hashlib
import os
import shutil
import stat
import tempfile
from pathlib import Path

from nbddp.errors import UsageError

DONE = b"done\n"


class OncePerMachine:
    def __init__(self, local_world_size: int):
        self.local_world_size = local_world_size  # processes on this machine
        self._claims = collections.Counter()
        job = hashlib.sha256(f"{os.environ.get('TORCHELASTIC_RUN_ID', '')}\0{os.getppid()}".encode()).hexdigest()
        self.folder = Path(tempfile.gettempdir()) / f"nbddp-once-{os.getuid()}-{job[:16]}"

    @contextlib.contextmanager
    def claim(self, work: str):
        """Yields True to the process that should do `work` (then marks it done), False to one that finds it done.
        Raises UsageError when the folder is not this user's private one, or its file is a symbolic link."""
        if self.local_world_size == 1:
            yield True
            return
        self._claims[work] += 1
        key = self.key(work)
        with contextlib.suppress(FileExistsError):
            os.mkdir(self.folder, 0o700)
        folder = self._open_folder()
        try:
            lock = os.open(key, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600, dir_fd=folder)
        except OSError as error:  # ELOOP: a symbolic link was planted there
            what = "a symbolic link" if error.errno == errno.ELOOP else error.strerror
            raise UsageError(f"{self.folder / key}: {what}, where nbddp keeps a once-per-machine file of its own; "
                             f"something other than this job writes in {self.folder}: remove that folder") from None
        finally:
            os.close(folder)
        with open(lock, "r+b") as file:
            fcntl.flock(file, fcntl.LOCK_EX)  # released when the file closes, also when the work raises
            first = file.read() != DONE
            yield first
            if first:
                file.write(DONE)

    def key(self, work: str) -> str:
        """The name of the file of this process's latest claim of `work`, in `folder` (other files of that piece of
        work may be named after it)."""
        return hashlib.sha256(f"{self._claims[work]}\0{work}".encode()).hexdigest()[:24]

    def remove(self) -> None:
        """Delete this job's folder, when it is the private one claims made; call it once every rank of the machine
        is past its last claim."""
        try:
            os.close(self._open_folder())
        except (FileNotFoundError, UsageError):  # none made, or not ours to delete
            return
        shutil.rmtree(self.folder)  # symlink-safe: never deletes outside the folder

    def _open_folder(self) -> int:
        """A descriptor of the folder, once it is a folder (not a link) of this user that only this user can write."""
        try:
            folder = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except FileNotFoundError:
            raise
        except OSError as error:  # a symbolic link, or a file
            what = "a symbolic link" if self.folder.is_symlink() else error.strerror
            raise UsageError(f"{self.folder}: {what}, where nbddp keeps this job's once-per-machine files in a "
                             "folder of its own: remove it, or set TMPDIR to a folder of your own") from None
        info = os.fstat(folder)
        if info.st_uid != os.getuid() or info.st_mode & 0o077:
            os.close(folder)
            raise UsageError(f"{self.folder}: a folder of uid {info.st_uid} with mode {stat.filemode(info.st_mode)}, "
                             f"where nbddp keeps this job's once-per-machine files in a folder only uid {os.getuid()} "
                             "can use (0700): remove it, or set TMPDIR to a folder of your own")
        return folder
