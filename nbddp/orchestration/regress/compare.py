"""Compare a run's figures with the baseline's, and two runs' per-step training or held-out losses for DDP parity.

"Worse" depends on the metric: higher losses, memory and wall time are worse; lower tokens/s is.
"""

from dataclasses import dataclass

LOSS_AT_STEP = "loss_at_step"  # figures loss_at_step_<N>; one tolerance entry covers them all
LOWER_IS_WORSE = {"tokens_per_s"}
METRICS = ("final_train_loss", "eval_loss", LOSS_AT_STEP, "tokens_per_s", "peak_mem_gib", "wall_time_s")


@dataclass(frozen=True)
class Row:
    """One line of the report table; `failed` rows make `regress` exit non-zero."""

    case: str
    metric: str
    baseline: float | None
    now: float | None
    tolerance: str
    status: str  # ok, WORSE, missing, new, info, n/a, FAILED, parity ok

    @property
    def failed(self):
        return self.status in ("WORSE", "missing", "FAILED")

    @property
    def delta(self):
        if self.baseline is None or self.now is None:
            return None
        return self.now - self.baseline


def case_figures(metrics, loss_at_steps, wall_time_s):
    """The figures `regress` tracks for one run, from its Metrics and measured wall time."""
    figures = {
        "final_train_loss": metrics.final_train_loss,
        "eval_loss": metrics.eval_loss,
        "tokens_per_s": metrics.median_tokens_per_s,
        "peak_mem_gib": metrics.max_peak_mem_gib,
        "wall_time_s": wall_time_s,
    }
    for step in loss_at_steps:
        figures[f"{LOSS_AT_STEP}_{step}"] = metrics.loss_at(step)
    return figures


def tolerance_for(metric, tolerances):
    if metric.startswith(f"{LOSS_AT_STEP}_"):
        return tolerances.get(metric, tolerances.get(LOSS_AT_STEP))
    return tolerances.get(metric)


def allowance(baseline, tolerance):
    """How much worse than `baseline` a figure may get: the larger of the relative and absolute parts."""
    return max(tolerance.get("relative", 0) * abs(baseline), tolerance.get("absolute", 0))


def worsening(metric, baseline, now):
    """How much worse `now` is than `baseline` (negative: better)."""
    return baseline - now if metric in LOWER_IS_WORSE else now - baseline


def compare_figures(case, baseline, now, tolerances):
    """Rows for every figure in `now` or `baseline` of one case, in the order `now` lists them."""
    rows = []
    for metric in list(now) + [name for name in baseline if name not in now]:
        old, new = baseline.get(metric), now.get(metric)
        tolerance = tolerance_for(metric, tolerances)
        rows.append(Row(case, metric, old, new, describe_tolerance(tolerance), _status(metric, old, new, tolerance)))
    return rows


def _status(metric, old, new, tolerance):
    if old is None and new is None:
        return "n/a"
    if new is None:
        return "missing"
    if old is None:
        return "new"
    if tolerance is None:
        return "info"
    return "WORSE" if worsening(metric, old, new) > allowance(old, tolerance) else "ok"


def describe_tolerance(tolerance):
    if tolerance is None:
        return "-"
    parts = []
    if "relative" in tolerance:
        parts.append(f"{tolerance['relative'] * 100:g}%")
    if "absolute" in tolerance:
        parts.append(f"±{tolerance['absolute']:g}")
    return " or ".join(parts)


@dataclass(frozen=True)
class Parity:
    """Per-step loss agreement of two runs that should take identical optimizer steps."""

    max_abs_diff: float | None  # None when the runs share no step
    worst_step: int | None
    limit: float
    unmatched_steps: tuple  # steps logged by one run only

    @property
    def ok(self):
        return self.max_abs_diff is not None and not self.unmatched_steps and self.max_abs_diff <= self.limit

    @property
    def empty(self):
        """Neither run logged a value: nothing to compare (held-out losses of runs that never evaluated)."""
        return self.max_abs_diff is None and not self.unmatched_steps


def compare_parity(losses, other_losses, limit):
    """Compare `[(step, loss)]` of two runs step by step; both must log the same steps.

    A step logged twice counts once, with its last value: the Trainer evaluates at the last step and the
    generated script again after training (`trainer.evaluate()`), on the same weights.
    """
    first, second = dict(losses), dict(other_losses)
    unmatched = tuple(sorted(set(first) ^ set(second)))
    shared = sorted(set(first) & set(second))
    if not shared:
        return Parity(None, None, limit, unmatched)
    worst_step = max(shared, key=lambda step: abs(first[step] - second[step]))
    return Parity(abs(first[worst_step] - second[worst_step]), worst_step, limit, unmatched)
