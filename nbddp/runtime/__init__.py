"""The runtime that generated scripts import. The generated setup cell is:

    from nbddp import runtime
    ddp = runtime.setup(globals())

`setup` turns the parameters into command-line flags (`inputs.flags`), joins torchrun's process group, picks
the backend, gives every Trainer completion markers for its checkpoints (`trainer.training_checkpoints`) and returns
`ddp` (a `context.DistributedContext`, the one object generated code calls), which knows whether this run resumes.
torch is imported only after the flags are read, so `train.py --help` answers at once; transformers, trl and peft
only after Unsloth, or (hf backend) when `setup` patches TRL (see `backend`).

The rooms: `context` (the `ddp.` facade) and what it uses directly (`once_per_machine`, `started_processes`,
`working_directory`, `smoke_sandbox`); `backend` (real Unsloth or the Transformers+PEFT fallback, `nbddp.fallback`)
and `packed_attention` (what it changes in real Unsloth); `trainer` (what every Trainer gets under DDP); `memory`
(batch layout, memory estimate, gradient checkpointing); `inputs` (flags, `--set`, data, output folders);
`reporting` (metrics, progress, heartbeats, tracebacks). What the runtime shares with the fallback is nbddp's,
beside the rooms: `nbddp.patches` (every change to other libraries, with why), `nbddp.rank`,
`nbddp.gradient_checkpointing_modes` (the values of `use_gradient_checkpointing`).
"""
import builtins
import importlib
import importlib.abc
import importlib.util
import os
import sys

from nbddp import log
from nbddp.errors import NbddpError
from nbddp.runtime.inputs.flags import apply_flags, defined_in, running_in_kernel
from nbddp.formats.script_parameters import BACKEND, BATCH_LAYOUT, RESUME, STRATEGY, WORKDIR

__all__ = ["setup"]

# The runtime's modules that notebooks import, at the paths they had before the runtime was grouped into rooms:
# notebooks made by `nbddp new` until then import them there. require_model's module moved on, out of the runtime:
# the fallback's from_pretrained calls it too.
MOVED = {
    "nbddp.runtime.data": "nbddp.runtime.inputs.data",
    "nbddp.runtime.models": "nbddp.model_names",
    "nbddp.runtime.inputs.models": "nbddp.model_names",
    "nbddp.runtime.tiny_model": "nbddp.examples.tiny_model",
    "nbddp.runtime.backends.tiny_model": "nbddp.examples.tiny_model",
    "nbddp.runtime.checkpointing": "nbddp.runtime.memory.gradient_checkpointing",
    "nbddp.runtime.metrics": "nbddp.runtime.reporting.metrics",
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports a MOVED old path as the module at its new one (the same module object), and a package that held one
    and is gone (nbddp.runtime.backends) as an empty package."""

    def find_spec(self, name, path=None, target=None):
        if name in MOVED:
            return importlib.util.spec_from_loader(name, self)
        if any(old.startswith(f"{name}.") for old in MOVED):
            return importlib.util.spec_from_loader(name, self, is_package=True)
        return None

    def create_module(self, spec):
        return importlib.import_module(MOVED[spec.name]) if spec.name in MOVED else None

    def exec_module(self, module):
        pass


sys.meta_path.append(_MovedModules())


def setup(namespace: dict | None = None, *, backend: str = "auto", script: str | None = None, resume: bool = False,
          batch_layout="notebook", strategy="auto", workdir: str = ""):
    """Prepare this process for the notebooks' code and return its `DistributedContext`.

    `namespace`: a generated script's globals, right after its parameters cell: its flags are applied to them
    (`flags.apply_flags`, with the notebooks of `flags.defined_in(__file__)`), and `backend`, `resume`,
    `batch_layout`, `workdir` and `script` (`__file__`) are read from them. A notebook's own setup cell passes
    those as keywords instead: `setup(backend="auto", script=None)`.
    `workdir`: where the cells run (see `working_directory`), the notebooks' folder in a generated script.
    `resume`: `trainer.train()` continues from the newest complete checkpoint (see
    `DistributedContext.checkpoint_to_resume`); a worker torchrun restarted resumes without being asked.
    `batch_layout`: how the processes share the notebook's batch (`batch_plan`).
    `strategy`: "ddp", "fsdp" to shard the model across the GPUs (`trainer.fsdp`; the hf backend), or "auto":
    FSDP when the memory estimate says one rank does not fit one GPU (`trainer.auto_strategy`).
    """
    if namespace is not None:
        script = namespace.get("__file__")
        apply_flags(namespace, defined_in(script))
        backend, resume, batch_layout, strategy, workdir = (namespace.get(name, default) for name, default in (
            (BACKEND, backend), (RESUME, resume), (BATCH_LAYOUT, batch_layout), (STRATEGY, strategy),
            (WORKDIR, workdir)))
    from nbddp import patches
    from nbddp.runtime import working_directory
    from nbddp.runtime.backend import activate as activate_backend, choose as choose_backend
    from nbddp.runtime.inputs import training_overrides
    from nbddp.runtime.reporting import heartbeat, script_display, tracebacks
    from nbddp.runtime.trainer import auto_strategy, fsdp
    import torch
    from nbddp.runtime.context import init_distributed

    script_mode = not running_in_kernel()
    if script_mode and script is not None:
        tracebacks.install(script)
    if script_mode and not hasattr(builtins, "display"):
        patches.set_attribute("notebook-display", builtins, "display", script_display.display)
    try:
        started_in = working_directory.enter(workdir, script)
        auto = None
        if strategy == "auto":  # the model's config is read from the cells' folder
            auto = auto_strategy.choose(script, namespace, backend, int(os.environ.get("WORLD_SIZE", "1")),
                                        int(os.environ.get("LOCAL_RANK", "0")))
            strategy = auto.strategy
        strategy, backend = fsdp.choose(strategy, backend, torch.cuda.is_available())
        chosen, reason = choose_backend(backend)
        if strategy == "fsdp":
            reason = "--strategy fsdp: Unsloth's kernels do not shard, so Transformers+PEFT"
        ddp = init_distributed(resume, batch_layout)
        heartbeat.start(ddp.rank)  # under `pipeline.py launch`, which names a rank that stops beating as hung
        activate_backend(chosen)
        from nbddp.runtime import graphed_layers  # imports transformers: once the backend is active
        from nbddp.runtime.trainer import one_launch_optimizer
        training_overrides.check(training_overrides.from_environment())  # --set: before any work
        graphed_layers.wanted()  # the run setting `cuda_graphs`: a value neither on nor off, before any work too
        one_launch_optimizer.install()  # the run setting `one_launch_optimizer`: checked the same way
    except NbddpError as error:
        if not script_mode:
            raise
        print(f"nbddp: error: {error}", file=sys.stderr)
        sys.exit(error.exit_status)
    from nbddp.runtime import smoke_sandbox  # imports transformers: once the backend is active
    from nbddp.runtime.inputs import data
    from nbddp.runtime.trainer import training_checkpoints

    training_checkpoints.register()
    data.register()
    smoke_sandbox.install(started_in, namespace)  # a smoke run (`smoke_dir` set): saves into its folder, no pushes
    if ddp.is_main_process:
        if auto is not None:
            (log.warning if auto.warning else log.info)(auto_strategy.describe(auto))
        log.info(f"nbddp: backend={chosen} ({reason}) strategy={strategy} world_size={ddp.world_size} "
                 f"device={ddp.device}")
        patches.announce()
    else:
        _no_progress_bars()
    return ddp


def _no_progress_bars():
    """On ranks other than 0: no Hugging Face progress bars, copies of rank 0's (datasets' map, loading weights),
    each refresh of which torchrun's pipes make a console line."""
    import datasets
    import huggingface_hub.utils
    import transformers.utils.logging

    datasets.disable_progress_bars()
    huggingface_hub.utils.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
