"""The Jupyter kernel papermill starts: this interpreter, whatever kernelspecs the machine has.

A user-level `python3` kernelspec (~/.local/share/jupyter) can point at another Python without
torch or nbddp. We write a run-local `python3` spec whose argv is `sys.executable` and put its
directory first on JUPYTER_PATH in the child's environment only; the notebook keeps its kernelspec
name `python3`, so the executed notebook opens anywhere.
"""

import json
import os
import sys
from pathlib import Path

import nbddp

KERNEL_NAME = "python3"


def write_kernelspec(data_dir):
    """A `python3` kernelspec running this interpreter, under `<data_dir>/kernels/`; returns `data_dir`."""
    spec_dir = Path(data_dir) / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True, exist_ok=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"Python 3 ({sys.executable})",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec, indent=1) + "\n", encoding="utf-8")
    return Path(data_dir)


def child_environment(cuda_visible_devices=None, jupyter_data_dir=None, environ=None):
    """The environment for a kernel or torchrun child.

    The child imports the same nbddp as this process (PYTHONPATH), sees the given devices, and,
    with `jupyter_data_dir`, finds our kernelspec before any other.
    """
    env = dict(os.environ if environ is None else environ)
    package_root = str(Path(nbddp.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    if cuda_visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices
    if jupyter_data_dir is not None:
        env["JUPYTER_PATH"] = os.pathsep.join(filter(None, [str(jupyter_data_dir), env.get("JUPYTER_PATH")]))
    return env
