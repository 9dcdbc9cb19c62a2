import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

@pytest.mark.e2e
def test_timed_run_reports_every_step_of_an_unmodified_trainer_script(tmp_path, tiny_train_script):
    script = tiny_train_script
    env = {**os.environ, "BENCH_RESULT_DIR": str(tmp_path / "result"), "BENCH_DDP_KWARGS": "{}"}
    done = subprocess.run([sys.executable, "bench/timed_run.py", str(script), "--max_steps", "5",
                           "--output_dir", str(tmp_path / "out")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "script finished __main__" in done.stdout
    record = json.loads((tmp_path / "result" / "rank0.json").read_text())
    assert len(record["step_ms"]) == 5 and all(ms > 0 for ms in record["step_ms"])
    assert len(record["batch_fetch_ms"]) == 5
    assert len(record["gc_ms"]) == 5 and all(ms >= 0 for ms in record["gc_ms"])
    assert record["batch_shapes"] == [[[2, 16]]] * 5  # one micro batch of 2 rows of 16 tokens a step
    assert record["row_tokens"] == {"checked": 32, "min": 16, "max": 16, "mean": 16.0}
    assert record["tokens_per_step"] == 2 * 16
    assert record["world_size"] == 1 and record["t_first_step_s"] > 0
    assert record["ddp_module"]["class"] == "LlamaForCausalLM"  # one process: no DDP wrapper


@pytest.mark.e2e
def test_ddp_overrides_reach_the_distributed_wrapper_on_every_rank(tmp_path, tiny_train_script):
    script = tiny_train_script
    env = {**os.environ, "BENCH_RESULT_DIR": str(tmp_path / "result"), "OMP_NUM_THREADS": "1",
           "BENCH_DDP_KWARGS": json.dumps({"gradient_as_bucket_view": True, "bucket_cap_mb": 5})}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "bench/timed_run.py", str(script), "--max_steps", "3", "--output_dir", str(tmp_path / "out")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in (0, 1):
        record = json.loads((tmp_path / "result" / f"rank{rank}.json").read_text())
        assert record["rank"] == rank and record["world_size"] == 2
        assert record["tokens_per_step"] == 2 * 2 * 16
        wrapper = record["ddp_module"]
        assert wrapper["class"] == "DistributedDataParallel"
        assert wrapper["gradient_as_bucket_view"] is True and wrapper["bucket_bytes_cap"] == 5 * 2 ** 20


@pytest.mark.e2e
def test_named_callbacks_are_removed_and_a_missing_one_is_an_error(tmp_path, tiny_train_script):
    def run(removed):
        env = {**os.environ, "BENCH_RESULT_DIR": str(tmp_path / removed), "BENCH_REMOVE_CALLBACKS": removed}
        return subprocess.run([sys.executable, "bench/timed_run.py", str(tiny_train_script), "--max_steps", "2",
                               "--output_dir", str(tmp_path / "out")],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=300)

    done = run("ProgressCallback")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((tmp_path / "ProgressCallback" / "rank0.json").read_text())["removed_callbacks"] == [
        "ProgressCallback"]
    assert "it/s]" not in done.stderr  # the progress bar is gone
    failed = run("MisspeltCallback")
    assert failed.returncode != 0
    assert "the trainer has no 'MisspeltCallback' callback" in failed.stderr


@pytest.mark.e2e
def test_profiled_steps_write_a_profile_after_the_timed_ones(tmp_path, tiny_train_script):
    def run(steps_text, max_steps):
        env = {**os.environ, "BENCH_RESULT_DIR": str(tmp_path / "result"), "BENCH_PROFILE_STEPS": steps_text}
        return subprocess.run([sys.executable, "bench/timed_run.py", str(tiny_train_script), "--max_steps",
                               str(max_steps), "--output_dir", str(tmp_path / "out")],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=300)

    done = run("4-5", 5)
    assert done.returncode == 0, done.stderr[-3000:]
    result = tmp_path / "result"
    assert len(json.loads((result / "rank0.json").read_text())["step_ms"]) == 5
    profile = json.loads((result / "rank0_profile.json").read_text())
    assert profile["profiled_steps"] == [4, 5] and profile["steps"] == 2
    assert profile["wall_ms_per_step"] > 0 and profile["devices"] == {}  # CPU: no kernels
    assert "aten::" in (result / "rank0_ops.txt").read_text()
    import gzip

    assert "traceEvents" in gzip.open(result / "rank0_trace.json.gz", "rt").read()
    assert not (result / "rank0_trace.json").exists()
    for bad in ("1-3", "5", "a-b"):
        failed = run(bad, 3)
        assert failed.returncode != 0 and "BENCH_PROFILE_STEPS" in failed.stderr
