"""The environment of the processes we start (a Jupyter kernel, torchrun and its workers)."""

import os
from pathlib import Path

import nbddp


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
