"""`pipeline.py smoke`: run the generated script once, as a notebook, for a few steps on one device (smoke_run).

With `--batch-layout auto`, the one smoke run trains its steps in the notebook's layout and then in the fuller one
that torchrun's processes would use, and compares them (layout_check).
Everything lands in `runs/<UTC timestamp>-smoke/`. A SIGINT or SIGTERM stops papermill and its kernel (`stopping`).
"""

import os

from nbddp.orchestration import devices, parameters, stopping
from nbddp.orchestration.launch.launch import LaunchOptions
from nbddp.orchestration.project.rundir import RUNS_ROOT, new_run_dir
from nbddp.orchestration.smoke import layout_check
from nbddp.orchestration.smoke.smoke_run import DEFAULT_SCRIPT, run_smoke, user_parameters


@stopping.ends_on_signals
def smoke(script=DEFAULT_SCRIPT, flags=(), params_file=None, device=None, timeout=None, runs_root=RUNS_ROOT, *,
          overrides=(), batch_layout=None, strategy=None):
    """Smoke-run `script` with the smoke defaults, then the -f file's values, then each -p flag.

    `flags` are `(name, text)` pairs from `-p NAME VALUE`; `device` is None (first GPU, else CPU),
    `cpu` or a GPU index; `timeout` is per cell, in seconds. `overrides` are `NAME=VALUE` lines from
    `--set` (training arguments; checked before anything runs); `batch_layout` and `strategy` are
    `--batch-layout`'s and `--strategy`'s values (None: the script's default); with batch layout `auto` it
    smoke-runs both layouts in one run into `smoke/` and compares them (layout_check), returning None. Raises
    NotebookRunFailed (exit 1) at the source notebook cell and line of a failing cell.
    """
    notebook, defaults, user = user_parameters(script, flags, params_file, batch_layout, strategy)
    overrides_env = parameters.checked_overrides_environment(overrides)
    visible = devices.single_device(device)
    run_dir = new_run_dir("smoke", runs_root)
    if user.get(parameters.BATCH_LAYOUT) == "auto":  # both layouts, compared: what `run` would launch
        layout_check.prove(notebook, script, defaults, user, visible, timeout, run_dir, overrides_env,
                           LaunchOptions().processes(os.environ))
        return None
    return run_smoke(notebook, script, defaults, user, visible, timeout, run_dir, overrides_env)
