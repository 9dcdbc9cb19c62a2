"""Run overrides in `ddp`: what this run sets over the notebook's training.

The run's length and folder (the run settings `max_steps` and `output_dir`, set by `pipeline.py smoke` and `run`), the
training arguments built with the `--set` overrides and the batch laid out for this run's processes (`training_args`),
what this machine can honour (`gpu_only`, `optimizer`, `cap_num_proc`), nbddp's metrics callback, and the checkpoint a
resumed run continues from.
"""
import dataclasses
import functools
import importlib.util
import inspect
import os

from nbddp import log
from nbddp.errors import UsageError
from nbddp.formats.run_settings import ENV
from nbddp.runtime import smoke_sandbox
from nbddp.runtime.inputs import training_overrides
from nbddp.runtime.memory import batch_plan
from nbddp.runtime.trainer import fsdp
from nbddp.runtime.trainer.optimizers import BITSANDBYTES_OPTIMIZERS


class RunOverrides:
    """`ddp.max_steps()`, `output_dir()`, `training_args()`, `metrics_callback()`, `cap_num_proc()`, `gpu_only()`,
    `optimizer()` and `checkpoint_to_resume()`; part of DistributedContext, whose attributes they read (world_size,
    local_world_size, on_gpu, is_main_process, batch_layout, resume, restart_count, _warned_optimizers)."""

    def max_steps(self, steps):
        """`max_steps` for training arguments: the notebook's `steps` (-1: train by epochs), or at most
        the run setting `max_steps` when that is set. `pipeline.py smoke` sets it to its few steps, so that a smoke run
        takes them rather than the notebook's whole training (its epochs; a `max_steps` that is no parameter)."""
        text = os.environ.get(ENV.MAX_STEPS)
        if not text:
            return steps
        if not text.strip().isdigit() or int(text) < 1:
            raise UsageError(f"{ENV.MAX_STEPS}={text!r}: expected a whole number of steps, 1 or more")
        by_epochs = steps is None or steps < 1
        capped = int(text) if by_epochs else min(int(text), steps)
        if self.is_main_process and capped != steps:
            written = "its epochs" if by_epochs else f"{steps} steps"
            log.warning(f"nbddp: {ENV.MAX_STEPS}={text.strip()}: training stops after {capped} steps (the notebook "
                        f"says {written})")
        return capped

    def output_dir(self, path):
        """`output_dir` for training arguments: the notebook's `path`, or the run setting `output_dir` when that is set
        (`pipeline.py smoke` and `run` set it to their run folder for a script without an `output_dir` parameter)."""
        return os.environ.get(ENV.OUTPUT_DIR) or path

    def training_args(self, config_class):
        """For a notebook's `SFTConfig(...)` (any TrainingArguments-family config), which export writes as
        `ddp.training_args(SFTConfig)(...)`: the config built with the `--set` overrides (training_overrides) and
        the batch laid out for this run's processes (batch_plan, `--batch_layout`), bf16 off on a CPU unless given,
        FSDP set under `--strategy fsdp` (trainer.fsdp); rank 0 prints the layout."""

        @functools.wraps(config_class)
        def build(*args, **kwargs):
            overrides = training_overrides.from_environment()
            kwargs, notes = training_overrides.apply(config_class, kwargs, overrides)
            if "max_steps" in kwargs and os.environ.get(ENV.MAX_STEPS):  # caps `--set max_steps=N` too
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
        """The processes the batch is laid out for: this run's, or the run setting `plan_processes` on one process (the
        smoke run's layout check trains as the torchrun run will)."""
        text = os.environ.get(ENV.PLAN_PROCESSES)
        if not text or self.world_size > 1:
            return self.world_size
        if not text.strip().isdigit() or int(text) < 1:
            raise UsageError(f"{ENV.PLAN_PROCESSES}={text!r}: expected a whole number of processes, 1 or more")
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


def _batch_keywords_from_command_line(kwargs, overrides) -> set[str]:
    """The batch keywords of a config's `kwargs` that the command line gave (batch_plan): by `--set`, or by the
    script's flag of the same name whose value the notebook passed on (the run setting `per_process`)."""
    given = {override.name for override in overrides} & set(batch_plan.BATCH_KEYWORDS)
    flags = batch_plan.command_line_values()
    return given | {name for name, text in flags.items() if name in kwargs and str(kwargs[name]) == text}


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
