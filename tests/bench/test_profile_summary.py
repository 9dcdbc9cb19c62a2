import pytest

from bench.profile_summary import host_counts, summarize_trace, union_ms


def kernel(name, ts, dur, device=0):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"device": device}}


def test_overlapping_kernels_count_once():
    assert union_ms([(0, 1000), (500, 1500), (3000, 4000)]) == pytest.approx(2.5)
    assert union_ms([(0, 4000), (1000, 2000)]) == pytest.approx(4.0)
    assert union_ms([]) == 0


def test_busy_collective_and_idle_time_per_step():
    trace = {"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 9000},  # host work is not GPU time
        kernel("sm90_xmma_gemm_bf16", 0, 4000),
        kernel("triton_rms_norm", 3000, 2000),  # overlaps the GEMM on another stream
        kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 6000, 3000),
        kernel("sm90_xmma_gemm_bf16", 10000, 4000),
        kernel("sm90_xmma_gemm_bf16", 0, 1000, device=1),
    ]}
    summary = summarize_trace(trace, wall_ms=20.0, steps=2)
    assert summary["wall_ms_per_step"] == 10.0
    gpu = summary["devices"]["0"]
    assert gpu["kernel_busy_ms_per_step"] == pytest.approx((5 + 3 + 4) / 2)
    assert gpu["compute_busy_ms_per_step"] == pytest.approx((5 + 4) / 2)
    assert gpu["collective_ms_per_step"] == pytest.approx(1.5)
    assert gpu["idle_ms_per_step"] == pytest.approx((20 - 12) / 2)
    assert gpu["kernels_per_step"] == 2
    assert gpu["top_kernels"][0] == {"name": "sm90_xmma_gemm_bf16", "calls": 2, "total_ms": 8.0}
    assert summary["devices"]["1"]["kernel_busy_ms_per_step"] == pytest.approx(0.5)


def test_a_trace_without_kernels_has_no_devices():
    summary = summarize_trace({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5}]},
                              wall_ms=3.0, steps=1)
    assert {key: summary[key] for key in ("steps", "wall_ms_per_step", "devices")} == {
        "steps": 1, "wall_ms_per_step": 3.0, "devices": {}}
    assert summary["host"]["launches"] == 0


def test_host_counts_launches_copies_and_checkpoint_calls_per_step():
    events = (
        [{"name": "cudaLaunchKernel", "cat": "cuda_runtime", "ts": 0, "dur": 1}] * 6
        + [{"name": "cuLaunchKernelEx", "cat": "cuda_driver", "ts": 0, "dur": 1}] * 2
        + [{"name": "cudaDeviceSynchronize", "cat": "cuda_runtime", "ts": 0, "dur": 1}] * 6
        + [{"name": "cudaStreamSynchronize", "cat": "cuda_runtime", "ts": 0, "dur": 1}] * 2
        + [{"name": "Memcpy HtoD (Pinned -> Device)", "cat": "gpu_memcpy", "ts": 0, "dur": 1}] * 4
        + [{"name": "Memcpy DtoH (Device -> Pageable)", "cat": "gpu_memcpy", "ts": 0, "dur": 1}] * 2
        + [{"name": "Memset (Device)", "cat": "gpu_memset", "ts": 0, "dur": 1}] * 2
        + [{"name": "UnslothCheckpointFunction", "cat": "cpu_op", "ts": 0, "dur": 1}] * 4
        + [{"name": "UnslothCheckpointFunctionBackward", "cat": "cpu_op", "ts": 0, "dur": 1}] * 4
        + [{"name": "autograd::engine::evaluate_function: UnslothCheckpointFunctionBackward", "cat": "cpu_op",
            "ts": 0, "dur": 1}] * 4)
    counts = host_counts({"traceEvents": events}, steps=2)
    assert counts["launches"] == 4 and counts["launches.cudaLaunchKernel"] == 3
    assert counts["syncs"] == 4 and counts["syncs.cudaDeviceSynchronize"] == 3
    assert counts["memcpy.HtoD"] == 2 and counts["memcpy_pinned.HtoD"] == 2
    assert counts["memcpy.DtoH"] == 1 and counts["memcpy_pinned.DtoH"] == 0
    assert counts["memsets"] == 1
    assert counts["checkpoint_calls"] == 2 and counts["checkpoint_backward"] == 2


def test_no_checkpoint_calls_reads_as_zero():
    counts = host_counts({"traceEvents": [{"name": "cudaLaunchKernel", "cat": "cuda_runtime"}]}, steps=1)
    assert counts["checkpoint_calls"] == 0 and counts["memcpy_pinned.HtoD"] == 0


def op(name, ts, dur, tid=1):
    return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "pid": 5, "tid": tid}


def launched(correlation, ts, kernel_name, tid=1, api=("cuda_runtime", "cudaLaunchKernel")):
    """A launch on host thread `tid` at `ts` and the kernel it launched (later, on the GPU's own track)."""
    return [{"ph": "X", "cat": api[0], "name": api[1], "ts": ts, "dur": 2, "pid": 5, "tid": tid,
             "args": {"correlation": correlation}},
            {"ph": "X", "cat": "kernel", "name": kernel_name, "ts": ts + 50, "dur": 3, "pid": 0, "tid": 7,
             "args": {"device": 0, "correlation": correlation}}]


COPY = "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)>"
FILL = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<c10::BFloat16>>"


def test_copy_and_fill_kernels_are_traced_to_the_ops_that_launched_them():
    trace = {"traceEvents": [
        op("LoRA_MLP", 0, 100), op("aten::to", 10, 20), op("aten::copy_", 12, 10),
        *launched(1, 15, COPY),
        op("aten::_to_copy", 40, 20), op("aten::copy_", 42, 10),
        *launched(2, 45, COPY, api=("cuda_driver", "cuLaunchKernelEx")),
        op("aten::zeros", 70, 10), op("aten::fill_", 72, 5),
        *launched(3, 74, FILL),
        op("aten::mm", 85, 10), *launched(4, 88, "sm90_xmma_gemm_bf16"),  # neither copy nor fill: not traced
        # backward, on the autograd engine's thread
        op("autograd::engine::evaluate_function: LoRA_MLPBackward", 200, 50, tid=2), op("aten::copy_", 210, 10, tid=2),
        *launched(5, 212, COPY, tid=2),
        *launched(6, 400, FILL),  # launched outside any op
    ]}
    sources = summarize_trace(trace, wall_ms=1.0, steps=1)["sources"]
    assert sources["copy"] == [{"outer": "LoRA_MLP", "inner": "aten::copy_", "per_step": 2.0},
                               {"outer": "autograd::engine::evaluate_function: LoRA_MLPBackward",
                                "inner": "aten::copy_", "per_step": 1.0}]
    assert sources["fill"] == [{"outer": "LoRA_MLP", "inner": "aten::fill_", "per_step": 1.0},
                               {"outer": "(no op)", "inner": "(no op)", "per_step": 1.0}]


def test_a_trace_without_launch_correlations_has_no_sources():
    sources = summarize_trace({"traceEvents": [kernel(COPY, 0, 5)]}, wall_ms=1.0, steps=1)["sources"]
    assert sources == {"copy": [], "fill": []}
