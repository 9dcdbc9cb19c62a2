"""Whether this process is the main one (global rank 0), for what must happen once per job: a message, a save.

One test for the runtime and the fallback, the same before torchrun's process group exists (its RANK variable) and after
(the group's rank, also for a group a test or a notebook created without RANK).
"""
import os


def is_main_process() -> bool:
    """True on global rank 0, and in a process no launcher started (a notebook's kernel, a smoke run)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank() == 0
    return os.environ.get("RANK", "0") == "0"
