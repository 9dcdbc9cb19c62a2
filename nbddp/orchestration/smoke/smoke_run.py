"""One smoke run: the generated script executed once as a notebook into a run folder, for a few steps on one device.

A few steps: the `max_steps` parameter set to 3 (or the user's `-p max_steps N`), and the run setting `max_steps`, the
same number, in the kernel's environment, which caps every training arguments the notebook builds (run-overrides), so a
smoke run stays short whatever `-p max_steps -1`, a script without that parameter or the notebook's epochs say;
likewise the `output_dir` parameter or the run setting `output_dir` (run-overrides) point training at the run folder.
`--set NAME=VALUE` overrides of the training arguments reach the kernel as the run setting `set` (training_overrides),
and `--batch-layout` as the script's `batch_layout` parameter; `-p per_device_train_batch_size` and
`gradient_accumulation_steps`, per-process values as the script's own flags are, also as the run setting
`per_process` (batch_plan). The run folder gets the executed notebook, its HTML rendering, params.json (what
papermill injected) and metrics.jsonl (the script's output_dir points there). `smoke`, `run` and the layout check
(`--batch-layout auto`) each start one.
"""

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from nbddp import log
from nbddp.formats.metrics import METRICS_FILE
from nbddp.formats.run_settings import ENV
from nbddp.orchestration import parameters
from nbddp.orchestration.project import files
from nbddp.orchestration.script_notebook import to_notebook
from nbddp.orchestration.smoke import notebook_run, project_changes
from nbddp.runtime.memory import batch_plan

DEFAULT_SCRIPT = Path("generated/train.py")
# A few optimizer steps show that data, model, LoRA and trainer fit together, in seconds.
SMOKE_DEFAULTS = {"max_steps": 3}


@dataclass(frozen=True)
class SmokeResult:
    run_dir: Path
    executed: Path
    html: Path | None
    parameters: dict
    metrics: Path | None


def user_parameters(script, flags=(), params_file=None, batch_layout=None, strategy=None):
    """The script as a notebook, its parameter defaults, and the user's typed overrides (-f, then -p, then
    --batch-layout and --strategy); a relative path among them that the cells would not find is refused
    (parameters.check_paths)."""
    files.require_script(script)
    notebook = to_notebook(script)
    defaults = parameters.read_defaults(notebook, script)
    file_values = parameters.load_parameter_file(params_file) if params_file else None
    user = parameters.resolve(defaults, file_values, flags, file_label=f"-f {params_file}")
    labels = {name: f"-f {params_file}: {name}" for name in file_values or {}} | {name: f"-p {name}" for name, _ in flags}
    parameters.check_paths(script, defaults, user, labels)
    user = parameters.with_batch_layout(defaults, user, batch_layout)
    return notebook, defaults, parameters.with_strategy(defaults, user, strategy)


def run_smoke(notebook, script, defaults, user, visible, timeout, run_dir, extra_env=None):
    """Execute the smoke run into `run_dir` on the device `visible` (a CUDA_VISIBLE_DEVICES value); `extra_env`
    (the run setting `set`) goes to the kernel too."""
    run_dir.mkdir(parents=True, exist_ok=True)
    injected = parameters.with_absolute_paths(script, defaults, smoke_parameters(defaults, user, run_dir))
    files.write_json(run_dir / "params.json", injected)
    steps = smoke_steps(injected)
    env = smoke_environment(defaults, run_dir, steps=steps) | (extra_env or {})
    if per_process := batch_plan.per_process_environment(user):  # the user's batch values: per process (batch_plan)
        env[batch_plan.PER_PROCESS] = per_process
    in_env = "".join(f"; {name}={value!r}" if "\n" in value else f"; {name}={value}" for name, value in env.items())
    log.logger.info(f"smoke: {script} on {'GPU ' + visible if visible else 'CPU'}, parameters {injected}{in_env}")
    if injected.get("max_steps") != steps and env.get(ENV.MAX_STEPS) == str(steps):
        log.logger.info(f"smoke: training stops after {steps} steps, whatever max_steps "
                        f"({injected.get('max_steps', 'not a parameter')}) or the notebook's epochs say: a smoke run "
                        "is short; the training run takes them")
    # the runtime's smoke_sandbox: what the notebook saves lands in run_dir, and nothing is pushed; what it does
    # not redirect is named afterwards, failed or not
    project = parameters.project_folder(injected)
    before = project_changes.snapshot(project, run_dir)
    try:
        run = notebook_run.run_notebook(notebook, script, injected, run_dir, visible, timeout,
                                        extra_env=env | {ENV.SMOKE_DIR: str(run_dir.resolve())})
    finally:
        _report_changes(project, before, run_dir)
    result = SmokeResult(run_dir, run.executed, run.html, injected, _collect_metrics(injected, run_dir))
    html = f", HTML {run.html}" if run.html else ""
    log.logger.info(f"smoke: ok in {run.wall_time_s:.1f} s; executed notebook {run.executed}{html}")
    return result


def smoke_parameters(defaults, user, run_dir):
    """Smoke defaults for the parameters the script has, output_dir in the run dir; the user wins."""
    injected = {name: value for name, value in SMOKE_DEFAULTS.items() if name in defaults}
    if "output_dir" in defaults:
        injected["output_dir"] = str(run_dir)
    return injected | user


def smoke_steps(injected):
    """The steps a smoke run trains: its `max_steps` parameter when that is 1 or more, else (-1, the notebook's
    epochs; a script without the parameter) SMOKE_DEFAULTS'."""
    steps = injected.get("max_steps")
    short = isinstance(steps, int) and not isinstance(steps, bool) and steps >= 1
    return steps if short else SMOKE_DEFAULTS["max_steps"]


def smoke_environment(defaults, run_dir, environ=None, steps=SMOKE_DEFAULTS["max_steps"]):
    """What the kernel's environment adds, unless the user set it: the run setting `max_steps` at `steps`, which
    `ddp.max_steps` applies to every training arguments the notebook builds, so the smoke run takes the smoke steps
    instead of the notebook's whole training (its epochs, a `max_steps` that is no parameter); for a script without an
    `output_dir` parameter, the run setting `output_dir`, which `ddp.output_dir` applies, so its checkpoints land
    here."""
    environ = os.environ if environ is None else environ
    env = {} if ENV.MAX_STEPS in environ else {ENV.MAX_STEPS: str(steps)}
    return env | output_dir_environment(defaults, run_dir, environ)


def output_dir_environment(defaults, output_dir, environ=None):
    """The run setting `output_dir` at `output_dir` for a script without an `output_dir` parameter, unless the user set
    it: where `ddp.output_dir(...)` points its training arguments (the smoke run's and the training run's folder)."""
    environ = os.environ if environ is None else environ
    if "output_dir" in defaults or ENV.OUTPUT_DIR in environ:
        return {}
    return {ENV.OUTPUT_DIR: str(output_dir)}


def _report_changes(project, before, run_dir):
    after = project_changes.snapshot(project, run_dir) if before is not None else None
    if after is None:
        log.logger.info(f"smoke: {project} has over {project_changes.MAX_ENTRIES} files: not checked for what the "
                        "notebook changed outside runs/")
        return
    text = project_changes.report(project, project_changes.changes(before, after))
    if text:
        log.logger.warning(text)


def _collect_metrics(injected, run_dir):
    """The run's metrics.jsonl, copied into the run dir when the user pointed output_dir elsewhere."""
    output_dir = Path(injected.get("output_dir", run_dir))
    source = output_dir / METRICS_FILE
    if not source.exists():
        return None
    target = run_dir / METRICS_FILE
    if source.resolve() != target.resolve():
        shutil.copyfile(source, target)
    return target
