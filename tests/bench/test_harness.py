import json

import pytest

from bench import experiments as plan
from bench.harness import (keep_in_logs, script_flags, summarize_experiment, summarize_trial, too_few_gpus,
                           warm_up_experiment)

EXPERIMENT = plan.Experiment(
    name="toy", description="", shape="llama-1.1b", micro_batch=4, steps=6, warmup_steps=2,
    variants={"one": plan.Variant("generated", 1, {"backend": "unsloth"}),
              "two": plan.Variant("generated", 2, {"backend": "unsloth"})},
    order=("one", "two"), rounds=2, comparisons=(("two", "one"),))
MATMUL = [{"median_flops_per_s": 800e12}, {"median_flops_per_s": 700e12}]


def write_rank(directory, rank, world, step_ms, peak=3.0):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"rank{rank}.json").write_text(json.dumps({
        "rank": rank, "world_size": world, "step_ms": step_ms, "host_step_ms": step_ms, "batch_fetch_ms": [0.5],
        "tokens_per_step": 8192 * world, "row_tokens": {"checked": 8, "min": 2048, "max": 2048, "mean": 2048},
        "peak_allocated_gib": peak + rank, "peak_reserved_gib": peak + 1, "t_train_called_s": 20.0,
        "t_first_step_s": 30.0, "torch_threads": 1, "omp_num_threads_env": "1"}))


def trial(tmp_path, label, round_index, world, step_ms, returncode=0):
    directory = tmp_path / f"{label}{round_index}"
    for rank in range(world):
        write_rank(directory, rank, world, step_ms)
    (directory / "log.txt").write_text("nbddp: backend=unsloth (x) world_size=2\nData Parallel GPUs = 2 |\n")
    t = {"label": label, "round": round_index, "gpus": list(range(world)), "dir": str(directory),
         "returncode": returncode}
    return summarize_trial(t, EXPERIMENT, MATMUL, flops=4.0e9)


def test_trial_summary_skips_warmup_and_computes_throughput_and_mfu(tmp_path):
    t = trial(tmp_path, "two", 0, 2, [5000, 900, 200, 200, 250, 150])
    assert t["status"] == "ok"
    assert t["step_ms"]["n"] == 4 and t["step_ms"]["median"] == 200
    assert t["tokens_per_s"]["median"] == pytest.approx(16384 / 0.2)
    assert t["tokens_per_s_per_gpu"] == pytest.approx(8192 / 0.2)
    assert t["mfu"] == pytest.approx(8192 / 0.2 * 4.0e9 / 750e12)  # median of the two GPUs' rates
    assert t["peak_allocated_gib"] == [3.0, 4.0]
    assert t["unsloth_data_parallel_gpus"] == 2 and t["backend_line"].startswith("nbddp: backend=unsloth")


def test_profiled_steps_are_not_timed_and_their_kernel_lists_stay_in_the_logs(tmp_path):
    profiled = plan.Experiment(**{**EXPERIMENT.__dict__, "steps": 4, "profile_steps": 2})
    directory = tmp_path / "p"
    write_rank(directory, 0, 1, [5000, 900, 200, 200, 999, 999])
    (directory / "rank0_profile.json").write_text(json.dumps({
        "profiled_steps": [5, 6], "steps": 2, "wall_ms_per_step": 999.0,
        "devices": {"0": {"kernel_busy_ms_per_step": 900.0, "idle_ms_per_step": 99.0,
                          "top_kernels": [{"name": "gemm", "calls": 2, "total_ms": 1.0}]}}}))
    t = summarize_trial({"label": "one", "round": 0, "gpus": [0], "dir": str(directory), "returncode": 0},
                        profiled, MATMUL, flops=4.0e9)
    assert t["step_ms"]["n"] == 2 and t["step_ms"]["median"] == 200 and len(t["step_ms_all"]) == 4
    assert t["profile"] == {"rank0": {"profiled_steps": [5, 6], "wall_ms_per_step": 999.0,
                                      "devices": {"0": {"kernel_busy_ms_per_step": 900.0, "idle_ms_per_step": 99.0}}}}


def test_failed_trial_keeps_the_end_of_its_log(tmp_path):
    t = trial(tmp_path, "one", 0, 1, [1, 2, 3], returncode=1)
    assert t["status"] == "failed" and "Data Parallel GPUs = 2 |" in t["log_tail"]


def test_experiment_summary_pairs_rounds_and_reports_scaling_efficiency(tmp_path):
    trials = [trial(tmp_path, "one", 0, 1, [9, 9, 100, 100]), trial(tmp_path, "two", 0, 2, [9, 9, 110, 110]),
              trial(tmp_path, "one", 1, 1, [9, 9, 120, 120]), trial(tmp_path, "two", 1, 2, [9, 9, 120, 120])]
    summary = summarize_experiment(EXPERIMENT, trials)
    comparison = summary["comparisons"][0]
    assert comparison["tokens_per_s"]["per_pair"] == pytest.approx([2 * 100 / 110, 2.0])
    assert comparison["tokens_per_s_per_gpu"]["per_pair"] == pytest.approx([100 / 110, 1.0])
    assert summary["variants"]["two"]["trials"] == 2


def test_flags_cover_the_common_settings_and_drop_backend_for_the_reference():
    reference = plan.Variant("reference", 2, {"backend": "unsloth", "load_in_4bit": False,
                                              "use_gradient_checkpointing": "false"})
    flags = script_flags(EXPERIMENT, reference, "/m", "/d.jsonl", "/o")
    pairs = dict(zip(flags[::2], flags[1::2]))
    assert pairs["--max_seq_length"] == str(plan.SEQ_LEN) and pairs["--load_in_4bit"] == "false"
    assert pairs["--use_gradient_checkpointing"] == "false" and "--backend" not in pairs
    assert int(pairs["--eval_steps"]) > EXPERIMENT.steps  # no evaluation inside the timed steps


def test_flags_are_parameters_of_the_generated_script():
    from pathlib import Path

    from nbddp.runtime.inputs.flags import defined_in

    names = set(defined_in(str(Path(__file__).resolve().parents[2] / "generated" / "train.py")))
    for experiment in plan.EXPERIMENTS.values():
        for variant in experiment.variants.values():
            if variant.script == "generated":
                flags = script_flags(experiment, variant, "/m", "/d", "/o")
                assert {f[2:] for f in flags[::2]} <= names, experiment.name


def test_logs_keep_metrics_but_not_saved_weights():
    import tarfile

    def info(name, directory=False):
        i = tarfile.TarInfo(name)
        i.type = tarfile.DIRTYPE if directory else tarfile.REGTYPE
        return i

    assert keep_in_logs(info("trials/x/00_a/log.txt"))
    assert keep_in_logs(info("trials/x/00_a/output/metrics.jsonl"))
    assert keep_in_logs(info("trials/x/00_a/output/adapter_model.safetensors")) is None
    assert keep_in_logs(info("trials/x/00_a/rank0_profile.json"))
    assert keep_in_logs(info("trials/x/00_a/rank0_trace.json.gz")) is None


def test_every_planned_experiment_is_consistent():
    for experiment in plan.EXPERIMENTS.values():
        assert set(experiment.order) <= set(experiment.variants)
        for numerator, denominator in experiment.comparisons:
            assert {numerator, denominator} <= set(experiment.variants)
        assert experiment.steps > experiment.warmup_steps
        if experiment.concurrent:
            assert len(experiment.order) == 2 and all(v.gpus == 1 for v in experiment.variants.values())



@pytest.mark.e2e
def test_runner_runs_rounds_and_writes_results_after_each_trial(tmp_path, monkeypatch, tiny_train_script):
    import time

    from bench import harness

    monkeypatch.setitem(harness.SCRIPTS, "generated", str(tiny_train_script))
    experiment = plan.Experiment(
        name="toy", description="", shape="llama-1.1b", micro_batch=2, steps=4, warmup_steps=1,
        variants={"one": plan.Variant("generated", 1, env={"OMP_NUM_THREADS": "1"}),
                  "two": plan.Variant("generated", 2, env={"OMP_NUM_THREADS": "1"})},
        order=("one", "two"), rounds=1, comparisons=(("two", "one"),), profile_steps=2)
    runner = harness.Runner(tmp_path / "out", tmp_path / "work", time.time() + 240, {"llama-1.1b": "unused"},
                            "unused", [{"median_flops_per_s": 1e12}] * 2, {"gpu_memory_gib": [139.0] * 2})
    (tmp_path / "out").mkdir()
    runner.run_round(experiment, 0)
    result = json.loads((tmp_path / "out" / "toy.json").read_text())
    assert [t["status"] for t in result["trials"]] == ["ok", "ok"], result["trials"]
    assert [t["world_size"] for t in result["trials"]] == [1, 2]
    assert "--nproc_per_node=2" in result["trials"][1]["command"]
    assert result["summary"]["comparisons"][0]["tokens_per_s"]["per_pair"]  # one round, one ratio
    # Two profiled steps ran after the 4 timed ones: timing and plots see only the timed steps.
    assert "BENCH_PROFILE_STEPS=5-6" in result["trials"][0]["command"]
    assert all(len(t["step_ms_all"]) == 4 and t["step_ms"]["n"] == 3 for t in result["trials"])
    assert sorted(result["trials"][1]["profile"]) == ["rank0", "rank1"]
    assert result["trials"][1]["profile"]["rank0"]["profiled_steps"] == [5, 6]


def test_runner_skips_a_trial_that_cannot_finish_before_the_deadline(tmp_path):
    import time

    from bench import harness

    runner = harness.Runner(tmp_path, tmp_path, time.time() + 5, {}, "", [], {"gpu_memory_gib": [139.0]})
    runner.run_batch(EXPERIMENT, 0, [("one", (0,))])  # the first 1.1B trial is expected to take far longer
    assert runner.trials == {}


def test_experiments_that_need_more_gpus_than_the_machine_has_are_named():
    chosen = [plan.EXPERIMENTS["scaling_8b"], plan.EXPERIMENTS["scaling_8b_4gpu"]]
    assert too_few_gpus(chosen, 4) == ""
    assert too_few_gpus(chosen, 2) == "scaling_8b_4gpu needs 4"


def test_a_call_opens_with_a_short_trial_of_the_first_variant_that_uses_the_most_gpus():
    warm = warm_up_experiment(plan.EXPERIMENTS["profile_1b"])
    assert (warm.name, warm.order, warm.rounds) == ("profile_1b_warmup", ("2gpu",), 1)
    assert (warm.steps, warm.profile_steps) == (12, 0)
    assert warm.comparisons == () and warm.steps > warm.warmup_steps
    assert warm_up_experiment(plan.EXPERIMENTS["scaling_8b_4gpu"]).order == ("generated_4gpu",)
    assert warm_up_experiment(plan.EXPERIMENTS["backends_qlora_8b"]).order == ("unsloth",)  # one GPU each
