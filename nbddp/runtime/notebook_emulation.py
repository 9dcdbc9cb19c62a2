"""Notebook emulation in `ddp`: what a notebook does that the script must do as Jupyter would, once.

A cell's last value is displayed (`show`), a `!command` runs in a shell (`shell`), a `%%writefile` cell writes its
file (`write_file`) and a cell's `subprocess.Popen` starts a server (`start_process`); under torchrun every rank runs
the script, so the side effects happen once per machine (once_per_machine) and the display on the main process.
"""
import builtins
import os
import subprocess
import sys
from pathlib import Path

from nbddp import log
from nbddp.runtime import smoke_sandbox, started_processes


class NotebookEmulation:
    """`ddp.show()`, `shell()`, `write_file()` and `start_process()`; part of DistributedContext, whose attributes
    they read (is_main_process, _once)."""

    def show(self, value):
        """What Jupyter does with a cell's last value, once: display it on the main process unless it is None.
        `display` is IPython's in a kernel, nbddp's printing one in a script (see
        nbddp.runtime.reporting.script_display)."""
        if value is not None and self.is_main_process:
            builtins.display(value)

    def shell(self, command, namespace=None):
        """A notebook's `!command`, run as IPython runs it (`$SHELL -c command`) but once per machine: the first
        rank of the machine to get here runs it, and one that gets here meanwhile waits for it to finish, so that
        a `!wget` or `!git clone` fetches once and every rank then finds the files (see once_per_machine; not a
        collective: a rank that skips the call, under a condition or outside a rank-0 block, waits for nothing).
        A command that fails does not stop the script, as it does not stop a notebook (IPython's default): a
        `!git clone` that finds its folder from the smoke run, or from the run before, must not end the training
        run. Its exit status is reported on stderr, naming the command as written (a filled-in secret stays out
        of the logs); the files it should have made then fail where they are used. The command writes to the
        script's own stdout and stderr (not through Python: a pipe would hang on `!server &`, turn progress
        bars' `\r` into lines and hold back unflushed output), and reads no input, so that a prompt (`apt-get`
        without `-y`) fails instead of waiting unseen.

        `namespace` (the script's variables, which convert-magics passes for a command with `{...}` or `$`):
        IPython's expansion, `!wget {url}` -> `wget https://...`, done by IPython's own formatter; where it
        fails (`{a,b}` for bash, a JSON body, an unknown `$HOME`) the command runs as written, as in IPython."""
        expanded = command if namespace is None else _expand_like_ipython(command, namespace)
        with self._once.claim(f"shell\0{expanded}") as first:
            if first:
                sys.stdout.flush()  # the command's output after what the script printed before it
                sys.stderr.flush()
                status = subprocess.run(expanded, shell=True, executable=os.environ.get("SHELL") or None,
                                        stdin=subprocess.DEVNULL).returncode
                if status:
                    log.warning(f"nbddp: warning: `!{command}` exited with status {status}; the script goes on, as a "
                                "notebook does")

    def write_file(self, path, text, append=False):
        """A notebook's `%%writefile [-a] path` cell: write its text once per machine, as `shell` runs a command,
        and say so as IPython does; in a smoke run, under its folder (smoke_sandbox)."""
        with self._once.claim(f"write_file\0{path}\0{append}\0{text}") as first:
            if first:
                path = Path(smoke_sandbox.redirected(path)).expanduser()
                verb = ("Appending to" if append else "Overwriting") if path.exists() else "Writing"
                with open(path, "a" if append else "w", encoding="utf-8") as file:
                    file.write(text)
                print(f"{verb} {path}", flush=True)

    def start_process(self, start):
        """A cell's `subprocess.Popen(...)` (a server), as `ddp.start_process(lambda: subprocess.Popen(...))`: started
        once per machine, as `shell` runs a command; the other ranks get a handle on that process
        (started_processes)."""
        return started_processes.start_once(start, self._once)


def _expand_like_ipython(command, namespace):
    from IPython.utils.text import DollarFormatter  # only for the commands that use expansion

    try:
        return DollarFormatter().vformat(command, args=[], kwargs=namespace)
    except Exception:  # what InteractiveShell.var_expand does: any failure leaves the command as written
        return command
