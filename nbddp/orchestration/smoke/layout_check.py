"""`--batch-layout auto` in `pipeline.py smoke` and `run`: prove the fuller layout on the smoke device first.

One smoke run, with one model load, trains its steps twice from the same start (nbddp.runtime.memory.
smoke_layout_check): in the notebook's layout as torchrun's N processes would (the run setting `plan_processes`, N: the
runtime lays the batch out for N processes, its one device taking all N shares of each step in turn), then in the fuller
layout those processes will use (`--batch_layout auto`), same weights, random state and data order. The two are
equal in exact arithmetic (Trainer normalises each step's loss by the tokens of the whole step, whatever its micro
batches); what differs is rounding in matrix products of other shapes. `run` launches torchrun with `--batch_layout b` (the proven micro
batch) when every step's training loss agrees within the tolerance, else with `--batch_layout notebook`, saying why.

Tolerance, relative per step. On the CPU (float32), the tiny model's first 3 steps, notebook 4 x 4 against the
2-process layout 8 x 1 run on one process as 8 x 2: at most 3.8e-6 apart; a planted other seed (data order)
moved them 8.8e-3, half the global batch 2.1e-2. CPU_TOLERANCE = 1e-4 lies between. On a GPU, bfloat16 and
float16 keep 8 and 11 bits of mantissa, and kernels of other shapes round otherwise: on an H200 with Unsloth
(bench/results/layout_1gpu), notebook 2 x 4 against 8 x 1 differed by at most 6.5e-6 (8B QLoRA), 2.5e-5 (1.1B)
and 3.9e-5 (3B conversational) over the first 3 steps, 3.2e-4 over all 60. GPU_TOLERANCE = 1e-3 is 25 times
the largest of the first three.
"""

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from nbddp.formats import metrics
from nbddp.formats.run_settings import ENV
from nbddp.orchestration.metrics import read_metrics
from nbddp.orchestration.parameters import BATCH_LAYOUT
from nbddp.orchestration.smoke import smoke_run

CPU_TOLERANCE = 1e-4
GPU_TOLERANCE = 1e-3
PLAN_PROCESSES = ENV.PLAN_PROCESSES
LAYOUT_CHECK = ENV.LAYOUT_CHECK  # where the runtime puts the notebook layout's metrics (smoke_layout_check)
NOTEBOOK_LAYOUT_METRICS = "metrics-notebook-layout.jsonl"  # in the smoke run's folder


@dataclass(frozen=True)
class LayoutCheck:
    """The notebook's layout and the fuller one, side by side on one device."""

    notebook: dict | None  # the batch_plan records of the two smoke runs (None: none written)
    fuller: dict | None
    steps: int  # steps both runs logged
    max_rel_diff: float | None
    tolerance: float
    reason: str = ""  # why the fuller layout is not used, when it is not
    wall_s: float | None = None  # what training the steps again in the fuller layout took

    @property
    def differs(self) -> bool:
        """The fuller run chose another micro batch than the notebook's split."""
        return bool(self.notebook and self.fuller) and self.fuller["micro_batch"] != self.notebook["micro_batch"]

    @property
    def proven(self) -> bool:
        return self.differs and not self.reason

    def launch_layout(self) -> str:
        """The `--batch_layout` torchrun gets: the proven micro batch, else the notebook's layout."""
        return str(self.fuller["micro_batch"]) if self.proven else "notebook"

    def describe(self) -> str:
        if not self.differs:
            return self.reason or "auto kept the notebook's layout (nothing fuller fits, or it is already the fullest)"
        fuller, notebook = self.fuller, self.notebook
        text = (f"micro batch {fuller['micro_batch']} x {fuller['accumulation']} per process against "
                f"{notebook['micro_batch']} x {notebook['accumulation']} (--batch_layout notebook) on "
                f"{_processes(fuller['processes'])}, {self.steps} steps on one device")
        if self.max_rel_diff is not None:
            text += f": max relative loss difference {self.max_rel_diff:.1e} (tolerance {self.tolerance:g})"
        return f"{text}; {self.reason}" if self.reason else f"{text}: torchrun uses micro batch {fuller['micro_batch']}"


def compare(notebook_metrics: Path | None, fuller_metrics: Path | None, tolerance: float) -> LayoutCheck:
    """Compare the two smoke runs' metrics.jsonl files (see the module)."""
    if notebook_metrics is None or fuller_metrics is None:
        return LayoutCheck(None, None, 0, None, tolerance, "the smoke run did not train in both layouts (its "
                                                           "trainer wrote no metrics.jsonl, or trained once: see its "
                                                           "output): the notebook's layout is used")
    notebook, fuller = read_metrics(notebook_metrics), read_metrics(fuller_metrics)
    check = LayoutCheck(notebook.batch_plan, fuller.batch_plan, 0, None, tolerance)
    if not check.differs:
        return check
    one, other = dict(notebook.losses), dict(fuller.losses)
    steps = sorted(one.keys() & other.keys())
    if not steps or one.keys() != other.keys():
        what = "no training loss" if not steps else "different steps"
        return LayoutCheck(check.notebook, check.fuller, len(steps), None, tolerance,
                           f"the two runs logged {what} (logging_steps above the smoke steps?): the notebook's "
                           "layout is used")
    worst = max(abs(other[step] - one[step]) / max(abs(one[step]), 1e-12) for step in steps)
    reason = "" if worst <= tolerance else ("the losses differ by more than the tolerance, so the layouts do not "
                                            "train alike here: torchrun uses the notebook's layout")
    return LayoutCheck(check.notebook, check.fuller, len(steps), worst, tolerance, reason)


def prove(notebook, script, defaults, user, visible, timeout, run_dir, extra_env, processes):
    """The smoke run in both layouts (see the module) into `run_dir`/smoke, on the device `visible`, for
    `processes` torchrun processes; prints and returns the LayoutCheck."""
    print(f"smoke: --batch-layout auto: the smoke steps in the notebook's layout, then in the fuller one, for "
          f"{_processes(processes)}", flush=True)
    notebook_layout = (run_dir / "smoke" / NOTEBOOK_LAYOUT_METRICS).resolve()
    env = (extra_env or {}) | {PLAN_PROCESSES: str(processes), LAYOUT_CHECK: str(notebook_layout)}
    result = smoke_run.run_smoke(notebook, script, defaults, user | {BATCH_LAYOUT: "auto"}, visible, timeout,
                             run_dir / "smoke", env)
    written = notebook_layout if notebook_layout.exists() else None
    check = compare(written, result.metrics, GPU_TOLERANCE if visible else CPU_TOLERANCE)
    timed = metrics.events(metrics.read(written), "layout_check") if written else []
    check = dataclasses.replace(check, wall_s=timed[-1]["wall_s"] if timed else None)
    print(f"smoke: layout check: {check.describe()}", flush=True)
    return check


def _processes(count: int) -> str:
    return f"{count} process{'es' if count != 1 else ''}"
