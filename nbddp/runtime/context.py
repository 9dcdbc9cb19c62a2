"""`ddp`: the rank, device and process-group helpers that generated code uses.

Like nanoGPT's DDP block: under torchrun (WORLD_SIZE > 1) it joins the process group; as a single process
it defines the same names (rank 0, world size 1), so generated code never asks which mode it is in.
"""
import contextlib
import importlib.util
import inspect
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from nbddp.errors import UsageError

# transformers' bitsandbytes optimizers (transformers.trainer_optimizer._BITSANDBYTES_OPTIMIZERS): they need
# bitsandbytes and a CUDA device.
BITSANDBYTES_OPTIMIZERS = frozenset({
    "adamw_bnb_8bit", "adamw_8bit", "paged_adamw_32bit", "paged_adamw_8bit",
    "ademamix", "ademamix_8bit", "paged_ademamix_32bit", "paged_ademamix_8bit",
    "lion_32bit", "lion_8bit", "paged_lion_32bit", "paged_lion_8bit",
    "rmsprop_bnb", "rmsprop_bnb_8bit", "rmsprop_bnb_32bit",
})


class DistributedContext:
    """This process's place in the run; the generated script calls it `ddp`."""

    def __init__(self, rank=0, local_rank=0, world_size=1, local_world_size=1, device=torch.device("cpu")):
        self.rank = rank
        self.local_rank = local_rank
        self.world_size = world_size
        self.local_world_size = local_world_size
        self.device = device
        self.on_gpu = device.type == "cuda"
        self.is_main_process = rank == 0
        self._warned_optimizers = set()

    def __repr__(self):
        return f"DistributedContext(rank={self.rank}, world_size={self.world_size}, device={self.device})"

    def device_map(self):
        """For `from_pretrained(device_map=...)`: the whole model on this rank's GPU; None (CPU) otherwise."""
        return {"": self.local_rank} if self.on_gpu else None

    def barrier(self):
        if not dist.is_initialized():
            return
        if self.on_gpu:
            dist.barrier(device_ids=[self.local_rank])
        else:
            dist.barrier()

    @contextlib.contextmanager
    def main_process_first(self):
        """Local rank 0 runs the block first (downloads, caches, dataset maps), then the other ranks do."""
        if self.local_rank != 0:
            self.barrier()  # wait until local rank 0 has finished the block
        yield
        if self.local_rank == 0:
            self.barrier()  # let the others in

    def cap_num_proc(self, n):
        """`num_proc` for datasets: at most this machine's CPUs divided among its ranks, at least 1."""
        if n is None:
            return None
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        return max(1, min(n, cpus // self.local_world_size))

    def gpu_only(self, value):
        """`value` on a GPU, False on CPU: for flags such as fp16/bf16 that only a GPU can honour."""
        return value if self.on_gpu else False

    def optimizer(self, name):
        """`name`, or "adamw_torch" when `name` is a bitsandbytes optimizer that cannot run here."""
        if name not in BITSANDBYTES_OPTIMIZERS or (self.on_gpu and importlib.util.find_spec("bitsandbytes")):
            return name
        if self.is_main_process and name not in self._warned_optimizers:
            self._warned_optimizers.add(name)
            print(f"nbddp: optim={name!r} needs bitsandbytes and CUDA; using 'adamw_torch' here", file=sys.stderr)
        return "adamw_torch"

    def shutdown(self):
        """Wait for every rank, then leave the process group; harmless without one or when called twice."""
        if dist.is_initialized():
            self.barrier()
            dist.destroy_process_group()


def init_distributed() -> DistributedContext:
    """Read torchrun's environment and, when there is more than one process, join the process group."""
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
    if world_size > 1 and not dist.is_initialized():
        timeout = timedelta(seconds=float(os.environ.get("NBDDP_TIMEOUT_S", "1800")))
        if on_gpu:
            # Before anything touches CUDA, so no rank opens a context on GPU 0 by accident.
            torch.cuda.set_device(device)
            _init_nccl(device, timeout)
        else:
            dist.init_process_group("gloo", timeout=timeout)
            # accelerate (so Trainer) runs DDP over gloo only when told that this is a CPU run; without
            # it, every rank would silently train alone on the whole dataset.
            os.environ.setdefault("ACCELERATE_USE_CPU", "true")
    return DistributedContext(rank, local_rank, world_size, local_world_size, device)


def _init_nccl(device, timeout):
    # device_id binds the group to this rank's GPU (collectives and barriers then never default to GPU 0).
    if "device_id" in inspect.signature(dist.init_process_group).parameters:
        dist.init_process_group("nccl", timeout=timeout, device_id=device)
    else:
        dist.init_process_group("nccl", timeout=timeout)
