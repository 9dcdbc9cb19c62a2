"""`pipeline.py launch`: run the generated script under torchrun, on one node or several.

The command is `sys.executable -m torch.distributed.run ...` (torchrun of this interpreter) built as
a list and run without a shell. `--nproc-per-node auto` means one process per visible GPU or,
without GPUs, two CPU processes (gloo), so DDP code paths run on a laptop too. SIGINT or SIGTERM stops torchrun and
every worker, and says where to resume (`stopping`). The workers get the `nbddp` logger's level as the run setting
`log_level` (`nbddp.log`); with `-q` and a log folder, the console shows their stderr only (their stdout is in the
folder). Their stderr reaches the console without other libraries' progress bars and warnings unless -v (console_noise):
the log folder keeps every rank's, and TORCHRUN_LOG all of torchrun's.
"""

import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from nbddp import log
from nbddp.errors import UsageError
from nbddp.formats.run_settings import ENV, setting
from nbddp.orchestration import devices, environment, parameters, stopping
from nbddp.orchestration.launch import failure_report, hang_watch, stderr_tail
from nbddp.orchestration.project import files

CPU_PROCESSES = 2  # `auto` without GPUs: the smallest world that still exercises DDP
DEFAULT_TIMEOUT_S = setting("timeout_s").default  # how long the runtime's collectives wait for a slow rank
DEFAULT_RDZV_ID = setting("rdzv_id").default
TORCHRUN_LOG = "torchrun.stderr.log"  # in the log folder: all of torchrun's stderr, which the console gets filtered


@dataclass(frozen=True)
class LaunchOptions:
    """How many processes on how many nodes; checked when made, before anything runs."""

    nproc: str = "auto"  # "auto" or a number, as typed after --nproc-per-node
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    rdzv_id: str = DEFAULT_RDZV_ID
    max_restarts: int = 0  # torchrun restarts every worker this many times after a failure (elastic)

    def __post_init__(self):
        if self.nproc != "auto" and (not str(self.nproc).isdigit() or int(self.nproc) < 1):
            raise UsageError(f"--nproc-per-node {self.nproc}: expected a positive number of processes or 'auto'")
        if self.max_restarts < 0:
            raise UsageError(f"--max-restarts {self.max_restarts}: expected 0 or more")
        if self.nnodes < 1:
            raise UsageError(f"--nnodes {self.nnodes}: expected at least 1")
        if self.nnodes == 1:
            return
        if not self.rdzv_endpoint:
            raise UsageError(f"--nnodes {self.nnodes}: several nodes need --rdzv-endpoint HOST:PORT "
                             "(an address every node reaches)")
        host, _, port = self.rdzv_endpoint.rpartition(":")
        if not host or not port.isdigit():
            raise UsageError(f"--rdzv-endpoint {self.rdzv_endpoint}: expected HOST:PORT")
        if not 0 <= self.node_rank < self.nnodes:
            raise UsageError(f"--node-rank {self.node_rank}: expected 0..{self.nnodes - 1} for --nnodes {self.nnodes}")

    def processes(self, environ):
        """Processes on this node: `auto` is one per visible GPU, or CPU_PROCESSES without GPUs."""
        if self.nproc == "auto":
            return len(devices.visible_gpus(environ)) or CPU_PROCESSES
        return int(self.nproc)

    def rendezvous_flags(self):
        if self.nnodes == 1:
            # One node: torchrun starts its own store on a free port, so two runs never collide.
            return ["--standalone", "--nnodes", "1"]
        # c10d assigns node ranks itself; --node-rank is passed for the log lines and static setups.
        return ["--nnodes", str(self.nnodes), "--node-rank", str(self.node_rank), "--rdzv-backend", "c10d",
                "--rdzv-endpoint", self.rdzv_endpoint, "--rdzv-id", self.rdzv_id]


@dataclass(frozen=True)
class LaunchPlan:
    """What `launch` runs: the command, and the variables it adds to the environment."""

    command: list
    env_additions: dict
    script: str | None = None  # and its flags: where a failure report finds the training output_dir
    script_args: tuple = ()
    processes: int | None = None  # on this node: a failure report names those that torchrun does not list
    log_dir: str | None = None  # torchrun's --log-dir: every rank's output, and torchrun's own stderr (TORCHRUN_LOG)

    def describe(self):
        """One shell line a user can paste to run the same thing."""
        assignments = [f"{name}={value}" for name, value in self.env_additions.items()]
        return shlex.join(assignments + self.command)


def plan_launch(script, script_args=(), options=LaunchOptions(), log_dir=None, environ=None, extra_env=None):
    """The torchrun command and environment additions for `script` with `script_args` (and `extra_env`)."""
    environ = os.environ if environ is None else environ
    processes = options.processes(environ)
    command = [sys.executable, "-m", "torch.distributed.run", *options.rendezvous_flags()]
    command += ["--nproc-per-node", str(processes)]
    if options.max_restarts:
        # A restarted worker starts the script afresh; the runtime resumes from the last checkpoint.
        command += ["--max-restarts", str(options.max_restarts)]
    if log_dir is not None:
        # Every rank's stdout and stderr into files under log_dir, and still on the console (with -q: stderr only).
        command += ["--log-dir", str(log_dir), *(["--redirects", "1", "--tee", "2"] if log.quiet() else ["--tee", "3"])]
    command += [str(script), *script_args]
    return LaunchPlan(command, env_additions(processes, environ) | (extra_env or {}), str(script), tuple(script_args),
                      processes, None if log_dir is None else str(log_dir))


# Set for the workers unless the user has; the SLURM job script sets the same (slurm.py).
FIXED_ENV_DEFAULTS = {
    # A rank that dies makes the others fail fast instead of hanging in a collective.
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    # The runtime's process-group timeout (NCCL and gloo), in seconds.
    ENV.TIMEOUT_S: str(DEFAULT_TIMEOUT_S),
    # Workers keep their own store rather than share the rendezvous one: in the shared store the keys of the
    # attempt before a --max-restarts restart survive, and the restarted gloo ranks connected to the dead
    # ranks' addresses ("Gloo connectFullMesh failed ... Connection refused"; pytorch#135712).
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
}


def env_additions(processes, environ):
    """Defaults for variables the user has not set; their own values always win."""
    defaults = {
        # torchrun would pin every worker to 1 thread; share the cores between the workers instead.
        "OMP_NUM_THREADS": str(max(1, _cpu_count() // processes)),
        **FIXED_ENV_DEFAULTS,
    }
    return {name: value for name, value in defaults.items() if name not in environ}


def _cpu_count():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def execute(plan, environ=None):
    """Run the plan; returns torchrun's exit status. When torchrun fails, prints which rank failed, where,
    and how far training got (`failure_report`). Raises stopping.Interrupted, naming the checkpoint to resume
    from, when a signal stopped it."""
    env = environment.child_environment(environ=environ) | log.environment() | plan.env_additions
    try:
        with hang_watch.watching(env) as watch:
            log_path = None if plan.log_dir is None else os.path.join(plan.log_dir, TORCHRUN_LOG)
            status, stderr = stderr_tail.run(plan.command, env, log_path)
    except stopping.Interrupted as stopped:
        output_dir = _output_dir(plan, env)
        resume = f"; {failure_report.resume_hint(output_dir)}" if output_dir else ""
        raise stopping.Interrupted(stopped.signum, f"torchrun and its workers have exited{resume}") from None
    if status != 0:
        hung = watch.hung if watch is not None else None
        print(failure_report.describe(status, stderr, _output_dir(plan, env), plan.processes, hung), file=sys.stderr,
              flush=True)
    return status


def _output_dir(plan, env):
    """The training output_dir: the script's `--output_dir` or default, else the run setting `output_dir` (a script
    without such a parameter); None when neither is known."""
    found = (failure_report.find_output_dir(plan.script, plan.script_args) if plan.script else None) \
        or env.get(ENV.OUTPUT_DIR)
    return Path(found) if found else None


@stopping.ends_on_signals
def launch(script=Path("generated/train.py"), script_args=(), options=LaunchOptions(), log_dir=None, dry_run=False, *,
           overrides=(), batch_layout=None, strategy=None):
    """Plan and (unless `dry_run`) run torchrun; prints the command; returns torchrun's exit status.
    `overrides`: `--set NAME=VALUE` lines, checked first, for the workers' run setting `set`; `batch_layout` and
    `strategy`: the script's `--batch_layout` and `--strategy` (None: its default)."""
    parameters.check_script_flag_paths(script, script_args)
    extra_env = parameters.checked_overrides_environment(overrides)
    script_args = [*script_args, *parameters.batch_layout_flags(batch_layout), *parameters.strategy_flags(strategy)]
    plan = plan_launch(script, script_args, options, log_dir, extra_env=extra_env)
    if dry_run:
        print(f"would run: {plan.describe()}", flush=True)
        return 0
    files.require_script(script)
    log.logger.info(f"launch: {plan.describe()}")
    return execute(plan)


def job_script_args(script_args=(), overrides=(), batch_layout=None, strategy=None):
    """The script flags a SLURM job script passes: `script_args`, `--batch_layout`, `--strategy`, and each `--set`
    line as the script's own `--set` flag (checked now; the job runs later, in an environment of its own)."""
    parameters.check_overrides([("--set", overrides)])
    return [*script_args, *parameters.batch_layout_flags(batch_layout), *parameters.strategy_flags(strategy),
            *(word for line in overrides for word in ("--set", line))]
