"""`ddp`: the rank, device and process-group helpers that generated code uses.

Like nanoGPT's DDP block: under torchrun (WORLD_SIZE > 1) it joins the process group; as a single process
it defines the same names (rank 0, world size 1), so generated code never asks which mode it is in.
"""
import atexit
import builtins
import contextlib
import dataclasses
import functools
import importlib.util
import inspect
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import NamedTuple

import torch
import torch.distributed as dist

from nbddp import log
from nbddp.errors import UsageError
from nbddp.runtime import patches, smoke_sandbox, started_processes
from nbddp.runtime.memory import batch_plan
from nbddp.runtime.trainer import fsdp
from nbddp.runtime.trainer.optimizers import BITSANDBYTES_OPTIMIZERS
from nbddp.runtime.inputs.flags import process_group_timeout, running_in_kernel
from nbddp.runtime.once_per_machine import OncePerMachine


def _batch_keywords_from_command_line(kwargs, overrides) -> set[str]:
    """The batch keywords of a config's `kwargs` that the command line gave (batch_plan): by `--set`, or by the
    script's flag of the same name whose value the notebook passed on (NBDDP_PER_PROCESS)."""
    given = {override.name for override in overrides} & set(batch_plan.BATCH_KEYWORDS)
    flags = batch_plan.command_line_values()
    return given | {name for name, text in flags.items() if name in kwargs and str(kwargs[name]) == text}


class CpuProperties(NamedTuple):
    """What `ddp.device_properties()` gives without a GPU (torch.cuda's device properties have these fields)."""
    name: str
    total_memory: int  # bytes


class DistributedContext:
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

    def show(self, value):
        """What Jupyter does with a cell's last value, once: display it on the main process unless it is None.
        `display` is IPython's in a kernel, nbddp's printing one in a script (see
        nbddp.runtime.reporting.script_display)."""
        if value is not None and self.is_main_process:
            builtins.display(value)

    def shell(self, command, namespace=None):
        """A notebook's `!command`, run as IPython runs it (`$SHELL -c command`) but once per machine: the first
        rank of the machine to get here runs it, and one that gets here meanwhile waits for it to finish, so that
        a `!wget` or `!git clone` fetches once and every rank then finds the files (see once_per_machine; not a
        collective: a rank that skips the call, under a condition or outside a rank-0 block, waits for nothing).
        A command that fails does not stop the script, as it does not stop a notebook (IPython's default): a
        `!git clone` that finds its folder from the smoke run, or from the run before, must not end the training
        run. Its exit status is reported on stderr, naming the command as written (a filled-in secret stays out
        of the logs); the files it should have made then fail where they are used. The command writes to the
        script's own stdout and stderr (not through Python: a pipe would hang on `!server &`, turn progress
        bars' `\r` into lines and hold back unflushed output), and reads no input, so that a prompt (`apt-get`
        without `-y`) fails instead of waiting unseen.

        `namespace` (the script's variables, which convert-magics passes for a command with `{...}` or `$`):
        IPython's expansion, `!wget {url}` -> `wget https://...`, done by IPython's own formatter; where it
        fails (`{a,b}` for bash, a JSON body, an unknown `$HOME`) the command runs as written, as in IPython."""
        expanded = command if namespace is None else _expand_like_ipython(command, namespace)
        with self._once.claim(f"shell\0{expanded}") as first:
            if first:
                sys.stdout.flush()  # the command's output after what the script printed before it
                sys.stderr.flush()
                status = subprocess.run(expanded, shell=True, executable=os.environ.get("SHELL") or None,
                                        stdin=subprocess.DEVNULL).returncode
                if status:
                    log.warning(f"nbddp: warning: `!{command}` exited with status {status}; the script goes on, as a "
                                "notebook does")

    def write_file(self, path, text, append=False):
        """A notebook's `%%writefile [-a] path` cell: write its text once per machine, as `shell` runs a command,
        and say so as IPython does; in a smoke run, under its folder (smoke_sandbox)."""
        with self._once.claim(f"write_file\0{path}\0{append}\0{text}") as first:
            if first:
                path = Path(smoke_sandbox.redirected(path)).expanduser()
                verb = ("Appending to" if append else "Overwriting") if path.exists() else "Writing"
                with open(path, "a" if append else "w", encoding="utf-8") as file:
                    file.write(text)
                print(f"{verb} {path}", flush=True)

    def start_process(self, start):
        """A cell's `subprocess.Popen(...)` (a server), as `ddp.start_process(lambda: subprocess.Popen(...))`: started
        once per machine, as `shell` runs a command; the other ranks get a handle on that process
        (started_processes)."""
        return started_processes.start_once(start, self._once)

    def device_properties(self, device=None):
        """For a notebook's `torch.cuda.get_device_properties(0)`: this rank's GPU; on the CPU a stand-in with the
        fields memory-stats cells read, `name` and `total_memory` (the host's memory), so such a cell runs there
        (`torch.cuda.max_memory_reserved()` is 0 without CUDA). With `device` (a notebook's
        `get_device_properties(i)` over `range(torch.cuda.device_count())`): that GPU, as the notebook asks torch,
        and the same stand-in on the CPU."""
        if self.on_gpu:
            return torch.cuda.get_device_properties(self.device if device is None else device)
        return CpuProperties("CPU (no GPU)", os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))

    def max_steps(self, steps):
        """`max_steps` for training arguments: the notebook's `steps` (-1: train by epochs), or at most
        NBDDP_MAX_STEPS when that is set. `pipeline.py smoke` sets it to its few steps, so that a smoke run takes
        them rather than the notebook's whole training (its epochs; a `max_steps` that is no parameter)."""
        text = os.environ.get("NBDDP_MAX_STEPS")
        if not text:
            return steps
        if not text.strip().isdigit() or int(text) < 1:
            raise UsageError(f"NBDDP_MAX_STEPS={text!r}: expected a whole number of steps, 1 or more")
        by_epochs = steps is None or steps < 1
        capped = int(text) if by_epochs else min(int(text), steps)
        if self.is_main_process and capped != steps:
            written = "its epochs" if by_epochs else f"{steps} steps"
            log.warning(f"nbddp: NBDDP_MAX_STEPS={text.strip()}: training stops after {capped} steps (the notebook "
                        f"says {written})")
        return capped

    def output_dir(self, path):
        """`output_dir` for training arguments: the notebook's `path`, or NBDDP_OUTPUT_DIR when that is set
        (`pipeline.py smoke` and `run` set it to their run folder for a script without an `output_dir` parameter)."""
        return os.environ.get("NBDDP_OUTPUT_DIR") or path

    def training_args(self, config_class):
        """For a notebook's `SFTConfig(...)` (any TrainingArguments-family config), which export writes as
        `ddp.training_args(SFTConfig)(...)`: the config built with the `--set` overrides (training_overrides) and
        the batch laid out for this run's processes (batch_plan, `--batch_layout`), bf16 off on a CPU unless given,
        FSDP set under `--strategy fsdp` (trainer.fsdp); rank 0 prints the layout."""

        @functools.wraps(config_class)
        def build(*args, **kwargs):
            from nbddp.runtime.inputs import training_overrides

            overrides = training_overrides.from_environment()
            kwargs, notes = training_overrides.apply(config_class, kwargs, overrides)
            if "max_steps" in kwargs and os.environ.get("NBDDP_MAX_STEPS"):  # caps `--set max_steps=N` too
                kwargs["max_steps"] = self.max_steps(kwargs["max_steps"])
            command_line = _batch_keywords_from_command_line(kwargs, overrides)
            kwargs = smoke_sandbox.training_kwargs(config_class.__name__, kwargs)  # a smoke run pushes nothing
            if not self.on_gpu:  # TRL's configs turn bf16 on when it is not given, which a CPU cannot run
                kwargs.setdefault("bf16", False)
            micro_batch, accumulation = (kwargs.get(name, _field_default(config_class, name))
                                         for name in ("per_device_train_batch_size", "gradient_accumulation_steps"))
            generation = [kwargs.get(name, _field_default(config_class, name))
                          for name in ("num_generations", "generation_batch_size", "steps_per_generation")]
            grouped = batch_plan.one_gpu_grpo_micro_batch(micro_batch, accumulation, *generation)
            plan = batch_plan.plan(grouped, accumulation, self._planned_processes(), self.batch_layout,
                                   running=self.world_size, command_line=command_line)
            problem = batch_plan.generation_batch_problem(plan, *generation)
            if problem:
                raise UsageError(f"{config_class.__name__}: {problem}")
            kwargs.update(per_device_train_batch_size=plan.micro_batch, gradient_accumulation_steps=plan.accumulation_here)
            if fsdp.active():
                kwargs = fsdp.training_kwargs(kwargs)
            config = config_class(*args, **kwargs)
            config.nbddp_batch_plan = plan  # read by fuller_batch (auto) and MetricsCallback (metrics.jsonl)
            batch_plan.remember(plan)
            if self.is_main_process:
                name = config_class.__name__
                for note in notes:
                    log.info(f"nbddp: {name}: --set {note}")
                if grouped != micro_batch:
                    log.info(f"nbddp: {name}: per_device_train_batch_size {micro_batch} -> {grouped} on one device, a "
                             f"multiple of num_generations={generation[0]}, as Unsloth sets it")
                log.info(f"nbddp: {name}: {plan.describe()}")
                if plan.warning:
                    log.warning(f"nbddp: warning: {name}: {plan.warning}")
            return config

        return build

    def _planned_processes(self) -> int:
        """The processes the batch is laid out for: this run's, or NBDDP_PLAN_PROCESSES on one process (the smoke
        run's layout check trains as the torchrun run will)."""
        text = os.environ.get("NBDDP_PLAN_PROCESSES")
        if not text or self.world_size > 1:
            return self.world_size
        if not text.strip().isdigit() or int(text) < 1:
            raise UsageError(f"NBDDP_PLAN_PROCESSES={text!r}: expected a whole number of processes, 1 or more")
        return int(text)

    def metrics_callback(self):
        """nbddp's MetricsCallback writing to the trainer's `<output_dir>/metrics.jsonl`, for a trainer a notebook
        built without callbacks (the rewrite record-metrics adds it): what `pipeline.py run` and `regress` read."""
        # imports transformers: only once a trainer is built
        from nbddp.runtime.reporting.metrics import MetricsCallback

        return MetricsCallback()

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
            log.warning(f"nbddp: optim={name!r} needs bitsandbytes and CUDA; using 'adamw_torch' here")
        return "adamw_torch"

    def checkpoint_to_resume(self, trainer):
        """For `trainer.train(resume_from_checkpoint=...)`: the newest complete checkpoint of the trainer (in its
        output_dir, or in its own folder there: see `training_checkpoints.checkpoint_folder`) when this run resumes
        (`--resume`, or torchrun restarted the workers), else None. Rank 0 chooses, every rank gets its choice;
        a checkpoint of another global batch is refused (`training_checkpoints.resume_point`).
        """
        if not self.resume:
            return None
        from nbddp.runtime.trainer import training_checkpoints  # imports transformers: only once a trainer is built

        why = f"torchrun restart {self.restart_count}" if self.restart_count else "--resume"
        return training_checkpoints.resume_point(trainer, why, self.world_size)

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


def _field_default(config_class, name):
    """The default `config_class(...)` gives `name`: its `__init__`'s (Unsloth's compiled configs declare their
    own, 4 x 2 where the dataclass fields say 8 x 1), else the dataclass field's; None when it has neither."""
    parameter = inspect.signature(config_class.__init__).parameters.get(name)
    if parameter is not None and parameter.default is not inspect.Parameter.empty:
        return parameter.default
    field = getattr(config_class, "__dataclass_fields__", {}).get(name)
    if field is None:
        return None
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None if field.default is dataclasses.MISSING else field.default


def _expand_like_ipython(command, namespace):
    from IPython.utils.text import DollarFormatter  # only for the commands that use expansion

    try:
        return DollarFormatter().vformat(command, args=[], kwargs=namespace)
    except Exception:  # what InteractiveShell.var_expand does: any failure leaves the command as written
        return command


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
    timeout = process_group_timeout()  # checked on one process too: a smoke run finds a bad NBDDP_TIMEOUT_S
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
