import json
import textwrap

import pytest

from nbddp.errors import UsageError
from nbddp.orchestration import compare
from nbddp.orchestration.regress import CaseResult, RegressionFailed, regress, report_rows
from nbddp.orchestration.suite import Case

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
def test_parity_of_one_process_with_accumulation_and_two_processes(workdir):
    suite = write_suite(workdir, textwrap.dedent("""\
        script: train_fixture.py
        cases:
          - name: parity
            parity: {nproc: 2, max_abs_diff: 1.0e-9}
            params: {max_steps: 3}
    """))
    report = regress(suite)  # parity needs no baseline
    row = [line for line in report.read_text().splitlines() if line.startswith("| parity |")][0]
    assert row.endswith("| ok |")
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
               "parity": CaseResult(parity=compare.compare_parity([(1, 1.0)], [(1, 1.5)], 1e-3))}
    rows = report_rows(cases, results, {"cases": {}}, update_baseline=True)
    assert [(row.case, row.status) for row in rows] == [("run", "FAILED"), ("parity", "FAILED")]


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
