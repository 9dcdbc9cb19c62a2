"""Run torchrun with its stderr passed through to ours as it comes, keeping the end of it.

torchrun's agent prints its failure summary (which rank failed, its exit code or signal, its error file) on
stderr and nowhere else; `failure_report` reads it from the kept end. The workers inherit the same stderr, so
the end holds their last lines too; it is bounded, because training can print for days. The console gets it
without other libraries' progress bars and warnings (console_noise, unless -v); a log file, when given, all of
it. The workers' stdin is /dev/null. A SIGINT or SIGTERM stops torchrun and its workers (`stopping`); the console
then no longer echoes their shutdown.
"""

import codecs
import contextlib
import os
import subprocess
import sys
import threading

from nbddp.orchestration import console_noise, stopping

KEEP_CHARS = 1 << 20  # torchrun's summary is a few KiB; a worker's traceback rarely more
DRAIN_S = 10  # after torchrun exits: a worker it orphaned may hold the pipe open, so stop waiting for EOF then


def run(command, env, log_path=None):
    """Run `command`; returns (exit status, the last KEEP_CHARS characters of its stderr). `log_path`: a file that
    gets all of its stderr (torchrun's own lines, which no rank's log holds). Raises stopping.Interrupted, once it
    has exited, when a signal stopped it."""
    # stdin /dev/null: a worker that reads it (what export cannot see) gets end-of-file, never the terminal's or a
    # pipe's input, which no rank could answer and every rank would wait for.
    with stopping.child(command, env=env, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE) as (process, stop), \
            _opened(log_path) as log:
        tail, console = [], console_noise.Filtered(sys.stderr)
        copier = threading.Thread(target=_copy, args=(process.stderr.fileno(), tail, stop, console, log), daemon=True)
        copier.start()
        status = process.wait()
        copier.join(DRAIN_S)
        if stop.signum is None:
            console.close()
        elif console.mid_line:
            sys.stderr.write("\n")  # the one line saying why it stopped starts a line of its own
    return status, "".join(tail)[-KEEP_CHARS:]  # one chunk can hold more than KEEP_CHARS


@contextlib.contextmanager
def _opened(path):
    if path is None:
        yield None
        return
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", encoding="utf-8") as log:
        yield log


def _copy(descriptor, tail, stop, console, log):
    """Echo every chunk to the `console` as it arrives (progress bars end without a newline) until a signal `stop`s
    the job, write it to `log` (None: no log), keep the end."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    kept = 0
    while True:
        try:
            chunk = os.read(descriptor, 1 << 16)
        except OSError:  # closed by `run` once torchrun exited and DRAIN_S passed
            return
        if not chunk:
            return
        text = decoder.decode(chunk)
        if stop.signum is None and text:
            console.write(text)
            console.flush()
        if log is not None:
            log.write(text)
            log.flush()
        tail.append(text)
        kept += len(text)
        while kept - len(tail[0]) >= KEEP_CHARS:
            kept -= len(tail.pop(0))
