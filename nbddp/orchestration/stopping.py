"""SIGINT and SIGTERM end the whole job, from a terminal (Ctrl-C) or from a supervisor (`timeout`, docker stop,
systemd, a CI cancel) alike.

Our children (papermill, torchrun) run in sessions of their own, as torchrun's workers and Jupyter's kernels do,
so a terminal's Ctrl-C reaches this process alone and this process decides. The first of the signals torchrun
itself handles (SIGINT, SIGTERM, SIGHUP, SIGQUIT) goes on to the running child as SIGTERM: torchrun's agent then
stops every worker (SIGTERM, and SIGKILL for one still there after its shutdown timeout), papermill's nbclient shuts
its kernel down. SIGTERM rather than SIGINT, because a Python worker takes SIGINT only between bytecodes, after the
collective it waits in, while SIGTERM ends it at once. A child still running STOP_GRACE_S later is killed. Later
signals change nothing (the job is ending; another one would only cut torchrun's shutdown short), and once the
child has exited `Interrupted` is raised: `pipeline.py` prints its one line and exits 128 + the signal's number
(130 for SIGINT, 143 for SIGTERM). Between children (`run`'s export check, say), a command that `ends_on_signals`
raises `Interrupted` at once, where a KeyboardInterrupt would print its traceback.
"""

import functools
import signal
import subprocess
import threading
from contextlib import contextmanager

from nbddp.errors import NbddpError

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)  # torchrun's --signals-to-handle
STOP_GRACE_S = 45  # more than torchrun's 30 s shutdown timeout, after which it kills a worker that hangs


class Interrupted(NbddpError):
    """A signal stopped the job; `pipeline.py` exits with 128 + its number. `outcome`: what stopped, and where to
    go on from."""

    def __init__(self, signum, outcome=None):
        self.signum = signum
        self.exit_status = 128 + signum
        super().__init__(f"stopped by {signal.Signals(signum).name}" + (f"; {outcome}" if outcome else ""))


class Stop:
    """The signal stopping the job (`signum`, None until one comes), passed on to `process` as SIGTERM."""

    def __init__(self):
        self.signum = None
        self.process = None
        self._kill_timer = None

    def handle(self, signum, frame):
        if self.signum is not None:
            return
        self.signum = signum
        if self.process is not None:
            self._terminate()

    def attach(self, process):
        self.process = process
        if self.signum is not None:  # the signal came while the child was starting
            self._terminate()

    def _terminate(self):
        self.process.terminate()
        self._kill_timer = threading.Timer(STOP_GRACE_S, self.process.kill)
        self._kill_timer.daemon = True
        self._kill_timer.start()

    def cancel(self):
        if self._kill_timer is not None:
            self._kill_timer.cancel()


def ends_on_signals(command):
    """Decorator for a command (smoke, launch, run): the signals above raise Interrupted while no child runs."""

    @functools.wraps(command)
    def run_command(*args, **kwargs):
        with _handled(_raise_interrupted):
            return command(*args, **kwargs)

    return run_command


def _raise_interrupted(signum, frame):
    raise Interrupted(signum)


@contextmanager
def _handled(handler):
    """`handler` for the signals above while the body runs; then the handlers before, or, once Interrupted came
    through, none: the job is ending, and another signal would only cut its report short."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread can set handlers
        yield
        return
    previous = {signum: signal.signal(signum, handler) for signum in SIGNALS}
    interrupted = False
    try:
        yield
    except Interrupted:
        interrupted = True
        raise
    finally:
        for signum, before in previous.items():
            signal.signal(signum, signal.SIG_IGN if interrupted else before)


@contextmanager
def child(command, **popen_args):
    """`subprocess.Popen(command, **popen_args)` in a session of its own, the signals above passed on to it while the
    body runs (it waits for the child); yields (process, stop). Raises Interrupted once the body is done if a signal
    came."""
    stop = Stop()
    with _handled(stop.handle):
        try:
            with subprocess.Popen(command, start_new_session=True, **popen_args) as process:
                stop.attach(process)
                yield process, stop
        finally:
            stop.cancel()
        if stop.signum is not None:
            raise Interrupted(stop.signum)
