"""Run torchrun with its stderr passed through to ours as it comes, keeping the end of it.

torchrun's agent prints its failure summary (which rank failed, its exit code or signal, its error file) on
stderr and nowhere else; `failure_report` reads it from the kept end. The workers inherit the same stderr, so
the end holds their last lines too; it is bounded, because training can print for days. Their stdin is
/dev/null. A SIGINT or SIGTERM stops torchrun and its workers (`stopping`); the console then no longer echoes
their shutdown.
"""

import codecs
import os
import subprocess
import sys
import threading

from nbddp.orchestration import stopping

KEEP_CHARS = 1 << 20  # torchrun's summary is a few KiB; a worker's traceback rarely more
DRAIN_S = 10  # after torchrun exits: a worker it orphaned may hold the pipe open, so stop waiting for EOF then


def run(command, env):
    """Run `command`; returns (exit status, the last KEEP_CHARS characters of its stderr). Raises
    stopping.Interrupted, once it has exited, when a signal stopped it."""
    # stdin /dev/null: a worker that reads it (what export cannot see) gets end-of-file, never the terminal's or a
    # pipe's input, which no rank could answer and every rank would wait for.
    with stopping.child(command, env=env, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE) as (process, stop):
        tail, echoed = [], ["\n"]
        copier = threading.Thread(target=_copy, args=(process.stderr.fileno(), tail, stop, echoed), daemon=True)
        copier.start()
        status = process.wait()
        copier.join(DRAIN_S)
        if stop.signum is not None and not echoed[0].endswith("\n"):
            sys.stderr.write("\n")  # the one line saying why it stopped starts a line of its own
    return status, "".join(tail)[-KEEP_CHARS:]  # one chunk can hold more than KEEP_CHARS


def _copy(descriptor, tail, stop, echoed):
    """Echo every chunk to our stderr as it arrives (progress bars end without a newline) until a signal `stop`s
    the job, keep the end; `echoed[0]`: the last chunk echoed."""
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
            sys.stderr.write(text)
            sys.stderr.flush()
            echoed[0] = text
        tail.append(text)
        kept += len(text)
        while kept - len(tail[0]) >= KEEP_CHARS:
            kept -= len(tail.pop(0))
