"""The DDP core of `ddp`: this process's place in the process group, its device, and the group's collectives.

Like nanoGPT's DDP block: under torchrun (WORLD_SIZE > 1) the process has joined the process group
(`context.init_distributed`); as a single process the same names hold (rank 0, world size 1, barriers that return at
once), so generated code never asks which mode it is in.
"""
import atexit
import contextlib
import os
import sys
import threading
from typing import NamedTuple

import torch
import torch.distributed as dist

from nbddp.runtime.inputs.flags import running_in_kernel


class CpuProperties(NamedTuple):
    """What `ddp.device_properties()` gives without a GPU (torch.cuda's device properties have these fields)."""
    name: str
    total_memory: int  # bytes


class DdpCore:
    """`ddp.device_map()`, `barrier()`, `main_process_first()`, `device_properties()` and `shutdown()`; part of
    DistributedContext, whose attributes they read (rank, local_rank, device, on_gpu, _once)."""

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

    def device_properties(self, device=None):
        """For a notebook's `torch.cuda.get_device_properties(0)`: this rank's GPU; on the CPU a stand-in with the
        fields memory-stats cells read, `name` and `total_memory` (the host's memory), so such a cell runs there
        (`torch.cuda.max_memory_reserved()` is 0 without CUDA). With `device` (a notebook's
        `get_device_properties(i)` over `range(torch.cuda.device_count())`): that GPU, as the notebook asks torch,
        and the same stand-in on the CPU."""
        if self.on_gpu:
            return torch.cuda.get_device_properties(self.device if device is None else device)
        return CpuProperties("CPU (no GPU)", os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))

    def shutdown(self):
        """Wait for every rank, remove the machine's once-per-machine folder (local rank 0), then leave the process
        group; harmless without one or when called twice.

        A script (not a kernel) whose group was gloo then ends here, with status 0, without the interpreter's
        finalization: see `exit_without_finalization`. It is the generated script's last statement.
        """
        if not dist.is_initialized():
            return
        gloo = dist.get_backend() == "gloo"
        self.barrier()
        if self.local_rank == 0:
            self._once.remove()  # every rank of the machine is past its last `!command` and `%%writefile`
        dist.destroy_process_group()
        if gloo and not running_in_kernel():
            exit_without_finalization()


def exit_without_finalization(status: int = 0):
    """End the process with `status` as interpreter exit would (join non-daemon threads, run atexit callbacks,
    flush stdout and stderr), then `os._exit`, before CPython finalizes.

    Why: gloo's worker threads outlive `destroy_process_group()`. The backend's shutdown() (and abort())
    leave them running; only its destructor joins them, and the Trainer's DDP wrapper and
    torch.distributed.nn.functional's default arguments keep the group alive until finalization. A worker
    drops its last reference to a finished collective after the caller has returned, and the work owns
    tensors Python also sees (some, Python objects in their captured thread-local state); a gloo barrier
    keeps the works in flight when it was enqueued alive through weak references, so on a rank that calls
    `ddp.barrier()` back to back (rank 1, while rank 0 saves and generates) the Trainer's last all_gather is
    freed together with the final barrier, as the process exits. Freeing them takes the GIL, and once
    finalization has begun CPython 3.11 ends a thread that asks for it with pthread_exit, whose unwinding
    through a noexcept destructor calls std::terminate ("terminate called without an active exception",
    SIGABRT; about 1 run in 6 on two busy cores). The core dump's stack: ProcessGroupGloo::runLoop ->
    ~AsyncBarrierWork x3 -> ~AsyncAllgatherWork -> TensorImpl::decref_pyobject -> gil_scoped_acquire ->
    take_gil -> PyThread_exit_thread -> pthread_exit -> std::terminate, the main thread in Py_FinalizeEx.
    No public API waits for those workers, so a script that ran gloo skips finalization instead. See
    https://github.com/pytorch/pytorch/issues/190489 and https://github.com/pytorch/pytorch/pull/179291.
    """
    threading._shutdown()  # what interpreter exit does first: join non-daemon threads (private, like the next)
    atexit._run_exitfuncs()  # logging.shutdown, tempfile and weakref finalizers, multiprocessing cleanup
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or file: CPython's own exit reports status 120 then
            status = 120
    os._exit(status)
