"""Per-step device timing inside a training process, with no change to the script being measured.

`install(...)` registers a post-import hook on `transformers.trainer`, so nothing here imports
transformers before the script does (Unsloth must be imported first). Once the module loads,
`Trainer.train` is wrapped: the wrapper adds a `StepTimer` callback, applies DDP keyword overrides
to the accelerator and removes named callbacks (bench variants), times batch fetching on the instance (Unsloth checks the
class method's source, so the class is left alone), runs training and writes
`<result_dir>/rank<R>.json`.

Beside each step's host time, the time Python's cyclic garbage collector ran in it (`gc_ms`, from
`gc.callbacks`), since a host-bound step pays for every collection, and each micro batch's `input_ids` shape
(`batch_shapes`, padding included), which sets the step's activation memory.

Step time is the device-side interval between CUDA events recorded at consecutive `on_step_end`s,
so it covers everything in a step: batch fetch, forward/backward of every micro batch, gradient
all-reduce and optimizer. Events are read once, after training, so timing adds no synchronisation
to the steps; the one synchronisation at step 1 (wall time to first step) falls in warm-up.

With `profile_steps=(first, last)`, torch.profiler records steps first..last (the harness puts them after
the timed steps) and each rank writes `rank<R>_profile.json` (bench.profile_summary: busy, collective and
idle time per GPU), `rank<R>_ops.txt` (the profiler's operator table) and `rank<R>_trace.json.gz`.
"""
import gc
import importlib.abc
import importlib.util
import json
import os
import subprocess
import sys
import time

from bench.profile_summary import summarize_trace_file

ROW_SAMPLE = 64  # training rows whose token count is checked against the expected fixed length


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Runs `patch(module)` right after `module_name` has executed, whoever imports it first."""

    def __init__(self, module_name, patch):
        self.module_name = module_name
        self.patch = patch

    def find_spec(self, fullname, path, target=None):
        if fullname != self.module_name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        execute = spec.loader.exec_module

        def exec_then_patch(module):
            execute(module)
            self.patch(module)

        spec.loader.exec_module = exec_then_patch
        return spec


def install(result_dir, t0, ddp_overrides=None, remove_callbacks=(), profile_steps=None):
    """Arrange for the next `Trainer.train` call in this process to be timed and reported; `remove_callbacks`
    names callback classes to take off the trainer first (to measure what they cost); `profile_steps`
    (first, last) are profiled."""
    report = Report(result_dir, t0, ddp_overrides or {}, tuple(remove_callbacks), profile_steps)
    if "transformers.trainer" in sys.modules:
        _wrap_train(sys.modules["transformers.trainer"], report)
    else:
        sys.meta_path.insert(0, _PatchAfterImport("transformers.trainer", lambda m: _wrap_train(m, report)))
    return report


def _wrap_train(trainer_module, report):
    original_train = trainer_module.Trainer.train

    def train(self, *args, **kwargs):
        report.attach(self)
        try:
            return original_train(self, *args, **kwargs)
        finally:
            report.write()

    train.__wrapped__ = original_train
    trainer_module.Trainer.train = train


def _input_shape(batch):
    """A micro batch's input_ids shape (host metadata: no sync), None for a batch without them."""
    ids = batch.get("input_ids") if hasattr(batch, "get") else None
    return list(ids.shape) if hasattr(ids, "shape") else None


def _rank_and_world():
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def _gpu_processes():
    """nvidia-smi's view of which processes hold a context on which GPU (a rank on another's GPU shows here)."""
    query = ["nvidia-smi", "--query-compute-apps=gpu_bus_id,pid,used_memory", "--format=csv,noheader"]
    gpus = ["nvidia-smi", "--query-gpu=index,pci.bus_id", "--format=csv,noheader"]
    try:
        apps = subprocess.run(query, capture_output=True, text=True, timeout=20).stdout.strip().splitlines()
        index = subprocess.run(gpus, capture_output=True, text=True, timeout=20).stdout.strip().splitlines()
    except (OSError, subprocess.TimeoutExpired) as error:
        return {"error": str(error)}
    return {"gpus": index, "compute_apps": apps}


class Report:
    """Collects one rank's measurements during training and writes them as JSON."""

    def __init__(self, result_dir, t0, ddp_overrides, remove_callbacks=(), profile_steps=None):
        self.result_dir = result_dir
        self.t0 = t0
        self.ddp_overrides = ddp_overrides
        self.remove_callbacks = remove_callbacks
        self.profile_steps = profile_steps
        self.profiler = None
        self.profile_started = None
        self.trainer = None
        self.events = []  # CUDA events at on_step_end (index 0: train begin)
        self.host_times = []  # perf_counter at the same points
        self.fetch_ms = []
        self.batch_shapes = []  # per optimizer step: each micro batch's input_ids shape, padding included
        self.gc_ms = []  # per interval from each mark on: ms the cyclic collector ran in it
        self.gc_started = None
        self.data = {"t_train_called_s": None, "t_first_step_s": None}

    def attach(self, trainer):
        import torch
        from transformers import TrainerCallback

        self.trainer = trainer
        self.cuda = torch.cuda.is_available()
        self.data["t_train_called_s"] = time.time() - self.t0
        if self.ddp_overrides:
            self._apply_ddp_overrides(trainer)
            wrap_model = trainer._wrap_model

            def wrap_then_override(*args, **kwargs):  # transformers 4.x makes a new ddp_handler here, in train()
                model = wrap_model(*args, **kwargs)
                self._apply_ddp_overrides(trainer)
                return model

            trainer._wrap_model = wrap_then_override
        for name in self.remove_callbacks:
            self._remove_callback(trainer, name)
        fetch = trainer.get_batch_samples

        def timed_fetch(*args, **kwargs):
            start = time.perf_counter()
            try:
                fetched = fetch(*args, **kwargs)
            finally:
                self.fetch_ms.append((time.perf_counter() - start) * 1e3)
            self.batch_shapes.append([_input_shape(batch) for batch in fetched[0]])
            return fetched

        trainer.get_batch_samples = timed_fetch
        report = self

        class StepTimer(TrainerCallback):
            def on_train_begin(self, args, state, control, **kwargs):
                report.mark(torch)
                report.check_rows(kwargs.get("train_dataloader"))

            def on_step_end(self, args, state, control, **kwargs):
                report.mark(torch)
                if state.global_step == 1:
                    report.synchronize(torch)
                    report.data["t_first_step_s"] = time.time() - report.t0
                    report.data["ddp_module"] = report.describe_wrapped_model()
                elif state.global_step == 2:
                    report.data["gpu_processes"] = _gpu_processes()
                if report.profile_steps:
                    first, last = report.profile_steps
                    if state.global_step == first - 1:
                        report.start_profile()
                    elif state.global_step == last:
                        report.stop_profile(torch)

        trainer.add_callback(StepTimer())

    def _apply_ddp_overrides(self, trainer):
        from accelerate.utils import DistributedDataParallelKwargs

        handler = trainer.accelerator.ddp_handler or DistributedDataParallelKwargs()
        for name, value in self.ddp_overrides.items():
            if not hasattr(handler, name):
                raise ValueError(f"BENCH_DDP_KWARGS: DistributedDataParallelKwargs has no field {name!r}")
            setattr(handler, name, value)
        trainer.accelerator.ddp_handler = handler

    def _remove_callback(self, trainer, name):
        found = [c for c in trainer.callback_handler.callbacks if type(c).__name__ == name]
        if not found:  # a misspelt name would otherwise measure the unchanged script
            present = [type(c).__name__ for c in trainer.callback_handler.callbacks]
            raise ValueError(f"BENCH_REMOVE_CALLBACKS: the trainer has no {name!r} callback; it has {present}")
        for callback in found:
            trainer.remove_callback(callback)

    def mark(self, torch):
        if not self.host_times:
            gc.callbacks.append(self.time_collection)
        self.gc_ms.append(0.0)
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.events.append(event)
        self.host_times.append(time.perf_counter())

    def time_collection(self, phase, info):
        if phase == "start":
            self.gc_started = time.perf_counter()
        elif self.gc_started is not None:
            self.gc_ms[-1] += (time.perf_counter() - self.gc_started) * 1e3
            self.gc_started = None

    def start_profile(self):
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        self.profiler = profile(activities=activities)
        self.profiler.start()
        self.profile_started = time.perf_counter()

    def stop_profile(self, torch):
        self.synchronize(torch)  # the last profiled step's kernels have finished: wall time covers them
        wall_ms = (time.perf_counter() - self.profile_started) * 1e3
        self.profiler.stop()
        rank, _ = _rank_and_world()
        first, last = self.profile_steps
        prefix = os.path.join(self.result_dir, f"rank{rank}")
        os.makedirs(self.result_dir, exist_ok=True)
        self.profiler.export_chrome_trace(prefix + "_trace.json.gz")  # torch gzips a path ending in .gz
        summary = summarize_trace_file(prefix + "_trace.json.gz", wall_ms, last - first + 1)
        with open(prefix + "_ops.txt", "w") as out:
            sort_by = "self_device_time_total" if self.cuda else "self_cpu_time_total"
            out.write(self.profiler.key_averages().table(sort_by=sort_by, row_limit=40))
        with open(prefix + "_profile.json", "w") as out:
            json.dump({"profiled_steps": [first, last], **summary}, out, indent=1)

    def synchronize(self, torch):
        if self.cuda:
            torch.cuda.synchronize()

    def device_step_ms(self):
        """Device-side step times; on a machine without CUDA (tests) the host clock stands in."""
        if not self.cuda:
            return [(b - a) * 1e3 for a, b in zip(self.host_times, self.host_times[1:])]
        return [a.elapsed_time(b) for a, b in zip(self.events, self.events[1:])]

    def check_rows(self, dataloader):
        dataset = getattr(dataloader, "dataset", None)
        if dataset is None or "input_ids" not in getattr(dataset, "column_names", ()):
            self.data["row_tokens"] = None
            return
        lengths = [len(ids) for ids in dataset[:ROW_SAMPLE]["input_ids"]]
        self.data["row_tokens"] = {"checked": len(lengths), "min": min(lengths), "max": max(lengths),
                                   "mean": sum(lengths) / len(lengths)}

    def describe_wrapped_model(self):
        wrapped = getattr(self.trainer, "model_wrapped", None)
        described = {"class": type(wrapped).__name__}
        for name in ("find_unused_parameters", "gradient_as_bucket_view", "static_graph", "bucket_bytes_cap"):
            if hasattr(wrapped, name):
                described[name] = getattr(wrapped, name)
        return described

    def write(self):
        import torch

        self.synchronize(torch)
        if self.time_collection in gc.callbacks:
            gc.callbacks.remove(self.time_collection)
        rank, world = _rank_and_world()
        args = self.trainer.args
        step_ms = self.device_step_ms()
        host_ms = [(b - a) * 1e3 for a, b in zip(self.host_times, self.host_times[1:])]
        rows = self.data.get("row_tokens") or {}
        record = {
            **self.data,
            "rank": rank,
            "world_size": world,
            "local_rank": int(os.environ.get("LOCAL_RANK", 0)),
            "device": torch.cuda.get_device_name() if self.cuda else "cpu",
            "unsloth_module": getattr(sys.modules.get("unsloth"), "__file__", None),
            "per_device_train_batch_size": args.per_device_train_batch_size,
            "gradient_accumulation_steps": args.gradient_accumulation_steps,
            "gradient_checkpointing_arg": args.gradient_checkpointing,
            "tokens_per_step": (args.per_device_train_batch_size * args.gradient_accumulation_steps
                                * world * rows["mean"]) if rows else None,
            "step_ms": step_ms,
            "host_step_ms": host_ms,
            "batch_fetch_ms": self.fetch_ms,
            "batch_shapes": self.batch_shapes,
            "gc_ms": self.gc_ms[:-1],  # per step, as host_step_ms (the last interval runs past training)
            "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2 ** 30 if self.cuda else None,
            "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2 ** 30 if self.cuda else None,
            "torch_threads": torch.get_num_threads(),
            "omp_num_threads_env": os.environ.get("OMP_NUM_THREADS"),
            "ddp_overrides": self.ddp_overrides,
            "removed_callbacks": list(self.remove_callbacks),
            "t_end_s": time.time() - self.t0,
        }
        os.makedirs(self.result_dir, exist_ok=True)
        path = os.path.join(self.result_dir, f"rank{rank}.json")
        with open(path + ".tmp", "w") as out:
            json.dump(record, out, indent=1)
        os.replace(path + ".tmp", path)
