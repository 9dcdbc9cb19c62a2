"""`pipeline.py regress`: run the suite's cases, compare their figures with the baseline, report.

Each case runs into `runs/<UTC timestamp>-regress/<case>/`; the report (report.md: case, metric,
baseline, now, delta, tolerance, status) and loss_curves.png (baseline vs now per case; a parity case's
two runs, training and held-out losses) sit beside them. The baseline (`<suite>_baseline.json`) is only
ever written by `--update-baseline` from real runs.
"""

import json
import time
from dataclasses import dataclass

from nbddp.errors import NbddpError, UsageError
from nbddp.formats.metrics import METRICS_FILE
from nbddp.orchestration import devices, parameters, plots
from nbddp.orchestration.launch import launch
from nbddp.orchestration.metrics import read_metrics
from nbddp.orchestration.project import files
from nbddp.orchestration.project.rundir import RUNS_ROOT, new_run_dir
from nbddp.orchestration.regress import compare
from nbddp.orchestration.regress.suite import load_suite
from nbddp.orchestration.script_notebook import to_notebook
from nbddp.orchestration.smoke import notebook_run
from nbddp.runtime.inputs import training_overrides

TRAIN_PARITY = "parity max abs loss diff"
EVAL_PARITY = "parity max abs eval_loss diff"


class RegressionFailed(NbddpError):
    """A case ran worse than its tolerance, failed to run, or broke parity; the message names them."""

    exit_status = 1


class CaseFailed(NbddpError):
    """A case's run did not finish or left no metrics."""


@dataclass(frozen=True)
class CaseResult:
    figures: dict | None = None
    losses: tuple = ()
    error: str | None = None
    parity: compare.Parity | None = None  # training losses, parity cases only
    eval_parity: compare.Parity | None = None  # held-out losses, parity cases only
    parity_curves: dict | None = None  # label -> [(step, loss)], parity cases only
    eval_parity_curves: dict | None = None  # label -> [(step, held-out loss)], parity cases only


def regress(suite_path="regress.yaml", only=None, update_baseline=False, runs_root=RUNS_ROOT, *, overrides=()):
    """Run the suite (or only the case `only`); returns the report path; raises RegressionFailed.
    `overrides`: `--set NAME=VALUE` lines for every case, on top of each case's own `set:`."""
    suite = load_suite(suite_path)
    cases = suite.select(only)
    if not suite.script.is_file():
        raise UsageError(f"--suite {suite.path}: script {suite.script} does not exist (run `python pipeline.py export`)")
    notebook = to_notebook(suite.script)
    defaults = parameters.read_defaults(notebook, suite.script)
    # Check every case's parameters before the first run, so a typo costs no training time.
    case_params = {case.name: _case_parameters(suite, case, defaults) for case in cases}
    case_env = _case_environments(suite, cases, overrides)
    baseline = load_baseline(suite.baseline_path)
    run_dir = new_run_dir("regress", runs_root)
    results = {}
    for case in cases:
        print(f"regress: case {case.name} ({case.mode})", flush=True)
        results[case.name] = run_case(suite, case, notebook, case_params[case.name], run_dir / case.name,
                                      case_env[case.name])
    rows = report_rows(cases, results, baseline, update_baseline)
    report = write_report(run_dir, rows, cases, results, baseline)
    print(report.read_text(encoding="utf-8"), flush=True)
    if update_baseline:
        _update_baseline(suite, cases, results, baseline)
    failed = [_failure_text(row, results) for row in rows if row.failed]
    if failed:
        raise RegressionFailed("regression:\n  " + "\n  ".join(failed) + f"\n  report: {report}")
    return report


def _case_parameters(suite, case, defaults):
    params = parameters.resolve(defaults, case.params, file_label=f"--suite {suite.path}: case {case.name}")
    if "output_dir" not in defaults:
        raise UsageError(f"--suite {suite.path}: {suite.script} has no output_dir parameter, so no metrics to compare")
    return params


def _case_environments(suite, cases, overrides):
    """{case: the run setting `set` for its runs}: the case's `set:` lines, then the command line's `--set` (which win);
    all checked at once."""
    lines = {case.name: parameters.suite_override_lines(case.overrides) for case in cases}
    parameters.check_overrides([(training_overrides.FLAG, overrides)] +
                               [(f"--suite {suite.path}: case {name}: set", lines[name]) for name in lines])
    return {name: parameters.training_overrides_environment(lines[name], overrides) for name in lines}


def run_case(suite, case, notebook, params, case_dir, extra_env=None):
    """Run one case into `case_dir` (`extra_env`: the run setting `set` for its processes); a run that fails becomes a
    CaseResult with `error`."""
    case_dir.mkdir(parents=True)
    try:
        if case.mode == "parity":
            return _run_parity(suite, case, params, case_dir, extra_env)
        if case.mode == "papermill":
            metrics, wall_time_s = _run_papermill(suite, notebook, params, case_dir, extra_env)
        else:
            metrics, wall_time_s = _run_torchrun(suite.script, params, case.nproc, case_dir, extra_env)
    except (notebook_run.NotebookRunFailed, CaseFailed) as error:
        return CaseResult(error=str(error))
    figures = compare.case_figures(metrics, case.loss_at_steps, wall_time_s)
    return CaseResult(figures, tuple(metrics.losses))


def _run_papermill(suite, notebook, params, case_dir, extra_env=None):
    params = params | {"output_dir": str(case_dir)}
    run = notebook_run.run_notebook(notebook, suite.script, params, case_dir, devices.single_device(), suite.timeout,
                                    extra_env=extra_env)
    return _read_case_metrics(case_dir), run.wall_time_s


def _run_torchrun(script, params, nproc, case_dir, extra_env=None):
    flags = parameters.as_script_flags(params | {"output_dir": str(case_dir)})
    plan = launch.plan_launch(script, flags, launch.LaunchOptions(nproc=nproc), log_dir=case_dir / "logs",
                              extra_env=extra_env)
    print(f"regress: {plan.describe()}", flush=True)
    started = time.monotonic()
    status = launch.execute(plan)
    wall_time_s = time.monotonic() - started
    if status != 0:
        raise CaseFailed(f"torchrun exited with status {status}; logs in {case_dir / 'logs'}")
    return _read_case_metrics(case_dir), wall_time_s


def _read_case_metrics(case_dir):
    path = case_dir / METRICS_FILE
    if not path.exists():
        raise CaseFailed(f"the run wrote no {path}")
    return read_metrics(path)


def _run_parity(suite, case, params, case_dir, extra_env=None):
    """1 process vs N processes with the same parameters: the script keeps the notebook's global batch on N
    processes (`--batch_layout notebook`, nbddp.runtime.memory.batch_plan), so the same training losses, and the same
    held-out losses wherever the runs evaluated (the N processes split the held-out rows between them)."""
    single_label, multi_label = "1 process", f"{case.nproc} processes"
    single, _ = _run_torchrun(suite.script, params, 1, case_dir / "single", extra_env)
    multi, _ = _run_torchrun(suite.script, params, case.nproc, case_dir / "multi", extra_env)
    parity = compare.compare_parity(single.losses, multi.losses, case.max_abs_diff)
    if parity.unmatched_steps or parity.max_abs_diff is None:
        raise CaseFailed(f"the two runs logged different steps (only in one of them: {list(parity.unmatched_steps)})")
    # Evaluating at different steps is the eval row's failure, not the run's: the training row still shows.
    eval_parity = compare.compare_parity(single.eval_losses, multi.eval_losses, case.max_abs_diff)
    return CaseResult(parity=parity, eval_parity=eval_parity,
                      parity_curves={single_label: single.losses, multi_label: multi.losses},
                      eval_parity_curves={single_label: single.eval_losses, multi_label: multi.eval_losses})


def report_rows(cases, results, baseline, update_baseline=False):
    """The report table. With `update_baseline`, figures are shown but only run and parity failures fail."""
    rows = []
    for case in cases:
        result = results[case.name]
        if result.error is not None:
            rows.append(compare.Row(case.name, "run", None, None, "-", "FAILED"))
        elif result.parity is not None:
            rows += [_parity_row(case, TRAIN_PARITY, result.parity), _parity_row(case, EVAL_PARITY, result.eval_parity)]
        elif case.name not in baseline["cases"] and not update_baseline:
            rows.append(compare.Row(case.name, "baseline", None, None, "-", "missing"))
        else:
            old = baseline["cases"].get(case.name, {}).get("figures", {})
            case_rows = compare.compare_figures(case.name, old, result.figures, case.tolerances)
            rows += [_as_info(row) for row in case_rows] if update_baseline else case_rows
    return rows


def _parity_row(case, metric, parity):
    status = "n/a" if parity.empty else "ok" if parity.ok else "FAILED"
    return compare.Row(case.name, metric, None, parity.max_abs_diff, f"<= {parity.limit:g}", status)


def _as_info(row):
    return compare.Row(row.case, row.metric, row.baseline, row.now, row.tolerance, "updated" if row.failed else row.status)


def _failure_text(row, results):
    if row.metric == "run":
        return f"case {row.case}: the run failed: {results[row.case].error}"
    if row.metric == "baseline":
        return f"case {row.case}: no baseline (run `python pipeline.py regress --update-baseline`)"
    if row.metric == EVAL_PARITY:
        return _eval_parity_failure(row, results[row.case].eval_parity)
    if row.metric == TRAIN_PARITY:
        return f"case {row.case}: parity: losses differ by {_number(row.now)} (limit {row.tolerance})"
    return f"case {row.case}: {row.metric} {_number(row.baseline)} -> {_number(row.now)} ({row.status}, tolerance {row.tolerance})"


def _eval_parity_failure(row, parity):
    if parity.unmatched_steps:
        return (f"case {row.case}: parity: the two runs evaluated at different steps "
                f"(only in one of them: {list(parity.unmatched_steps)})")
    return (f"case {row.case}: parity: held-out losses differ by {_number(row.now)} at step {parity.worst_step} "
            f"(limit {row.tolerance})")


def load_baseline(path):
    if not path.exists():
        return {"cases": {}}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise NbddpError(f"{path}: not valid JSON ({error.msg}); regenerate it with --update-baseline") from None


def write_report(run_dir, rows, cases, results, baseline):
    """report.md (the table, then each failed run's message) and loss_curves.png in `run_dir`."""
    lines = ["| case | metric | baseline | now | delta | tolerance | status |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        lines.append(f"| {row.case} | {row.metric} | {_number(row.baseline)} | {_number(row.now)} | {_delta(row)} "
                     f"| {row.tolerance} | {row.status} |")
    for case in cases:
        if results[case.name].error is not None:
            lines += ["", f"## {case.name}: run failed", "", "```", results[case.name].error, "```"]
    report = run_dir / "report.md"
    files.write_text(report, "\n".join(lines) + "\n")
    panels = []
    for case in cases:
        result = results[case.name]
        panels.append((case.name, _curves(case, result, baseline)))
        # A panel of its own: the held-out curves of both runs lie on top of each other, like the training ones.
        if result.eval_parity_curves and any(result.eval_parity_curves.values()):
            panels.append((f"{case.name}: held-out loss", result.eval_parity_curves))
    plots.plot_loss_panels(panels, run_dir / "loss_curves.png")
    return report


def _curves(case, result, baseline):
    if result.parity_curves is not None:
        return result.parity_curves
    old = baseline["cases"].get(case.name, {}).get("losses", [])
    return {"baseline": [tuple(point) for point in old], "now": list(result.losses)}


def _number(value):
    return "-" if value is None else f"{value:.6g}"


def _delta(row):
    if row.delta is None:
        return "-"
    relative = f" ({row.delta / abs(row.baseline):+.1%})" if row.baseline else ""
    return f"{row.delta:+.4g}{relative}"


def _update_baseline(suite, cases, results, baseline):
    """Store the figures and loss curves of the cases that ran (parity cases need none) and say what changed."""
    updated = {"suite": suite.path.name, "cases": dict(baseline["cases"])}
    for case in cases:
        result = results[case.name]
        if result.error is not None or result.parity is not None:
            continue
        old = baseline["cases"].get(case.name, {}).get("figures", {})
        for metric, value in result.figures.items():
            if old.get(metric) != value:
                print(f"baseline: {case.name} {metric}: {_number(old.get(metric))} -> {_number(value)}")
        updated["cases"][case.name] = {"figures": result.figures, "losses": [list(point) for point in result.losses]}
    files.write_json(suite.baseline_path, updated)
    print(f"baseline: wrote {suite.baseline_path}")
