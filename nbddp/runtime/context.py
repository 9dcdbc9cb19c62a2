"""`ddp`: the one object generated code calls, and how a process gets it (`init_distributed`).

DistributedContext is three things, a module each: the DDP core (ddp_core: rank, device, `device_map`, `barrier`,
`main_process_first`, `shutdown`), notebook emulation (notebook_emulation: `show`, `shell`, `write_file`,
`start_process`) and run overrides (run_overrides: `max_steps`, `output_dir`, `training_args`, `optimizer`,
`checkpoint_to_resume`, ...). Here: the state they share, and joining the process group under torchrun.
"""
import functools
import inspect
import os

import torch
import torch.distributed as dist

from nbddp import patches
from nbddp.errors import UsageError
from nbddp.runtime.ddp_core import DdpCore
from nbddp.runtime.inputs.flags import process_group_timeout
from nbddp.runtime.memory import batch_plan
from nbddp.runtime.notebook_emulation import NotebookEmulation
from nbddp.runtime.once_per_machine import OncePerMachine
from nbddp.runtime.run_overrides import RunOverrides
from nbddp.runtime.trainer import fsdp


class DistributedContext(DdpCore, NotebookEmulation, RunOverrides):
    """This process's place in the run; the generated script calls it `ddp`."""

    def __init__(self, rank=0, local_rank=0, world_size=1, local_world_size=1, device=torch.device("cpu"),
                 resume=False, restart_count=0, batch_layout="notebook"):
        self.rank = rank
        self.local_rank = local_rank
        self.world_size = world_size
        self.local_world_size = local_world_size
        self.device = device
        self.on_gpu = device.type == "cuda"
        self.is_main_process = rank == 0
        self.restart_count = restart_count  # torchrun restarted the workers this many times (--max-restarts)
        self.resume = resume or restart_count > 0  # a restarted worker continues where the group left off
        self.batch_layout = batch_plan.parse_layout(batch_layout)  # see batch_plan: how N processes share the batch
        self._warned_optimizers = set()
        self._once = OncePerMachine(local_world_size)

    def __repr__(self):
        return f"DistributedContext(rank={self.rank}, world_size={self.world_size}, device={self.device})"


def init_distributed(resume=False, batch_layout="notebook") -> DistributedContext:
    """Read torchrun's environment and, when there is more than one process, join the process group."""
    restart_count = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", str(world_size)))
    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda", local_rank) if on_gpu else torch.device("cpu")
    if on_gpu and local_rank >= torch.cuda.device_count():
        raise UsageError(
            f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} CUDA devices are visible: "
            f"use torchrun --nproc_per_node {torch.cuda.device_count()} or fewer"
        )
    timeout = process_group_timeout()  # checked on one process too: a smoke run finds a bad timeout_s setting
    # FSDP shards over a process group, which torchrun's one process gets too (`--strategy fsdp` on one GPU)
    if (world_size > 1 or (fsdp.active() and "LOCAL_RANK" in os.environ)) and not dist.is_initialized():
        if on_gpu:
            # Before anything touches CUDA, so no rank opens a context on GPU 0 by accident.
            torch.cuda.set_device(device)
            _init_nccl(device, timeout)
        else:
            dist.init_process_group("gloo", timeout=timeout)
            # accelerate (so Trainer) runs DDP over gloo only when told that this is a CPU run; without
            # it, every rank would silently train alone on the whole dataset.
            patches.set_item("accelerate-use-cpu", os.environ, "ACCELERATE_USE_CPU", "true", default_only=True)
            _load_onto_indexed_cpu()
    return DistributedContext(rank, local_rank, world_size, local_world_size, device, resume, restart_count,
                              batch_layout)


@functools.cache  # once per process
def _load_onto_indexed_cpu():
    """Let `torch.load(map_location=torch.device("cpu", 0))` work.

    accelerate gives every CPU process of a distributed run the device `cpu:0` (state.py, `set_device`), and Trainer
    loads a checkpoint's optimizer state with `map_location=args.device` when the world is larger than 1
    (`_load_optimizer_and_scheduler`); torch only knows the location "cpu", so resuming a gloo run failed with
    "don't know how to restore data location of torch.storage.UntypedStorage (tagged with cpu:0)".
    Registered after torch's own "cpu" (priority 10); it tags nothing when saving.
    """
    torch.serialization.register_package(11, lambda storage: None, _indexed_cpu)
    patches.record("indexed-cpu-storage", None)  # torch has no unregister; it only restores what torch refused


def _indexed_cpu(storage, location):
    return storage if location.startswith("cpu:") else None


def _init_nccl(device, timeout):
    # device_id binds the group to this rank's GPU (collectives and barriers then never default to GPU 0).
    if "device_id" in inspect.signature(dist.init_process_group).parameters:
        dist.init_process_group("nccl", timeout=timeout, device_id=device)
    else:
        dist.init_process_group("nccl", timeout=timeout)
