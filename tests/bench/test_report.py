import json

import pytest

from bench.report import (load, markdown, other_points, panels_by_shape, plot, projected_efficiency, scaling_points,
                          step_time_plot)


def result(one=40_000.0, two=76_000.0):
    trial = lambda label, world, tps: {"label": label, "world_size": world, "status": "ok", "checkpointing": "auto",
                                       "gradient_checkpointing_arg": world == 2,
                                       "tokens_per_s": {"median": tps, "p10": tps * 0.9, "p90": tps * 1.1}}
    variants = {label: {"trials": 1, "tokens_per_s_median": tps, "tokens_per_s_per_gpu_median": tps / world,
                        "mfu_median": 0.3, "peak_allocated_gib_max_rank_median": 3.0, "t_first_step_s_median": 40.0}
                for label, world, tps in (("g1", 1, one), ("g2", 2, two))}
    ratio = lambda r: {"per_pair": [r], "median": r, "min": r, "max": r}
    return {"description": "toy", "setup": {"shape": "llama-1.1b", "seq_len": 2048, "micro_batch_per_gpu": 4,
                                            "steps": 10, "warmup_steps": 2, "concurrent": False,
                                            "checkpointing_choice": {"chosen": "off"}},
            "trials": [trial("g1", 1, one), trial("g2", 2, two)],
            "summary": {"variants": variants, "comparisons": [
                {"numerator": "g2", "denominator": "g1", "tokens_per_s": ratio(two / one),
                 "tokens_per_s_per_gpu": ratio(two / one / 2), "peak_allocated_gib": ratio(1.0)}]}}


def test_projection_keeps_perfect_scaling_perfect_and_worsens_a_gap():
    assert projected_efficiency(1.0) == pytest.approx(1.0)
    assert projected_efficiency(0.8) == pytest.approx(1 / (1 + 1.5 * 0.25))


def test_markdown_and_plot_from_results_files(tmp_path):
    (tmp_path / "scaling_toy.json").write_text(json.dumps(result()))
    results = load(tmp_path)
    text = markdown(results)
    assert "| g2 / g1 | 1.900 | 1.900 | 0.950 | 1.000 |" in text
    assert "| g1 | 1 | auto -> off | 1 |" in text and "| g2 | 2 | auto -> on | 1 |" in text
    points = scaling_points(results)
    assert points == [("scaling_toy: g1 scaled", {1: 40_000.0, 2: 76_000.0}, {2: pytest.approx(0.95)})]
    assert other_points(results) == []  # the only 2-GPU variant is the scaled one
    plot([("toy", points, [("reference", 2, 2.0)])], tmp_path / "scaling.png")
    assert (tmp_path / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_step_time_plot_of_a_merged_experiment(tmp_path):
    toy = result()
    for index, trial in enumerate(toy["trials"]):
        trial.update({"step_ms_all": [900.0, 300.0, 200.0, 210.0], "round": 0, "call": index})
    toy.update({"experiment": "toy", "calls": [{"date_utc": "2026-11-29T23:46:34+00:00"},
                                               {"date_utc": "2026-11-29T23:55:17+00:00"}]})
    toy["setup"]["warmup_steps"] = 2
    step_time_plot(toy, tmp_path / "toy_steps.png")
    assert (tmp_path / "toy_steps.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_four_gpu_experiment_plots_its_measurements_and_its_reference():
    toy = result()
    toy["trials"] += [{"label": "g4", "world_size": 4, "status": "ok"}, {"label": "ref4", "world_size": 4, "status": "ok"}]
    toy["summary"]["variants"].update({label: {"tokens_per_s_median": tps} for label, tps in
                                       (("g4", 150_000.0), ("ref4", 152_000.0))})
    toy["summary"]["comparisons"] += [{"numerator": "g4", "denominator": "g1", "tokens_per_s_per_gpu": {"median": 0.93}},
                                      {"numerator": "g4", "denominator": "ref4"}]
    results = {"scaling_4": toy}
    assert scaling_points(results) == [("scaling_4: g1 scaled", {1: 40_000.0, 2: 76_000.0, 4: 150_000.0},
                                        {2: pytest.approx(0.95), 4: 0.93})]
    assert other_points(results) == [("scaling_4: ref4", 4, pytest.approx(3.8))]  # speed-up over g1


def test_profiled_trials_get_a_table_of_where_the_step_went(tmp_path):
    profiled = result()
    assert "Profiled steps" not in markdown({"toy": profiled})
    gpu = {"kernel_busy_ms_per_step": 150.0, "compute_busy_ms_per_step": 110.0, "collective_ms_per_step": 40.0,
           "idle_ms_per_step": 32.5, "kernels_per_step": 900}
    profiled["trials"][1].update(round=0, profile={"rank1": {"profiled_steps": [41, 43], "wall_ms_per_step": 182.5,
                                                              "devices": {"1": gpu}}})
    text = markdown({"toy": profiled})
    assert "Profiled steps 41–43" in text
    assert "| g2 | 1 | rank1 (GPU 1) | 182.5 | 150.0 | 110.0 | 40.0 | 32.5 |" in text


def test_the_scaling_plot_has_a_panel_per_shape_largest_first(tmp_path):
    small, large = result(), result()
    small["setup"]["shape"], large["setup"]["shape"] = "llama-1.1b", "llama3-8b"
    panels = panels_by_shape({"gap_small": small, "scaling_large": large})
    assert [(shape, [name for name, _, _ in points]) for shape, points, _ in panels] == [
        ("llama3-8b", ["scaling_large: g1 scaled"]), ("llama-1.1b", ["gap_small: g1 scaled"])]
    plot(panels, tmp_path / "scaling.png")
    assert (tmp_path / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
