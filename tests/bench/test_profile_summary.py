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
        + [{"name": "Memcpy HtoD (Pinned -> Device)", "cat": "gpu_memcpy", "ts": 0, "dur": 1}] * 4
        + [{"name": "Memcpy DtoH (Device -> Pageable)", "cat": "gpu_memcpy", "ts": 0, "dur": 1}] * 2
        + [{"name": "Memset (Device)", "cat": "gpu_memset", "ts": 0, "dur": 1}] * 2
        + [{"name": "UnslothCheckpointFunction", "cat": "cpu_op", "ts": 0, "dur": 1}] * 4
        + [{"name": "UnslothCheckpointFunctionBackward", "cat": "cpu_op", "ts": 0, "dur": 1}] * 4
        + [{"name": "autograd::engine::evaluate_function: UnslothCheckpointFunctionBackward", "cat": "cpu_op",
            "ts": 0, "dur": 1}] * 4)
    counts = host_counts({"traceEvents": events}, steps=2)
    assert counts["launches"] == 4 and counts["launches.cudaLaunchKernel"] == 3
    assert counts["memcpy.HtoD"] == 2 and counts["memcpy_pinned.HtoD"] == 2
    assert counts["memcpy.DtoH"] == 1 and counts["memcpy_pinned.DtoH"] == 0
    assert counts["memsets"] == 1
    assert counts["checkpoint_calls"] == 2 and counts["checkpoint_backward"] == 2


def test_no_checkpoint_calls_reads_as_zero():
    counts = host_counts({"traceEvents": [{"name": "cudaLaunchKernel", "cat": "cuda_runtime"}]}, steps=1)
    assert counts["checkpoint_calls"] == 0 and counts["memcpy_pinned.HtoD"] == 0
