"""Can the run write its results? Checked before any work, so a run does not train for an hour and then fail
to save, and nothing is left behind when the answer is no.

The threshold of free space is a floor that catches a full disk, not an estimate of what a run writes
(the example's adapter is a few hundred kB; an 8B model's checkpoints are gigabytes): the run setting
`min_free_gib`, 1 GiB unless set; 0 turns the check off.
"""
import os
import shutil
import tempfile
from pathlib import Path

from nbddp.errors import UsageError
from nbddp.formats.run_settings import setting

MIN_FREE_GIB_VARIABLE = setting("min_free_gib").env
DEFAULT_MIN_FREE_GIB = setting("min_free_gib").default


def check_output_dir(output_dir, name="output_dir") -> None:
    """Raise UsageError, naming `output_dir` as `name` (the parameter's, or the run setting `output_dir`'s variable),
    when it cannot be created or written, or its disk is (nearly) full.

    Creates nothing: a missing `output_dir` is judged by the deepest folder of it that exists, and the probe
    file written there has no name and is gone when closed.
    """
    where = f"{name} {str(output_dir)!r}"
    path = Path(output_dir).expanduser().absolute()
    dangling = next((folder for folder in (path, *path.parents) if folder.is_symlink() and not folder.exists()), None)
    if dangling is not None:  # exists() says no, yet no folder can be made there (FileExistsError)
        target = os.readlink(dangling)
        raise UsageError(f"{where}: {dangling} is a symbolic link to {target}, which does not exist; create "
                         f"{target} or choose another output_dir")
    existing = next(folder for folder in (path, *path.parents) if folder.exists())
    if not existing.is_dir():
        what = "exists and is not a directory" if existing == path else f"{existing} is a file, not a directory"
        raise UsageError(f"{where}: {what}")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as error:
        raise UsageError(f"{where}: cannot write in {existing} ({error.strerror})") from None
    minimum = min_free_gib()
    free = shutil.disk_usage(existing).free / 2**30
    if free < minimum:
        raise UsageError(
            f"{where}: only {free:.2f} GiB free on the disk of {existing}, less than {minimum:g} GiB "
            f"({MIN_FREE_GIB_VARIABLE}); free some space, choose another output_dir, or lower {MIN_FREE_GIB_VARIABLE}"
        )


def min_free_gib() -> float:
    text = os.environ.get(MIN_FREE_GIB_VARIABLE)
    if text is None:
        return DEFAULT_MIN_FREE_GIB
    try:
        return float(text)
    except ValueError:
        raise UsageError(f"{MIN_FREE_GIB_VARIABLE}={text!r}: expected a number of GiB") from None
