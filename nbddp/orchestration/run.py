"""`pipeline.py run`: export check -> smoke -> torchrun, stopping at the first failure, then a summary.

With `--batch-layout auto`, the smoke run trains the same steps again in the fuller layout and torchrun gets it
only if the losses agree (layout_check). The summary splits the run's wall time into its phases.
Everything lands in `runs/<UTC timestamp>-run/`: `smoke/` (the smoke run), `train/` (the training
run's output_dir, unless -p output_dir says otherwise), `logs/` (every rank's stdout/stderr) and
`loss_curve.png`. A SIGINT or SIGTERM, at any stage, stops it and every process it started (`stopping`).
"""

import os
import time
from pathlib import Path

from nbddp import log
from nbddp.errors import NbddpError
from nbddp.formats import metrics as metrics_format
from nbddp.formats.metrics import METRICS_FILE
from nbddp.formats.run_settings import ENV
from nbddp.formats.sourcemap import SourceMap
from nbddp.orchestration import devices, parameters, plots, stopping
from nbddp.orchestration.launch import launch
from nbddp.orchestration.metrics import last_trainer_state, read_metrics, read_trainer_state
from nbddp.orchestration.project import files
from nbddp.orchestration.project.rundir import RUNS_ROOT, new_run_dir
from nbddp.orchestration.smoke import layout_check, smoke_run


class LaunchFailed(NbddpError):
    """torchrun failed; `pipeline.py run` exits with torchrun's own status."""

    def __init__(self, status, logs):
        self.exit_status = status
        super().__init__(f"torchrun exited with status {status}; every rank's output is in {logs}")


def check_export_fresh(script):
    """Stop when the script's folder differs from what export would write now from the notebooks it came from
    (the folder its source map names; notebooks/ without a map)."""
    from nbddp.export import export  # the export room (libcst, jupytext) is only needed for this check

    notebooks = SourceMap.for_script(script).notebook_dir() or "notebooks"
    stale = export(notebooks=notebooks, out=Path(script).parent, check=True).stale
    if stale:
        shown = [files.shown(path) for path in (notebooks, Path(script).parent)]
        again = "" if shown == ["notebooks", "generated"] else f" --notebooks {shown[0]} --out {shown[1]}"
        raise NbddpError("the generated script is out of date:\n  " + "\n  ".join(stale) +
                         f"\n  hint: run `python pipeline.py export{again}`")


@stopping.ends_on_signals
def run(script=smoke_run.DEFAULT_SCRIPT, flags=(), params_file=None, options=launch.LaunchOptions(), device=None,
        timeout=None, runs_root=RUNS_ROOT, *, overrides=(), batch_layout=None, strategy=None):
    """Check, smoke, launch, summarise. The -p/-f parameters (and `batch_layout`, `strategy`) go to torchrun and
    (but for the run length and output_dir) to the smoke run; the `--set` lines `overrides`, checked first, to both,
    as the run setting `set`."""
    times = {"began": time.time()}  # when each phase began, for the summary's wall time split
    notebook, defaults, user = smoke_run.user_parameters(script, flags, params_file, batch_layout, strategy)  # in 2 s
    overrides_env = parameters.checked_overrides_environment(overrides)  # from the cached schema: in 2 s too
    check_export_fresh(script)
    user = parameters.with_absolute_paths(script, defaults, user)
    visible = devices.single_device(device)
    started = time.time()
    run_dir = new_run_dir("run", runs_root)
    train = dict(user)
    output_dir = Path(user.get("output_dir", run_dir / "train"))
    if "output_dir" in defaults and "output_dir" not in user:
        train["output_dir"] = str(output_dir)
    logs = run_dir / "logs"
    launch_env = smoke_run.output_dir_environment(defaults, output_dir) | overrides_env
    plan = launch.plan_launch(script, parameters.as_script_flags(train), options, log_dir=logs, extra_env=launch_env)
    # The smoke run takes the user's values except the run length and output_dir, which are the training
    # run's: `-p max_steps 1000` means a long training run, not a long smoke run.
    smoke_user = {name: value for name, value in user.items() if name not in {"output_dir", *smoke_run.SMOKE_DEFAULTS}}
    check = None
    times["smoke"] = time.time()
    if user.get(parameters.BATCH_LAYOUT) == "auto":
        processes = options.processes(os.environ) * options.nnodes  # the world torchrun will run
        check = layout_check.prove(notebook, script, defaults, smoke_user, visible, timeout, run_dir, overrides_env,
                                   processes)
        train[parameters.BATCH_LAYOUT] = check.launch_layout()
        plan = launch.plan_launch(script, parameters.as_script_flags(train), options, log_dir=logs,
                                  extra_env=launch_env)  # planned before the smoke runs too: bad flags fail first
    else:
        smoke_run.run_smoke(notebook, script, defaults, smoke_user, visible, timeout, run_dir / "smoke", overrides_env)
    log.logger.info(f"launch: {plan.describe()}")
    times["launched"] = time.time()
    status = launch.execute(plan)
    times["finished"] = time.time()
    if status != 0:
        raise LaunchFailed(status, logs)
    # the notebook's own saves: in the project around its folder (the cells' working directory)
    project = parameters.project_folder(user)
    summary = summarise(run_dir, Path(os.environ.get(ENV.OUTPUT_DIR, output_dir)), logs, check,
                        saved=saved_models(project, started, runs_root), wall_s=time.time() - times["began"],
                        times=times)
    print(summary, flush=True)
    return summary


def summarise(run_dir, output_dir, logs, check=None, saved=(), wall_s=None, times=None):
    """The summary text; draws loss_curve.png in `run_dir` from the training run's metrics; `check`: the smoke
    run's layout check (`--batch-layout auto`); `saved`: the models the notebook's own code saved (`saved_models`);
    `wall_s`: how long the whole command took; `times`: the time.time() each phase of it began (`run`)."""
    lines = [f"run: done; everything is in {run_dir}"]
    if check is not None:
        lines.append(f"  layout check:  {check.describe()}")
    adapter = _find_adapter(output_dir)
    in_checkpoint = adapter is not None and any(part.startswith("checkpoint-") for part in adapter.parts)
    lines.append(f"  adapter:       {adapter or f'none found under {output_dir}'}"
                 + (" (the last checkpoint's)" if in_checkpoint else ""))
    lines += [f"  saved by the notebook: {path}" for path in saved]
    lines.append(f"  logs:          {logs}")
    if wall_s is not None and times is not None:
        lines.append(f"  wall time:     {_wall_time(wall_s, times, check, output_dir / METRICS_FILE)}")
    events = sorted(output_dir.rglob("events.out.tfevents*")) if output_dir.exists() else []
    if events:
        lines.append(f"  TensorBoard:   tensorboard --logdir {os.path.commonpath([e.parent for e in events])}")
    metrics_path = output_dir / METRICS_FILE
    if metrics_path.exists():
        metrics = read_metrics(metrics_path)
    elif state := last_trainer_state(output_dir):
        lines.append(f"  metrics:       {state} (no {METRICS_FILE}: losses only)")
        metrics = read_trainer_state(state)
    else:
        lines.append(f"  metrics:       none ({metrics_path} was not written)")
        return "\n".join(lines)
    if metrics.batch_plan:
        lines.append(f"  batch:         {metrics.batch_plan['text']}")
        if metrics.batch_plan.get("warning"):
            lines.append(f"  warning:       {metrics.batch_plan['warning']}")
    if metrics.losses:
        training = f", {metrics.train_runtime_s:.1f} s of training" if metrics.train_runtime_s is not None else ""
        whole = f" (the whole run, smoke included: {wall_s:.0f} s)" if wall_s is not None else ""
        lines.append(f"  steps:         {metrics.losses[-1][0]}{training}{whole}")
    lines.append(f"  train loss:    {_figure(metrics.final_train_loss, '.4f')} (final step)")
    lines.append(f"  held-out loss: {_figure(metrics.eval_loss, '.4f')}")
    lines.append(f"  tokens/s:      {_figure(metrics.median_tokens_per_s, ',.0f', ' (median over steps)')}")
    lines.append(f"  peak memory:   {_figure(metrics.max_peak_mem_gib, '.2f', ' GiB')}")
    if metrics.step_split is not None and metrics.step_split["steps"] > 0:
        lines.append(f"  step time:     {_step_time(metrics.step_split)}")
    if metrics.median_mfu is not None and metrics.utilization is not None:  # measured on a GPU, Llama-style model
        lines.append(f"  GPU use (MFU): {_utilization(metrics)}")
    curves = {"train loss": metrics.losses, "held-out loss": metrics.eval_losses}
    title = f"{Path(run_dir).name}\n{metrics.batch_plan['text'].split(' (')[0]}" if metrics.batch_plan else Path(
        run_dir).name
    panels = [(title, curves)]
    for path, other in other_trainers(output_dir):  # a later trainer of the script with the same output_dir
        lines.append(f"  {path.parent.name}:     {_trainer_figures(other)} ({path})")
        panels.append((path.parent.name, {"train loss": other.losses, "held-out loss": other.eval_losses}))
    lines.append(f"  loss curve:    {plots.plot_loss_panels(panels, run_dir / 'loss_curve.png', markers={'held-out loss'})}")
    return "\n".join(lines)


def other_trainers(output_dir):
    """(path, Metrics) of the records of the script's later trainers with this output_dir, in their order: the k-th
    writes `<output_dir>/trainer-<k>/metrics.jsonl` (nbddp.runtime.trainer.training_checkpoints)."""
    found = [path for path in Path(output_dir).glob(f"trainer-*/{METRICS_FILE}")
             if path.parent.name.removeprefix("trainer-").isdigit()]
    return [(path, read_metrics(path)) for path in sorted(found, key=lambda p: int(p.parent.name.split("-")[1]))]


def _trainer_figures(metrics) -> str:
    steps = metrics.losses[-1][0] if metrics.losses else 0
    return (f"{steps} steps, train loss {_figure(metrics.final_train_loss, '.4f')} (final step), held-out loss "
            f"{_figure(metrics.eval_loss, '.4f')}")


def _utilization(metrics) -> str:
    """The median MFU, with what it is measured against."""
    basis = metrics.utilization
    return (f"{metrics.median_mfu:.1%} (median over steps) of {basis['peak_flops_per_s'] / 1e12:,.0f} TFLOP/s, the "
            f"bf16 matmul rate measured on {basis['device']}; {basis['convention']}")


STEP_PHASE_LABELS = {"forward_backward": "forward and backward", "optimizer": "optimizer",
                     "between_steps": "between steps (batches, logging, saves, evaluation)"}


def _step_time(split) -> str:
    """`212 ms a step over 58 steps: forward and backward 81%, ...`: the mean step and its phases' shares."""
    seconds = {phase: split[f"{phase}_s"] for phase in STEP_PHASE_LABELS}
    total = sum(seconds.values())
    shares = ", ".join(f"{label} {seconds[phase] / total:.0%}" for phase, label in STEP_PHASE_LABELS.items()) \
        if total > 0 else "no time measured"
    return f"{total / split['steps'] * 1e3:,.0f} ms a step over {split['steps']} steps: {shares}"


def _wall_time(wall_s, times, check, metrics_path) -> str:
    """`95.0 s: export and checks 3.1 s, smoke 25.0 s, ...`: the phases of `run` from `times` (began, smoke,
    launched, finished), the layout check's own time, and where the training run's `end` record puts its training
    (`ended_at` less `train_runtime`) inside torchrun's: its start before, the cells after it (saves) after."""
    layout_s = (check.wall_s or 0.0) if check is not None else 0.0
    phases = [("export and checks", times["smoke"] - times["began"]),
              ("smoke", times["launched"] - times["smoke"] - layout_s)]
    if check is not None:
        phases.append(("layout check", layout_s))
    records = metrics_format.read(metrics_path, strict=False) if metrics_path.exists() else []
    ends = [record for record in metrics_format.events(records, "end")
            if all(isinstance(record.get(name), (int, float)) for name in ("ended_at", "train_runtime"))]
    if ends:
        ended_at, training = ends[-1]["ended_at"], ends[-1]["train_runtime"]
        phases += [("torchrun start", ended_at - training - times["launched"]), ("training", training),
                   ("saves", times["finished"] - ended_at)]
    else:
        phases.append(("torchrun", times["finished"] - times["launched"]))
    return f"{wall_s:.1f} s: " + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in phases)


def saved_models(root, since, runs_root=RUNS_ROOT, depth=3):
    """The model and adapter folders under `root` (`depth` levels at most; not in runs/, hidden or virtualenv
    folders) written since `since`: where the notebook's own `save_pretrained("lora_model")` calls put them."""
    skip = {Path(runs_root).resolve()}
    found = []

    def visit(folder, level):
        try:
            entries = sorted(folder.iterdir())
        except OSError:
            return
        configs = {"adapter_config.json", "config.json"} & {entry.name for entry in entries}
        if configs and max((folder / name).stat().st_mtime for name in configs) >= since:
            found.append(folder.relative_to(root) if folder != root else folder)
            return
        for entry in entries:
            if (level < depth and entry.is_dir() and not entry.is_symlink() and not entry.name.startswith(".")
                    and not (entry / "pyvenv.cfg").exists() and entry.resolve() not in skip
                    and not entry.name.startswith("checkpoint-")):
                visit(entry, level + 1)

    visit(Path(root), 0)
    return found


def _find_adapter(output_dir):
    """The saved LoRA adapter (a directory with adapter_config.json), preferring one outside checkpoint-*."""
    if not output_dir.exists():
        return None
    adapters = sorted(path.parent for path in output_dir.rglob("adapter_config.json"))
    final = [path for path in adapters if not any(part.startswith("checkpoint-") for part in path.parts)]
    return (final or adapters or [None])[-1]


def _figure(value, spec, unit=""):
    return "n/a" if value is None else f"{value:{spec}}{unit}"
