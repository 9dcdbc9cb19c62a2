"""The generated script as a notebook (jupytext): what papermill executes, and where the parameters cell is read.

The notebook keeps the script's kernelspec, `python3` (docs/design.md); a script without one gets it. smoke's
kernel.py writes a run-local kernelspec of that name, so the executed notebook opens anywhere.
"""

import jupytext

KERNEL_NAME = "python3"
# The kernelspec the generated script declares; a script without one gets it.
PYTHON3_KERNELSPEC = {"display_name": "Python 3", "language": "python", "name": KERNEL_NAME}


def to_notebook(script):
    """The generated percent script as a notebook, kernelspec kept."""
    notebook = jupytext.read(script)
    notebook.metadata.setdefault("kernelspec", PYTHON3_KERNELSPEC)
    return notebook
