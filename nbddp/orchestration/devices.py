"""Which GPUs a child process will see, counted without torch (the parent never initialises CUDA)."""

import os
import shutil
import subprocess

from nbddp.errors import UsageError


def visible_gpus(environ=None):
    """The GPU ids a CUDA program started with `environ` would see, in order.

    CUDA_VISIBLE_DEVICES wins when set (CUDA stops at the first negative entry, so we do too);
    otherwise `nvidia-smi -L` lists the GPUs; no nvidia-smi means no GPUs.
    """
    environ = os.environ if environ is None else environ
    if "CUDA_VISIBLE_DEVICES" in environ:
        ids = []
        for entry in environ["CUDA_VISIBLE_DEVICES"].split(","):
            entry = entry.strip()
            if not entry or entry.startswith("-"):
                break
            ids.append(entry)
        return ids
    if shutil.which("nvidia-smi") is None:
        return []
    listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    if listing.returncode != 0:
        return []
    # "GPU 0: NVIDIA H200 (UUID: GPU-...)"; MIG lines are indented and not counted.
    return [line.split(":")[0].split()[1] for line in listing.stdout.splitlines() if line.startswith("GPU ")]


def single_device(device=None, environ=None):
    """The CUDA_VISIBLE_DEVICES value that leaves exactly one device visible.

    `device` is `cpu`, an index among the visible GPUs (a string, as typed after --device), or
    None for the first GPU if there is one, else the CPU. The CPU is `""`: CUDA then sees no device.
    """
    gpus = visible_gpus(environ)
    if device is None:
        return gpus[0] if gpus else ""
    if device == "cpu":
        return ""
    if not device.isdigit():
        raise UsageError(f"--device {device}: expected a GPU index or 'cpu'")
    index = int(device)
    if not gpus:
        raise UsageError(f"--device {device}: no GPU is visible; use --device cpu")
    if index >= len(gpus):
        raise UsageError(f"--device {device}: only {len(gpus)} GPU(s) visible; use 0..{len(gpus) - 1} or cpu")
    return gpus[index]
