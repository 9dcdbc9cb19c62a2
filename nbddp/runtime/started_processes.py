"""Start a process that a cell starts (`subprocess.Popen`: a vLLM or sglang server, `ollama serve`, NeMo-Gym's
`ng_run`) once per machine, as `ddp.shell` runs a `!command`.

Under torchrun every rank runs the cell, so each would start its own server on the same port. The rewrite
`start_processes_once` writes `ddp.start_process(lambda: subprocess.Popen(...))`: the first rank of the machine to get
there calls the lambda and gets its `Popen`; a rank that gets there meanwhile or later gets a `ProcessOfAnotherRank`
for the same process, so the cells after it run on every rank as written (a loop polling the server on localhost,
`proc.poll()`, `proc.pid`, `proc.terminate()`, `proc.kill()`, `proc.wait()`). The lambda keeps the call's arguments
(`stdout = open("vllm.log", "w")`) from being evaluated on the ranks that do not start it. Not a collective: a rank
that never gets there (the server was up already) waits for nothing.

The ranks agree through once_per_machine's claim of the lambda's script line and how many times this rank has got
there. The starting rank writes the pid beside the claim, and the exit status when the process exits (a daemon
thread waits for it); the others signal it through a pidfd, which never reaches a later process given the same pid.
"""
import contextlib
import json
import os
import signal
import subprocess
import threading
import time

def start_once(start, once):
    """`start()` (a `Popen`) on the first rank of the machine to call this for the lambda's line; a
    `ProcessOfAnotherRank` for that process on the others. `once`: the context's OncePerMachine."""
    if once.local_world_size == 1:
        return start()
    code = start.__code__
    work = f"process\0{code.co_filename}\0{code.co_firstlineno}"
    with once.claim(work) as first:
        name = once.key(work)  # counts this rank's claims of the line: a loop starts one process per pass
        if first:
            process = start()
            _write(once.folder / f"{name}.pid", json.dumps({"pid": process.pid, "args": process.args}, default=str))
            threading.Thread(target=_record_exit, args=(process, once.folder / f"{name}.exit"), daemon=True).start()
            return process
    return ProcessOfAnotherRank(once.folder / f"{name}.pid", once.folder / f"{name}.exit")


class ProcessOfAnotherRank:
    """A process that another rank of this machine started, with what cells use of a `Popen`: `pid`, `args`,
    `returncode`, `poll()`, `wait(timeout)`, `send_signal`/`terminate`/`kill`. It has exited once the starting rank
    has recorded its exit status; a signal after that is not sent, as `Popen` sends none."""

    def __init__(self, pid_file, exit_file):
        started = json.loads(_read(pid_file))
        self.pid, self.args, self.returncode = started["pid"], started["args"], None
        self._exit_file = exit_file
        try:
            self._pidfd = os.pidfd_open(self.pid)
        except ProcessLookupError:  # gone already; its exit status comes from the file
            self._pidfd = None

    def poll(self):
        if self.returncode is None:
            with contextlib.suppress(FileNotFoundError, ValueError):
                self.returncode = int(_read(self._exit_file))
        return self.returncode

    def wait(self, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.1)
        return self.returncode

    def send_signal(self, sig):
        if self.poll() is None and self._pidfd is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, sig)

    def terminate(self):
        self.send_signal(signal.SIGTERM)

    def kill(self):
        self.send_signal(signal.SIGKILL)


def _record_exit(process, exit_file):
    status = process.wait()
    with contextlib.suppress(OSError):  # the job's folder is gone: no rank is left to read it
        _write(exit_file, str(status))


def _write(path, text):
    """`text` into a new file of the claim's private folder, in one write, never through a planted link."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(descriptor, text.encode())
    finally:
        os.close(descriptor)


def _read(path):
    descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with open(descriptor, encoding="utf-8") as file:
        return file.read()
