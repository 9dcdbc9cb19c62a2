import json
import textwrap

import pytest

from nbddp.errors import UsageError
from nbddp.orchestration.metrics import Metrics
from nbddp.orchestration.regress import compare
from nbddp.orchestration.regress import regress as regress_module
from nbddp.orchestration.regress.regress import CaseResult, RegressionFailed, regress, report_rows
from nbddp.orchestration.regress.suite import Case

from .conftest import needs_generated_script

SUITE = textwrap.dedent("""\
    script: train_fixture.py
    timeout: 120
    tolerances:
      final_train_loss: {relative: 0.01}
      eval_loss: {relative: 0.01}
      loss_at_step: {absolute: 1.0e-6}
      wall_time_s: {relative: 10.0, absolute: 120}
    cases:
      - name: one-process
        mode: papermill
        params: {max_steps: 4}
        loss_at_steps: [2]
""")


def write_suite(workdir, text=SUITE):
    (workdir / "suite.yaml").write_text(text)
    return workdir / "suite.yaml"


@pytest.mark.e2e
def test_baseline_from_a_real_run_then_a_pass_then_a_stricter_baseline_fails(workdir, capsys):
    suite = write_suite(workdir)
    regress(suite, update_baseline=True)
    baseline = json.loads((workdir / "suite_baseline.json").read_text())
    figures = baseline["cases"]["one-process"]["figures"]
    assert len(baseline["cases"]["one-process"]["losses"]) == 4 and figures["loss_at_step_2"] is not None
    assert "baseline: one-process final_train_loss: - ->" in capsys.readouterr().out

    report = regress(suite)
    table = report.read_text()
    assert "| one-process | final_train_loss |" in table and "WORSE" not in table
    assert (report.parent / "loss_curves.png").stat().st_size > 0

    figures["final_train_loss"] *= 0.5  # a baseline that trained twice as well
    (workdir / "suite_baseline.json").write_text(json.dumps(baseline))
    with pytest.raises(RegressionFailed, match=r"case one-process: final_train_loss .*WORSE") as error:
        regress(suite)
    assert error.value.exit_status == 1
    assert "eval_loss" not in str(error.value)  # only the metric that got worse is named


@pytest.mark.e2e
def test_parity_of_one_and_two_processes_with_the_same_parameters(workdir):
    suite = write_suite(workdir, textwrap.dedent("""\
        script: train_fixture.py
        cases:
          - name: parity
            parity: {nproc: 2, max_abs_diff: 1.0e-9}
            params: {max_steps: 3}
    """))
    report = regress(suite)  # parity needs no baseline
    rows = [line for line in report.read_text().splitlines() if line.startswith("| parity |")]
    assert rows == ["| parity | parity max abs loss diff | - | 0 | - | <= 1e-09 | ok |",
                    "| parity | parity max abs eval_loss diff | - | 0 | - | <= 1e-09 | ok |"]  # evaluated at step 3
    single = (report.parent / "parity" / "single" / "metrics.jsonl").read_text()
    assert single.count('"loss"') == 3


def test_a_case_without_baseline_fails_unless_updating():
    case = Case(name="a", mode="papermill", params={})
    results = {"a": CaseResult(figures={"final_train_loss": 1.0}, losses=((1, 1.0),))}
    rows = report_rows([case], results, {"cases": {}})
    assert [(row.metric, row.failed) for row in rows] == [("baseline", True)]
    assert not any(row.failed for row in report_rows([case], results, {"cases": {}}, update_baseline=True))


def test_a_worse_figure_fails_but_not_while_updating_the_baseline():
    case = Case(name="a", mode="papermill", params={}, tolerances={"final_train_loss": {"relative": 0.1}})
    results = {"a": CaseResult(figures={"final_train_loss": 2.0})}
    baseline = {"cases": {"a": {"figures": {"final_train_loss": 1.0}}}}
    assert [row.status for row in report_rows([case], results, baseline)] == ["WORSE"]
    assert [row.status for row in report_rows([case], results, baseline, update_baseline=True)] == ["updated"]


def test_failed_runs_and_broken_parity_always_fail():
    cases = [Case(name="run", mode="torchrun", params={}, nproc=2),
             Case(name="parity", mode="parity", params={}, nproc=2, max_abs_diff=1e-3)]
    results = {"run": CaseResult(error="torchrun exited with status 1"),
               "parity": CaseResult(parity=compare.compare_parity([(1, 1.0)], [(1, 1.5)], 1e-3),
                                    eval_parity=compare.compare_parity([(1, 1.0)], [(1, 1.0)], 1e-3))}
    rows = report_rows(cases, results, {"cases": {}}, update_baseline=True)
    assert [(row.case, row.status) for row in rows] == [("run", "FAILED"), ("parity", "FAILED"), ("parity", "ok")]


PARITY_SUITE = textwrap.dedent("""\
    script: train_fixture.py
    cases:
      - name: parity
        parity: {nproc: 2, max_abs_diff: 1.0e-3}
        params: {max_steps: 2}
""")


def fake_parity_runs(monkeypatch, single_evals, multi_evals):
    """The parity case's two runs, without starting a process: equal training losses, the held-out losses given."""
    def run_torchrun(script, params, nproc, case_dir, extra_env=None):
        evals = single_evals if nproc == 1 else multi_evals
        return Metrics(losses=[(1, 2.0), (2, 1.5)], eval_losses=evals, tokens_per_s=[], peak_mem_gib=[]), 1.0

    monkeypatch.setattr(regress_module, "_run_torchrun", run_torchrun)


def parity_rows(report):
    return [line for line in report.read_text().splitlines() if line.startswith("| parity |")]


TRAIN_ROW = "| parity | parity max abs loss diff | - | 0 | - | <= 0.001 | ok |"


def test_parity_passes_with_equal_held_out_losses(workdir, monkeypatch):
    fake_parity_runs(monkeypatch, [(0, 6.4), (2, 6.2), (2, 6.2)], [(0, 6.4), (2, 6.2), (2, 6.2)])
    report = regress(write_suite(workdir, PARITY_SUITE))
    assert parity_rows(report) == [TRAIN_ROW, "| parity | parity max abs eval_loss diff | - | 0 | - | <= 0.001 | ok |"]
    assert (report.parent / "loss_curves.png").stat().st_size > 0


def test_parity_fails_on_held_out_losses_beyond_the_limit(workdir, monkeypatch):
    fake_parity_runs(monkeypatch, [(0, 6.4), (2, 6.2)], [(0, 6.4), (2, 6.21)])
    with pytest.raises(RegressionFailed, match=r"case parity: parity: held-out losses differ by 0\.01 at step 2 "
                                               r"\(limit <= 0\.001\)") as error:
        regress(write_suite(workdir, PARITY_SUITE))
    assert "parity: losses differ" not in str(error.value)  # the training losses agree
    report = next((workdir / "runs").glob("*-regress/report.md"))
    assert parity_rows(report) == [TRAIN_ROW,
                                   "| parity | parity max abs eval_loss diff | - | 0.01 | - | <= 0.001 | FAILED |"]


def test_parity_fails_when_the_runs_evaluate_at_different_steps(workdir, monkeypatch):
    fake_parity_runs(monkeypatch, [(0, 6.4), (1, 6.3), (2, 6.2)], [(0, 6.4), (2, 6.2)])
    with pytest.raises(RegressionFailed, match=r"case parity: parity: the two runs evaluated at different steps "
                                               r"\(only in one of them: \[1\]\)"):
        regress(write_suite(workdir, PARITY_SUITE))
    report = next((workdir / "runs").glob("*-regress/report.md"))
    assert parity_rows(report)[1].endswith("| parity max abs eval_loss diff | - | 0 | - | <= 0.001 | FAILED |")


def test_parity_without_held_out_losses_says_n_a(workdir, monkeypatch):
    fake_parity_runs(monkeypatch, [], [])
    report = regress(write_suite(workdir, PARITY_SUITE))
    assert parity_rows(report) == [TRAIN_ROW, "| parity | parity max abs eval_loss diff | - | - | - | <= 0.001 | n/a |"]


def test_bad_case_parameters_stop_before_any_run(workdir):
    suite = write_suite(workdir, SUITE.replace("{max_steps: 4}", "{max_steps: four}"))
    with pytest.raises(UsageError, match="case one-process: max_steps: expected int"):
        regress(suite)
    assert not (workdir / "runs").exists()


@pytest.mark.e2e
@needs_generated_script
def test_the_default_suite_holds_ddp_loss_parity(repo_root, tmp_path):
    report = regress("regress.yaml", only="ddp-loss-parity", runs_root=tmp_path)
    assert "| ddp-loss-parity | parity max abs loss diff |" in report.read_text()
    assert "| ddp-loss-parity | parity max abs eval_loss diff |" in report.read_text()
    assert "n/a" not in report.read_text()  # the case evaluates
