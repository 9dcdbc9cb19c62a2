"""`pipeline.py launch --slurm`: write an sbatch script that runs the generated script on N nodes x G GPUs.

The job runs one torchrun per node (`srun --ntasks-per-node=1`); each starts G workers, and the
torchruns meet at a c10d rendezvous on the allocation's first node (`scontrol show hostnames`). The
script sets the environment defaults `launch` sets, and is written once: an existing file is never
replaced. Nothing is submitted; the user runs `sbatch PATH`.
"""

import os
import shlex
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

from nbddp.errors import UsageError
from nbddp.orchestration.launch.launch import FIXED_ENV_DEFAULTS

DEFAULT_JOB_SCRIPT = Path("train.sbatch")
FIRST_PORT, PORT_RANGE = 20000, 10000  # MASTER_PORT = FIRST_PORT + job id % PORT_RANGE, unless set
# What may follow `#SBATCH --name=`: SLURM's own syntax for names, times ("1-12:00:00") and partition lists.
DIRECTIVE_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:,+")


@dataclass(frozen=True)
class SlurmOptions:
    """The job's shape and the #SBATCH values; checked when made, before anything is written."""

    nodes: int = 1
    gpus_per_node: int = 1  # also torchrun's --nproc-per-node: one worker per GPU
    job_name: str = "nbddp"
    time: str | None = None  # SLURM's time limit, e.g. "04:00:00"
    partition: str | None = None
    cpus_per_node: int | None = None  # CPUs for each node's torchrun and its workers (SLURM's default is 1)
    max_restarts: int = 0

    def __post_init__(self):
        for flag, value in (("--nodes", self.nodes), ("--gpus-per-node", self.gpus_per_node)):
            if value < 1:
                raise UsageError(f"{flag} {value}: expected at least 1")
        if self.cpus_per_node is not None and self.cpus_per_node < 1:
            raise UsageError(f"--cpus-per-node {self.cpus_per_node}: expected at least 1")
        if self.max_restarts < 0:
            raise UsageError(f"--max-restarts {self.max_restarts}: expected 0 or more")
        for flag, value in (("--job-name", self.job_name), ("--time", self.time), ("--partition", self.partition)):
            if value is not None and (not value or not set(value) <= DIRECTIVE_CHARACTERS):
                raise UsageError(f"{flag} {value!r}: expected letters, digits and - _ . : , + only")

    def directives(self, workdir):
        """The #SBATCH lines."""
        values = [("job-name", self.job_name), ("nodes", self.nodes), ("ntasks-per-node", 1),
                  ("gpus-per-node", self.gpus_per_node), ("cpus-per-task", self.cpus_per_node),
                  ("time", self.time), ("partition", self.partition), ("chdir", shlex.quote(str(workdir)))]
        return [f"#SBATCH --{name}={value}" for name, value in values if value is not None]


def job_script(script, script_args=(), options=SlurmOptions(), python=sys.executable, workdir=None):
    """The text of the sbatch script that runs `script` with `script_args` as `options` say."""
    workdir = Path.cwd() if workdir is None else Path(workdir)
    workers = options.gpus_per_node
    env_defaults = [f'export {name}="${{{name}:-{value}}}"' for name, value in FIXED_ENV_DEFAULTS.items()]
    srun = "srun --ntasks-per-node=1 --kill-on-bad-exit=1"
    if options.cpus_per_node:
        srun += f" --cpus-per-task={options.cpus_per_node}"  # srun no longer inherits sbatch's (SLURM 22.05+)
    restarts = f" --max-restarts {options.max_restarts}" if options.max_restarts else ""
    lines = [
        "#!/bin/bash",
        *options.directives(workdir),
        "#",
        "# Written by `python pipeline.py launch --slurm` (nbddp). Submit it with: sbatch <this file>",
        f"# {options.nodes} node(s) x {workers} worker(s): one torchrun per node, meeting at a c10d rendezvous",
        "# on the first node of the allocation.",
        "set -euo pipefail",
        "",
        'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)"',
        "export MASTER_ADDR  # not on the line above: `export` would hide a failure of scontrol from `set -e`",
        "# From the job id, so that two jobs whose first node is the same do not share a port.",
        f'export MASTER_PORT="${{MASTER_PORT:-$(( {FIRST_PORT} + SLURM_JOB_ID % {PORT_RANGE} ))}}"',
        "# What `pipeline.py launch` sets unless already set; OMP_NUM_THREADS is set on each node below.",
        *env_defaults,
        "",
        "# Single quotes: each node expands its own $SLURM_NODEID and counts its own CPUs. \"$0\" is the",
        "# Python interpreter, \"$@\" the script and its flags, given after the quoted command.",
        f"{srun} bash -c '",
        f"  threads=$(( $(nproc) / {workers} ))",
        '  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(( threads > 0 ? threads : 1 ))}"',
        '  exec "$0" -m torch.distributed.run --nnodes "$SLURM_NNODES" --node-rank "$SLURM_NODEID" \\',
        '    --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" --rdzv-id "$SLURM_JOB_ID" \\',
        f'    --nproc-per-node {workers}{restarts} "$@"',
        f"' {shlex.join([python, str(script), *script_args])}",
    ]
    return "\n".join(lines) + "\n"


def write_job_script(script, script_args=(), options=SlurmOptions(), path=DEFAULT_JOB_SCRIPT):
    """Write the sbatch script to `path` (never over an existing file) and say how to submit it."""
    if not Path(script).is_file():
        raise UsageError(f"--script {script}: no such file (run `python pipeline.py export` first)")
    path = Path(path)
    create_text(path, job_script(script, script_args, options))
    print(f"wrote {path}: {options.nodes} node(s) x {options.gpus_per_node} GPU(s) running {script}")
    print(f"submit it with: sbatch {shlex.quote(str(path))}")
    return path


def create_text(path, text):
    """Write `path` whole, and only if it does not exist: a temp file hard-linked into place, which fails when
    `path` exists (os.replace would silently overwrite it)."""
    if path.exists():
        raise UsageError(f"-o {path}: already exists; nbddp does not overwrite it (delete it or choose another path)")
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    temp.write_text(text, encoding="utf-8")
    try:
        os.link(temp, path)
    except FileExistsError:
        raise UsageError(f"-o {path}: already exists; nbddp does not overwrite it") from None
    finally:
        temp.unlink()
