"""`--batch-layout auto`'s smoke check: one smoke run trains both layouts, compared step by step, to decide torchrun's
layout."""
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from nbddp.orchestration.launch.launch import LaunchOptions
from nbddp.orchestration.run import run
from nbddp.orchestration.smoke import layout_check

from .conftest import needs_generated_script

HOOK = Path(__file__).resolve().parents[1] / "fixtures" / "e2e" / "sitecustomize.py"


def metrics_file(path, plan, losses):
    lines = [{"event": "batch_plan", **plan, "text": "..."}] + [{"step": s, "loss": v} for s, v in losses]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


NOTEBOOK = {"micro_batch": 2, "accumulation": 4, "processes": 1}
FULLER = {"micro_batch": 8, "accumulation": 1, "processes": 2}


def test_equal_losses_prove_the_fuller_layout(tmp_path):
    check = layout_check.compare(metrics_file(tmp_path / "a", NOTEBOOK, [(1, 6.0), (2, 5.0)]),
                                 metrics_file(tmp_path / "b", FULLER, [(1, 6.0000001), (2, 5.0000002)]), 1e-4)
    assert check.proven and check.launch_layout() == "8"
    assert check.max_rel_diff == pytest.approx(4e-8, rel=0.01)
    assert check.describe().endswith("(tolerance 0.0001): torchrun uses micro batch 8")


def test_losses_apart_keep_the_notebooks_layout(tmp_path):
    check = layout_check.compare(metrics_file(tmp_path / "a", NOTEBOOK, [(1, 6.0), (2, 5.0)]),
                                 metrics_file(tmp_path / "b", FULLER, [(1, 6.0), (2, 5.01)]), 1e-4)
    assert not check.proven and check.launch_layout() == "notebook"
    assert "differ by more than the tolerance" in check.describe()


def test_the_same_layout_or_missing_metrics_launch_the_notebooks(tmp_path):
    same = layout_check.compare(metrics_file(tmp_path / "a", NOTEBOOK, [(1, 6.0)]),
                                metrics_file(tmp_path / "b", NOTEBOOK, [(1, 6.0)]), 1e-4)
    assert not same.differs and same.launch_layout() == "notebook" and "kept the notebook's layout" in same.describe()
    missing = layout_check.compare(None, metrics_file(tmp_path / "b", FULLER, [(1, 6.0)]), 1e-4)
    assert missing.launch_layout() == "notebook" and "wrote no metrics.jsonl" in missing.describe()
    steps = layout_check.compare(metrics_file(tmp_path / "a", NOTEBOOK, [(1, 6.0), (2, 5.0)]),
                                 metrics_file(tmp_path / "b", FULLER, [(1, 6.0)]), 1e-4)
    assert steps.launch_layout() == "notebook" and "different steps" in steps.describe()


@pytest.fixture
def hook(tmp_path, monkeypatch):
    """tests/fixtures/e2e/sitecustomize.py in every process the run starts (they inherit our environment)."""
    folder = tmp_path / "hook"
    folder.mkdir()
    shutil.copy(HOOK, folder / "sitecustomize.py")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")])))
    return folder


def wall_time_split(summary):
    """(the run's wall time, [(phase, seconds)]) from the summary's `wall time:` line."""
    whole, parts = re.search(r"wall time: +([\d.]+) s: (.*)", summary).groups()
    return float(whole), [(name, float(seconds)) for name, seconds in re.findall(r"([a-z][a-z ]*) ([\d.-]+) s", parts)]


@pytest.mark.e2e
@needs_generated_script
def test_run_launches_the_proven_layout(repo_root, tmp_path, hook, monkeypatch):
    """One smoke process proves the layout: one model load before torchrun (each of its 2 processes loads its own),
    and the summary's wall time split adds up to the run's wall time."""
    loads = tmp_path / "loads.log"
    monkeypatch.setenv("NBDDP_E2E_LOAD_LOG", str(loads))
    flags = [("max_steps", "4"), ("eval_steps", "100"), ("gradient_accumulation_steps", "2")]  # per process
    summary = run(flags=flags, options=LaunchOptions("2"), device="cpu", timeout=900, runs_root=tmp_path,
                  batch_layout="auto")
    assert ("layout check:  micro batch 8 x 1 per process against 4 x 2 (--batch_layout notebook) on 2 processes, "
            "3 steps on one device: max relative loss difference" in summary)
    assert "torchrun uses micro batch 8" in summary
    assert "batch:         global batch 16 rows = 8 per device x 1 accumulation x 2 processes" in summary
    ranks = [line.split()[0] for line in loads.read_text().splitlines()]
    assert sorted(ranks) == ["-", "0", "1"]  # "-": the smoke kernel, before torchrun
    whole, phases = wall_time_split(summary)
    assert [name for name, _ in phases] == ["export and checks", "smoke", "layout check", "torchrun start",
                                            "training", "saves"]
    assert all(seconds > 0 for _, seconds in phases), summary
    assert sum(seconds for _, seconds in phases) == pytest.approx(whole, rel=0.05), summary


@pytest.mark.e2e
@needs_generated_script
def test_a_planted_difference_is_refused(repo_root, tmp_path, hook, monkeypatch):
    """The layout check's second training gets another seed (another data order): not the same training, so
    torchrun must get the notebook's layout."""
    monkeypatch.setenv("NBDDP_E2E_LAYOUT_CHECK_SEED", "7")
    flags = [("max_steps", "4"), ("eval_steps", "100"), ("gradient_accumulation_steps", "2")]  # per process
    summary = run(flags=flags, options=LaunchOptions("2"), device="cpu", timeout=900, runs_root=tmp_path,
                  batch_layout="auto")
    assert "the losses differ by more than the tolerance" in summary
    assert "batch:         global batch 16 rows = 4 per device x 2 accumulation x 2 processes" in summary
