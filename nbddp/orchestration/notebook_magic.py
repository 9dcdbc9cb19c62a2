"""`%nbddp`: nbddp's command line from a Jupyter notebook (`%load_ext nbddp`, then `%nbddp run --nproc-per-node 4`).

The line is split as a shell would (shlex) and runs as `sys.executable -m nbddp LINE`, a child process in a session of
its own: never in the kernel, which must not initialise CUDA, and whose interrupts (ipykernel signals its whole
process group) reach the child only through us. It runs in the project root: the kernel's working directory (the
notebook's folder), or its parent when that folder is named `notebooks`, so the CLI's defaults (`--notebooks
notebooks`, `--script generated/train.py`) fit. Its stdout and stderr stream into the cell as they come, carriage
returns kept (a progress bar redraws in place). `run`, `smoke` and `launch` of the default script export first when
generated/ is stale (`export --check`), as `run` would otherwise refuse and `smoke`/`launch` run the old script. A
non-zero exit raises `CommandFailed`, shown as one line under the output. The kernel's interrupt (a KeyboardInterrupt)
goes to the child as SIGINT; it stops its own children and says where to resume, and then the interrupt goes on.
"""

import codecs
import contextlib
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

from nbddp.orchestration import environment

NOTES = """
%nbddp runs the command above in a child process, from the project root (the notebook's folder, or its parent when
that is notebooks/); run, smoke and launch export generated/ first when the notebooks changed.
It needs: the notebook saved (export reads the .ipynb on disk), and the GPUs free: memory this kernel holds is not
free for the ranks, so free it (del model; torch.cuda.empty_cache()) or restart the kernel after exploring."""

EXPORTS_FIRST = {"run", "smoke", "launch"}  # the subcommands that run generated/train.py


class CommandFailed(subprocess.CalledProcessError):
    """The nbddp command exited non-zero; its output is already in the cell, so the error is one line."""

    def __str__(self):
        return f"`nbddp {shlex.join(self.cmd[3:])}` exited with status {self.returncode}; its output is above"

    def _render_traceback_(self):  # IPython shows these lines instead of a traceback
        return [f"{type(self).__name__}: {self}"]


def load_ipython_extension(ipython):
    """Register `%nbddp` (`%load_ext nbddp`)."""
    ipython.register_magic_function(nbddp_magic, magic_kind="line", magic_name="nbddp")


def nbddp_magic(line):
    """%nbddp SUBCOMMAND [FLAGS]: `nbddp SUBCOMMAND [FLAGS]` in a child process (`%nbddp --help`)."""
    args = shlex.split(line)
    root = project_root(Path.cwd())
    if exports_first(args):
        export_if_stale(root)
    status = stream(cli_command(args), root)
    if args[:1] in (["-h"], ["--help"]) and status == 0:
        print(NOTES)
    if status != 0:
        raise CommandFailed(status, cli_command(args))


def project_root(cwd):
    """Where the CLI runs: `cwd`, or its parent when `cwd` is a `notebooks` folder."""
    return cwd.parent if cwd.name == "notebooks" else cwd


def cli_command(args):
    return [sys.executable, "-m", "nbddp", *args]


def exports_first(args):
    """Whether the command runs the default script, which export then refreshes first (not for --help)."""
    return (bool(args) and args[0] in EXPORTS_FIRST and not {"-h", "--help"} & set(args)
            and not any(arg == "--script" or arg.startswith("--script=") for arg in args))


def export_if_stale(root):
    """`nbddp export` in `root` when `nbddp export --check` finds generated/ stale; a check that fails otherwise (bad
    input in a notebook) shows its output and raises CommandFailed."""
    check = cli_command(["export", "--check"])
    result = subprocess.run(check, cwd=root, env=child_environment(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    if result.returncode == 0:
        return
    if result.returncode != 1:
        print(result.stdout, end="")
        raise CommandFailed(result.returncode, check)
    print("nbddp: the notebooks changed since the last export; exporting first", flush=True)
    if (status := stream(cli_command(["export"]), root)) != 0:
        raise CommandFailed(status, cli_command(["export"]))


def child_environment():
    return environment.child_environment() | {"PYTHONUNBUFFERED": "1"}


def stream(command, cwd):
    """Run `command` in `cwd`, printing its output (stderr merged) as it comes; returns its exit status. An
    interrupt (KeyboardInterrupt) goes to the child's process group as SIGINT; once the child has exited, with its
    last words printed, the KeyboardInterrupt goes on."""
    process = subprocess.Popen(command, cwd=cwd, env=child_environment(), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, start_new_session=True)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    interrupted = False
    with process:
        while True:
            try:
                chunk = os.read(process.stdout.fileno(), 65536)
            except KeyboardInterrupt:
                interrupted = True
                with contextlib.suppress(ProcessLookupError):  # again on a second press: the child ignores it
                    os.killpg(process.pid, signal.SIGINT)
                continue
            if not chunk:
                break
            print(decoder.decode(chunk), end="", flush=True)
        print(decoder.decode(b"", final=True), end="", flush=True)
    if interrupted:
        raise KeyboardInterrupt
    return process.returncode
