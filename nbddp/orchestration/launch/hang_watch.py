"""Name a hung rank within minutes: launch watches its workers' heartbeats (`runtime.reporting.heartbeat`).

A worker whose heartbeat is older than the run setting `hang_s` (seconds, default HANG_S; 0 turns the watch off) has
stopped answering: stopped by a signal, on a stalled machine, or stuck in native code that holds the interpreter lock. A
collective would wait the process-group timeout (the run setting `timeout_s`, 1800 s) for it, with every rank silent;
the watch kills it instead (SIGKILL, which a stopped process takes too), so torchrun stops the others at once, and
the failure report names it as hung. A rank that is slow but alive keeps beating, so a long checkpoint save or
model load is not mistaken for a hang. Only this machine's workers are watched, by this machine's launch.
"""
import os
import shutil
import signal
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from nbddp.errors import UsageError
from nbddp.formats.run_settings import ENV, setting
from nbddp.runtime.reporting import heartbeat

VARIABLE = ENV.HANG_S
HANG_S = setting("hang_s").default  # well above any pause of a live rank's heartbeat thread, far below the 1800 s collective timeout
POLL_S = 1.0


@dataclass
class Hung:
    rank: int
    pid: int
    silent_s: float
    stopped: bool  # the process was in the stopped state (SIGSTOP, Ctrl-Z)
    limit_s: float

    def describe(self) -> str:
        state = "its process was stopped (SIGSTOP or Ctrl-Z)" if self.stopped else "its process was still running"
        return (f"rank {self.rank} (pid {self.pid}) stopped answering: no heartbeat for {self.silent_s:.0f} s, "
                f"{state}; nbddp killed it rather than let the others wait in a collective for {ENV.TIMEOUT_S} "
                f"(set {VARIABLE} to wait longer than {self.limit_s:g} s, 0 to never)")


def limit_s(environ=None) -> float:
    environ = os.environ if environ is None else environ
    text = environ.get(VARIABLE, str(HANG_S))
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value < 0:
        raise UsageError(f"{VARIABLE}={text!r}: give the seconds a rank may go without a heartbeat before it counts "
                         f"as hung (default {HANG_S}), or 0 to never")
    return value


class Watch:
    """Polls the heartbeat files in `folder`; `hung` is the first rank found silent for `limit` seconds."""

    def __init__(self, folder: Path, limit: float):
        self.folder, self.limit, self.hung = folder, limit, None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nbddp-hang-watch", daemon=True)

    def start(self):
        self._thread.start()

    def stop(self):
        self._done.set()
        self._thread.join()

    def _run(self):
        while not self._done.wait(POLL_S):
            now = time.time()
            for path in sorted(self.folder.glob("rank-*")):
                try:
                    silent, pid = now - path.stat().st_mtime, int(path.read_text() or 0)
                except (OSError, ValueError):
                    continue
                if silent > self.limit and pid and _ours(pid, self.folder):
                    self.hung = Hung(int(path.name.removeprefix("rank-")), pid, silent, _stopped(pid), self.limit)
                    os.kill(pid, signal.SIGKILL)
                    return


@contextmanager
def watching(env: dict):
    """While the body runs the job with `env`, watch its workers (unless the run setting `hang_s` is 0); yields the
    Watch (None when off). `env` gets the run setting `heartbeat_dir`, a private folder removed afterwards."""
    limit = limit_s(env)
    if not limit:
        yield None
        return
    folder = Path(tempfile.mkdtemp(prefix="nbddp-heartbeat-"))  # 0700, ours
    env[heartbeat.VARIABLE] = str(folder)
    watch = Watch(folder, limit)
    watch.start()
    try:
        yield watch
    finally:
        watch.stop()
        shutil.rmtree(folder, ignore_errors=True)


def _ours(pid: int, folder: Path) -> bool:
    """Whether `pid` is still one of this job's workers (it has our heartbeat folder in its environment), not a
    process that took the pid of one that exited (Linux: /proc; elsewhere never, so nothing is killed)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"{heartbeat.VARIABLE}={folder}".encode() in environ.split(b"\0")


def _stopped(pid: int) -> bool:
    """Whether the process is in the stopped state (Linux: /proc; elsewhere unknown, False)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] in ("T", "t")
