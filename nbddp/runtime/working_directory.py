"""The cells' working directory: the notebooks' folder, as in Jupyter, wherever the script was started.

Export writes the notebooks' folder, relative to the script's, as the script's `workdir` parameter (`../notebooks`);
`runtime.setup` changes into it before any cell runs. A relative `workdir` is read from the script's folder, or in a
kernel (papermill, Jupyter), which has no script file, from the kernel's working directory (nbddp's smoke and
regress runs pass it absolute); `""` leaves the working directory as it is. So a notebook's `../data/x.jsonl` means
what it means in Jupyter, and so do the values of flags that name files. The folders of the run settings
`output_dir` and `smoke_dir` are named from where the command started, so they are made absolute first.
"""
import os

from nbddp.errors import UsageError
from nbddp.formats.run_settings import ENV

PATH_VARIABLES = (ENV.OUTPUT_DIR, ENV.SMOKE_DIR)


def folder(workdir: str, script: str | None) -> str:
    """The absolute folder `workdir` names (see above); the working directory for `""`."""
    if not workdir:
        return os.getcwd()
    base = os.path.dirname(os.path.abspath(script)) if script else os.getcwd()
    return os.path.normpath(os.path.join(base, workdir))


def enter(workdir: str, script: str | None) -> str:
    """Change into `workdir` (see above) and return the working directory the process had before."""
    started_in = os.getcwd()
    if not workdir:
        return started_in
    target = folder(workdir, script)
    if not os.path.isdir(target):
        base = os.path.dirname(os.path.abspath(script)) if script else started_in
        origin = "the script's folder" if script else "the kernel's working directory"
        raise UsageError(f"--workdir {workdir}: {target} is no folder. It is where the cells run, the notebooks' "
                         f"folder, from {origin} ({base}): export writes it; pass --workdir '' to run them in "
                         f"{started_in}")
    for variable in PATH_VARIABLES:
        if os.environ.get(variable):
            os.environ[variable] = os.path.abspath(os.environ[variable])
    os.chdir(target)
    return started_in
