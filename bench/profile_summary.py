"""Where the time of a few profiled training steps went on each GPU: kernels busy, collectives, idle.

The question it answers is the one the step times cannot: when a 2-GPU step takes longer than a 1-GPU
step, do the GPUs compute longer (slower kernels), wait inside NCCL kernels (a collective runs until every
rank has arrived, so a rank that waits for a slower one shows it as collective time), or sit idle between
kernels (the host did not queue work in time)? It reads the Chrome trace that torch.profiler exports:
kernel events have "cat": "kernel", "ts" and "dur" in microseconds and "args": {"device": N}.

Beside it, what the host did per step (`host_counts`) and which host code launched the small copy and fill kernels
(`kernel_sources`: a kernel's "correlation" names its launch, and the cpu_ops around that launch name the code).
"""
import gzip
import json
from collections import defaultdict

COLLECTIVE_PREFIX = "nccl"  # NCCL's kernels: ncclDevKernel_AllReduce_..., ncclKernel_...
TOP_KERNELS = 15


def union_ms(intervals):
    """Total length, in ms, of the union of (start_us, end_us) intervals (overlapping streams count once)."""
    total, reach = 0.0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total / 1e3


def kernel_events(trace):
    return [e for e in trace.get("traceEvents", []) if e.get("cat") == "kernel" and "dur" in e]


def summarize_trace(trace, wall_ms, steps):
    """Per device and per step: wall time (host clock, profiler start to stop after a device sync), kernel-busy
    time, busy time of compute kernels alone, time in collective kernels, idle time, and the top kernels."""
    by_device = defaultdict(list)
    for event in kernel_events(trace):
        by_device[event.get("args", {}).get("device", 0)].append(event)
    devices = {}
    for device, events in sorted(by_device.items()):
        intervals = [(e["ts"], e["ts"] + e["dur"]) for e in events]
        compute = [(e["ts"], e["ts"] + e["dur"]) for e in events if not _is_collective(e)]
        busy = union_ms(intervals)
        totals, calls = defaultdict(float), defaultdict(int)
        for event in events:
            totals[event["name"]] += event["dur"] / 1e3
            calls[event["name"]] += 1
        top = sorted(totals, key=totals.get, reverse=True)[:TOP_KERNELS]
        devices[str(device)] = {
            "kernel_busy_ms_per_step": busy / steps,
            "compute_busy_ms_per_step": union_ms(compute) / steps,
            "collective_ms_per_step": sum(e["dur"] for e in events if _is_collective(e)) / 1e3 / steps,
            "idle_ms_per_step": (wall_ms - busy) / steps,
            "kernels_per_step": len(events) / steps,
            "busy_fraction": busy / wall_ms if wall_ms else None,
            "top_kernels": [{"name": name, "calls": calls[name], "total_ms": totals[name]} for name in top],
        }
    return {"steps": steps, "wall_ms_per_step": wall_ms / steps, "devices": devices,
            "host": host_counts(trace, steps), "sources": kernel_sources(trace, steps)}


# What the host did per step, by the trace's event names: kernel launches through the runtime and the driver
# (Triton's kernels go through cuLaunchKernelEx), memsets and copies, and gradient checkpointing: each call of a
# checkpoint autograd.Function (torch's CheckpointFunction, Unsloth's UnslothCheckpointFunction) is one cpu_op,
# and each copy of an offloaded layer input is a pinned host<->device memcpy. Non-reentrant checkpointing
# (use_reentrant=False) has no Function of its own and is not counted.
LAUNCH_NAMES = ("cudaLaunchKernel", "cuLaunchKernelEx", "cuLaunchKernel", "cudaLaunchKernelExC")


def host_counts(trace, steps):
    """Per step: kernel launches (by API), host waits for the device (by API), memsets, host<->device copies (pinned
    ones apart), checkpoint function calls (forward; their backward apart)."""
    counts = defaultdict(int)
    for event in trace.get("traceEvents", []):
        name, category = event.get("name", ""), event.get("cat", "")
        if name in LAUNCH_NAMES:
            counts["launches." + name] += 1
        elif category in ("cuda_runtime", "cuda_driver") and "Synchronize" in name:
            counts["syncs." + name] += 1  # the host waited for the device (cudaDeviceSynchronize, ...)
        elif category == "gpu_memset":
            counts["memsets"] += 1
        elif category == "gpu_memcpy":
            direction = "HtoD" if "HtoD" in name else "DtoH" if "DtoH" in name else "DtoD" if "DtoD" in name else "other"
            counts["memcpy." + direction] += 1
            if "Pinned" in name:
                counts["memcpy_pinned." + direction] += 1
        elif category == "cpu_op" and name.endswith("CheckpointFunction"):
            counts["checkpoint_calls"] += 1
        elif category == "cpu_op" and name.endswith("CheckpointFunctionBackward") and "::" not in name:
            counts["checkpoint_backward"] += 1  # not the engine's "autograd::engine::evaluate_function: ..." twin
    per_step = {key: value / steps for key, value in sorted(counts.items())}
    per_step["launches"] = sum(value for key, value in per_step.items() if key.startswith("launches."))
    per_step["syncs"] = sum(value for key, value in per_step.items() if key.startswith("syncs."))
    for key in ("checkpoint_calls", "checkpoint_backward", "memcpy_pinned.HtoD", "memcpy_pinned.DtoH"):
        per_step.setdefault(key, 0.0)
    return per_step


# Small kernels worth tracing to the code that launched them: elementwise copies (dtype casts: `.to(bf16)`,
# `.contiguous()`) and fills (`torch.zeros`, `zero_()`, `masked_fill`), by the names of PyTorch's kernels.
TRACED_KERNELS = {"copy": ("copy",), "fill": ("fill",)}
TOP_SOURCES = 10


def kernel_sources(trace, steps):
    """Per traced kind of kernel (copy, fill): which host code launched them, per step, the most first. A kernel's
    launch (a cuda_runtime or cuda_driver event of the same "correlation") ran inside nested cpu_ops on its host
    thread; the source is the outermost of them (a module's autograd Function such as LoRA_MLP, or the autograd
    engine's `evaluate_function: ...Backward` in backward) with the innermost (the aten op that launched it)."""
    events = trace.get("traceEvents", [])
    launches = {event["args"]["correlation"]: event for event in events
                if event.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in event.get("args", {})}
    wanted = defaultdict(list)  # host thread -> [(launch, kind of the kernel it launched)]
    for event in kernel_events(trace):
        kind = _traced_kind(event["name"])
        launch = launches.get(event.get("args", {}).get("correlation"))
        if kind is not None and launch is not None:
            wanted[(launch.get("pid"), launch.get("tid"))].append((launch, kind))
    ops = defaultdict(list)
    for event in events:
        if event.get("cat") == "cpu_op" and "dur" in event:
            ops[(event.get("pid"), event.get("tid"))].append(event)
    counts = {kind: defaultdict(int) for kind in TRACED_KERNELS}
    for thread, found in wanted.items():
        for kind, source in _sources_on_thread(ops[thread], found):
            counts[kind][source] += 1
    return {kind: [{"outer": outer, "inner": inner, "per_step": count / steps}
                   for (outer, inner), count in sorted(found.items(), key=lambda item: -item[1])[:TOP_SOURCES]]
            for kind, found in counts.items()}


def _sources_on_thread(ops, launches):
    """(kind, (outermost op, innermost op)) for each (launch, kind) of one host thread: one sweep in time order
    over its cpu_ops, which nest, keeping the stack of those still running."""
    ops = sorted(ops, key=lambda op: (op["ts"], -op["dur"]))
    stack, next_op = [], 0
    for launch, kind in sorted(launches, key=lambda pair: pair[0]["ts"]):
        while next_op < len(ops) and ops[next_op]["ts"] <= launch["ts"]:
            _drop_ended(stack, ops[next_op]["ts"])
            stack.append(ops[next_op])
            next_op += 1
        _drop_ended(stack, launch["ts"])
        yield kind, ((stack[0]["name"], stack[-1]["name"]) if stack else ("(no op)", "(no op)"))


def _drop_ended(stack, at):
    while stack and stack[-1]["ts"] + stack[-1]["dur"] < at:
        stack.pop()


def _traced_kind(kernel_name):
    lowered = kernel_name.lower()
    return next((kind for kind, marks in TRACED_KERNELS.items() if any(mark in lowered for mark in marks)), None)


def _is_collective(event):
    return event["name"].lower().startswith(COLLECTIVE_PREFIX)


def summarize_trace_file(path, wall_ms, steps):
    """`summarize_trace` of a gzipped Chrome trace file (`export_chrome_trace("<name>.json.gz")`)."""
    with gzip.open(path, "rt") as stream:
        return summarize_trace(json.load(stream), wall_ms, steps)
