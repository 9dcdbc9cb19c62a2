import pytest

from nbddp.orchestration.metrics import Metrics
from nbddp.orchestration.regress import compare


def rows_by_metric(baseline, now, tolerances):
    return {row.metric: row for row in compare.compare_figures("case", baseline, now, tolerances)}


@pytest.mark.parametrize("metric, baseline, now, status", [
    ("final_train_loss", 1.00, 1.04, "ok"),  # 4% higher, 5% allowed
    ("final_train_loss", 1.00, 1.06, "WORSE"),
    ("final_train_loss", 1.00, 0.50, "ok"),  # lower loss is better
    ("tokens_per_s", 100.0, 94.0, "WORSE"),  # fewer tokens/s is worse
    ("tokens_per_s", 100.0, 300.0, "ok"),
    ("peak_mem_gib", 10.0, 10.6, "WORSE"),
    ("wall_time_s", 10.0, 9.0, "ok"),
    ("loss_at_step_4", 2.0, 2.09, "ok"),  # the loss_at_step entry covers every step
    ("loss_at_step_4", 2.0, 2.2, "WORSE"),
])
def test_worse_depends_on_the_metric(metric, baseline, now, status):
    tolerances = {name: {"relative": 0.05} for name in compare.METRICS}
    assert rows_by_metric({metric: baseline}, {metric: now}, tolerances)[metric].status == status


def test_relative_and_absolute_together_allow_the_larger():
    tolerance = {"relative": 0.01, "absolute": 0.1}
    assert compare.allowance(1.0, tolerance) == 0.1
    assert compare.allowance(100.0, tolerance) == 1.0
    assert compare.describe_tolerance(tolerance) == "1% or ±0.1"


def test_missing_new_and_unchecked_figures():
    tolerances = {"eval_loss": {"absolute": 0.1}}
    rows = rows_by_metric({"eval_loss": 1.0, "final_train_loss": 2.0}, {"eval_loss": None, "tokens_per_s": 5.0},
                          tolerances)
    assert rows["eval_loss"].status == "missing" and rows["eval_loss"].failed
    assert rows["tokens_per_s"].status == "new" and not rows["tokens_per_s"].failed
    assert rows["final_train_loss"].status == "missing"
    unchecked = rows_by_metric({"peak_mem_gib": 1.0}, {"peak_mem_gib": 9.0}, tolerances)["peak_mem_gib"]
    assert unchecked.status == "info" and unchecked.delta == 8.0


def test_case_figures_from_metrics():
    metrics = Metrics(losses=[(1, 3.0), (2, 2.0), (3, 1.0)], eval_losses=[(3, 1.5)], tokens_per_s=[1.0, 5.0, 3.0],
                      peak_mem_gib=[0.5, 0.7, 0.6])
    assert compare.case_figures(metrics, (2,), 12.5) == {
        "final_train_loss": 1.0, "eval_loss": 1.5, "tokens_per_s": 3.0, "peak_mem_gib": 0.7, "wall_time_s": 12.5,
        "loss_at_step_2": 2.0}


def test_parity_holds_when_every_step_agrees_within_the_limit():
    single = [(1, 2.0), (2, 1.5), (3, 1.25)]
    multi = [(1, 2.0 + 1e-5), (2, 1.5 - 4e-4), (3, 1.25)]
    parity = compare.compare_parity(single, multi, 1e-3)
    assert parity.ok and parity.worst_step == 2 and parity.max_abs_diff == pytest.approx(4e-4)


def test_parity_breaks_on_one_diverging_step():
    # What a DDP loss-normalisation bug looks like: the N-process loss off by a constant factor.
    single = [(1, 2.0), (2, 1.5)]
    multi = [(1, 2.0), (2, 1.5 * 2)]
    parity = compare.compare_parity(single, multi, 1e-3)
    assert not parity.ok and parity.worst_step == 2 and parity.max_abs_diff == pytest.approx(1.5)


def test_parity_breaks_when_the_runs_log_different_steps():
    parity = compare.compare_parity([(1, 2.0), (2, 1.5)], [(1, 2.0)], 1e-3)
    assert not parity.ok and parity.unmatched_steps == (2,)
    assert not compare.compare_parity([(1, 2.0)], [], 1e-3).ok


def test_parity_of_runs_that_logged_nothing_is_empty_not_ok():
    # Held-out losses of runs that never evaluated: nothing to compare, which the report shows as n/a.
    nothing = compare.compare_parity([], [], 1e-3)
    assert nothing.empty and not nothing.ok
    assert not compare.compare_parity([(0, 2.0)], [], 1e-3).empty
    assert not compare.compare_parity([(0, 2.0)], [(0, 2.0)], 1e-3).empty
