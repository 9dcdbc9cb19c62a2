"""What a person sees of `nbddp run` on the default job (the starter project, two gloo processes on CPU): a line
every tenth of the steps from rank 0 instead of a line per bar refresh and a dict per step, the smoke run's steps
from inside its kernel, nothing but warnings and the summary with -q; and nbddp's figures in TensorBoard."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nbddp import cli

REPO = Path(__file__).parents[2]

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    folder = tmp_path_factory.mktemp("console") / "job"
    assert cli.main(["new", str(folder)]) == 0
    return folder


def console(project, *flags):
    """`nbddp run FLAGS` in `project`: its console, stdout and stderr as one, in lines (a bar's refreshes in place,
    joined by carriage returns, are one)."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    env.pop("NBDDP_LOG_LEVEL", None)
    result = subprocess.run([sys.executable, "-m", "nbddp", "run", *flags], cwd=project, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-6000:]
    return result.stdout.rstrip("\n").split("\n")


def test_the_default_run_shows_a_line_every_tenth_of_the_steps_and_tensorboard_has_nbddps_figures(project):
    lines = console(project, "-p", "max_steps", "40")
    shown = "\n".join(lines)
    training = [line for line in lines if re.match(r"\[default0\]:nbddp: step \d+/40 \(", line)]
    assert [int(re.search(r"step (\d+)/", line)[1]) for line in training] == [1, *range(4, 41, 4)], shown
    assert re.search(r"step 40/40 \(100%\): loss \d+\.\d{4}, [\d,]+ tokens/s, ETA", training[-1])
    assert not any("[default1]:nbddp: step" in line or "{'loss'" in line for line in lines), shown
    assert not any(line.startswith("[default1]:") and "%|" in line for line in lines), shown  # rank 0's bars only
    assert "nbddp: step 3/3 (100%)" in "\n".join(line for line in lines if line.startswith("nbddp: step"))  # smoke
    assert len(lines) < 200, shown  # data preparation bars included; 173 lines at 20 steps, more every step, before

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = sorted((project / "runs").glob("*-run/train/runs/*/events.out.tfevents*"))
    accumulator = EventAccumulator(str(events[0].parent))
    accumulator.Reload()
    scalars = accumulator.Tags()["scalars"]
    assert {"train/loss", "train/tokens_per_s", "train/peak_mem_gib", "train/global_batch"} <= set(scalars)
    assert [event.step for event in accumulator.Scalars("train/tokens_per_s")] == list(range(1, 41))
    assert {event.value for event in accumulator.Scalars("train/global_batch")} == {8}


def test_quiet_leaves_warnings_and_the_summary(project):
    lines = console(project, "-q", "-p", "max_steps", "2")
    shown = "\n".join(lines)
    summary = lines.index(next(line for line in lines if line.startswith("run: done; everything is in ")))
    assert any(line.startswith("  loss curve:") for line in lines[summary:]), shown
    assert not [line for line in lines if re.match(r"(\[default\d\]:)?(nbddp|smoke|launch): (?!warning)", line)], shown
    assert not any("Loading weights" in line or "Executing:" in line for line in lines), shown
    assert len(lines[:summary]) < 10, shown  # the workers' warnings
