"""The Jupyter kernel papermill starts: this interpreter, whatever kernelspecs the machine has.

The `python3` kernelspec Jupyter finds first (one on the user's JUPYTER_PATH, or ~/.local/share/jupyter
outside a virtualenv) can run another Python, without torch or nbddp. We write a run-local `python3`
spec whose argv is `sys.executable` (ipykernel's own `write_kernel_spec`, as `python -m ipykernel install`
writes it) and put its directory first on JUPYTER_PATH in the child's environment only; the notebook keeps
its kernelspec name `python3`, so the executed notebook opens anywhere.
"""

import sys
from pathlib import Path

from ipykernel.kernelspec import write_kernel_spec

from nbddp.orchestration.script_notebook import KERNEL_NAME


def write_kernelspec(data_dir):
    """A `python3` kernelspec running this interpreter, under `<data_dir>/kernels/` (a new folder); returns
    `data_dir`."""
    spec_dir = Path(data_dir) / "kernels" / KERNEL_NAME
    spec_dir.parent.mkdir(parents=True, exist_ok=True)
    # ERROR: ipykernel warns on every start that its TCP sockets (on 127.0.0.1, HMAC-signed) are not encrypted.
    write_kernel_spec(spec_dir, overrides={"display_name": f"Python 3 ({sys.executable})"},
                      extra_arguments=["--IPKernelApp.log_level=ERROR"])
    return Path(data_dir)
