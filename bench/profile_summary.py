"""Where the time of a few profiled training steps went on each GPU: kernels busy, collectives, idle.

The question it answers is the one the step times cannot: when a 2-GPU step takes longer than a 1-GPU
step, do the GPUs compute longer (slower kernels), wait inside NCCL kernels (a collective runs until every
rank has arrived, so a rank that waits for a slower one shows it as collective time), or sit idle between
kernels (the host did not queue work in time)? It reads the Chrome trace that torch.profiler exports:
kernel events have "cat": "kernel", "ts" and "dur" in microseconds and "args": {"device": N}.
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
            "host": host_counts(trace, steps)}


# What the host did per step, by the trace's event names: kernel launches through the runtime and the driver
# (Triton's kernels go through cuLaunchKernelEx), memsets and copies, and gradient checkpointing: each call of a
# checkpoint autograd.Function (torch's CheckpointFunction, Unsloth's UnslothCheckpointFunction) is one cpu_op,
# and each copy of an offloaded layer input is a pinned host<->device memcpy. Non-reentrant checkpointing
# (use_reentrant=False) has no Function of its own and is not counted.
LAUNCH_NAMES = ("cudaLaunchKernel", "cuLaunchKernelEx", "cuLaunchKernel", "cudaLaunchKernelExC")


def host_counts(trace, steps):
    """Per step: kernel launches (by API), memsets, host<->device copies (pinned ones apart), checkpoint function
    calls (forward; their backward apart), and the busy fraction of every device's kernels over the wall time."""
    counts = defaultdict(int)
    for event in trace.get("traceEvents", []):
        name, category = event.get("name", ""), event.get("cat", "")
        if name in LAUNCH_NAMES:
            counts["launches." + name] += 1
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
    for key in ("checkpoint_calls", "checkpoint_backward", "memcpy_pinned.HtoD", "memcpy_pinned.DtoH"):
        per_step.setdefault(key, 0.0)
    return per_step


def _is_collective(event):
    return event["name"].lower().startswith(COLLECTIVE_PREFIX)


def summarize_trace_file(path, wall_ms, steps):
    """`summarize_trace` of a gzipped Chrome trace file (`export_chrome_trace("<name>.json.gz")`)."""
    with gzip.open(path, "rt") as stream:
        return summarize_trace(json.load(stream), wall_ms, steps)
