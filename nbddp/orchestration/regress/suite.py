"""The regression suite file (regress.yaml): named cases, each a short training run and its tolerances.

    script: generated/train.py
    timeout: 600                      # per notebook cell, papermill cases
    tolerances:                       # defaults for every case; a case's own entries win
      final_train_loss: {relative: 0.02}
      loss_at_step: {absolute: 0.01}  # every loss_at_step_<N>
    cases:
      - name: one-process
        mode: papermill               # one device, through the notebook path
        params: {max_steps: 8}
        loss_at_steps: [1, 4]
      - name: two-processes
        mode: torchrun
        nproc: 2
        params: {max_steps: 8}
        set: {lr_scheduler_type: cosine}  # training arguments, as `--set NAME=VALUE` (any mode)
      - name: ddp-parity              # 1 process vs N processes, same parameters: same global batch
        parity: {nproc: 2, max_abs_diff: 1.0e-3}  # per step, training and held-out losses alike
        params: {max_steps: 4}

A tolerance is `relative` (fraction of the baseline), `absolute`, or both (the larger allowance wins).
`params` are the script's parameters (typed from their defaults, like `-p`); `set` overrides keywords of the
training arguments the notebook builds, like the script's `--set NAME=VALUE` (bools true/false, a list's items
separated by spaces; typed and checked as Transformers types that field, before the first run). `pipeline.py
regress --set NAME=VALUE` applies to every case and wins over a case's `set`.

The file is checked here rather than against a JSON schema (jsonschema comes with nbformat): each message names
the case and says what the field takes, which a schema validator's messages do not.
"""

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from nbddp.errors import UsageError
from nbddp.orchestration.regress.compare import LOSS_AT_STEP, METRICS

MODES = ("papermill", "torchrun")
TOLERANCE_KINDS = ("relative", "absolute")


@dataclass(frozen=True)
class Case:
    name: str
    mode: str  # papermill, torchrun or parity
    params: dict
    nproc: int = 1
    loss_at_steps: tuple = ()
    tolerances: dict = field(default_factory=dict)
    max_abs_diff: float | None = None  # parity cases only
    overrides: dict = field(default_factory=dict)  # `set:` {training argument: value}


@dataclass(frozen=True)
class Suite:
    path: Path
    script: Path
    timeout: int | None
    cases: list

    @property
    def baseline_path(self):
        """`regress.yaml` -> `regress_baseline.json`, beside the suite."""
        return self.path.with_name(f"{self.path.stem}_baseline.json")

    def select(self, only=None):
        if only is None:
            return self.cases
        chosen = [case for case in self.cases if case.name == only]
        if not chosen:
            names = ", ".join(case.name for case in self.cases)
            raise UsageError(f"--only {only}: no such case in {self.path} (cases: {names})")
        return chosen


def load_suite(path):
    path = Path(path)
    where = f"--suite {path}"
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise UsageError(f"{where}: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise UsageError(f"{where}: not valid YAML ({error})") from None
    if not isinstance(document, dict) or not isinstance(document.get("cases"), list) or not document["cases"]:
        raise UsageError(f"{where}: expected a mapping with a non-empty `cases` list")
    defaults = _tolerances(document.get("tolerances", {}), where)
    cases = [_case(entry, defaults, where) for entry in document["cases"]]
    names = [case.name for case in cases]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise UsageError(f"{where}: case names must be unique; repeated: {', '.join(duplicates)}")
    return Suite(path, Path(document.get("script", "generated/train.py")), document.get("timeout"), cases)


def _case(entry, default_tolerances, where):
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        raise UsageError(f"{where}: every case needs a `name`")
    where = f"{where}: case {entry['name']}"
    params = entry.get("params", {})
    if not isinstance(params, dict):
        raise UsageError(f"{where}: `params` must be a mapping")
    overrides = entry.get("set", {})
    if not isinstance(overrides, dict) or not all(isinstance(name, str) for name in overrides):
        raise UsageError(f"{where}: `set` must map training argument names to values, e.g. "
                         "{learning_rate: 1.0e-4}")
    common = {"name": entry["name"], "params": params, "overrides": overrides}
    if "parity" in entry:
        parity = entry["parity"]
        if not isinstance(parity, dict) or "max_abs_diff" not in parity:
            raise UsageError(f"{where}: `parity` needs `max_abs_diff` (and `nproc`, default 2)")
        return Case(mode="parity", nproc=_nproc(parity.get("nproc", 2), where), max_abs_diff=float(parity["max_abs_diff"]),
                    **common)
    mode = entry.get("mode")
    if mode not in MODES:
        raise UsageError(f"{where}: `mode` must be one of {', '.join(MODES)} (or give `parity:`), not {mode!r}")
    nproc = 1 if mode == "papermill" else _nproc(entry.get("nproc"), where)
    steps = entry.get("loss_at_steps", [])
    if not isinstance(steps, list) or not all(isinstance(step, int) for step in steps):
        raise UsageError(f"{where}: `loss_at_steps` must be a list of step numbers")
    tolerances = default_tolerances | _tolerances(entry.get("tolerances", {}), where)
    return Case(mode=mode, nproc=nproc, loss_at_steps=tuple(steps), tolerances=tolerances, **common)


def _nproc(value, where):
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise UsageError(f"{where}: `nproc` must be a positive number of processes, not {value!r}")
    return value


def _tolerances(entries, where):
    if not isinstance(entries, dict):
        raise UsageError(f"{where}: `tolerances` must map metric names to {{relative: x}} / {{absolute: x}}")
    for metric, tolerance in entries.items():
        if metric not in METRICS and not str(metric).startswith(f"{LOSS_AT_STEP}_"):
            raise UsageError(f"{where}: unknown metric {metric!r} in tolerances (known: {', '.join(METRICS)})")
        if not isinstance(tolerance, dict) or not tolerance or set(tolerance) - set(TOLERANCE_KINDS):
            raise UsageError(f"{where}: tolerance of {metric} must have `relative` and/or `absolute`")
        if not all(isinstance(value, (int, float)) and value >= 0 for value in tolerance.values()):
            raise UsageError(f"{where}: tolerance of {metric} must be non-negative numbers")
    return dict(entries)
