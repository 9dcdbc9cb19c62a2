"""Run torchrun with its stderr passed through to ours as it comes, keeping the end of it.

torchrun's agent prints its failure summary (which rank failed, its exit code or signal, its error file) on
stderr and nowhere else; `failure_report` reads it from the kept end. The workers inherit the same stderr, so
the end holds their last lines too; it is bounded, because training can print for days.
"""

import codecs
import os
import subprocess
import sys
import threading

KEEP_CHARS = 1 << 20  # torchrun's summary is a few KiB; a worker's traceback rarely more
DRAIN_S = 10  # after torchrun exits: a worker it orphaned may hold the pipe open, so stop waiting for EOF then


def run(command, env):
    """Run `command`; returns (exit status, the last KEEP_CHARS characters of its stderr)."""
    with subprocess.Popen(command, env=env, stderr=subprocess.PIPE) as process:
        tail = []
        copier = threading.Thread(target=_copy, args=(process.stderr.fileno(), tail), daemon=True)
        copier.start()
        try:
            status = process.wait()
        except KeyboardInterrupt:
            # The terminal sent SIGINT to torchrun too; let it stop its workers before we exit.
            status = process.wait()
        copier.join(DRAIN_S)
    return status, "".join(tail)[-KEEP_CHARS:]  # one chunk can hold more than KEEP_CHARS


def _copy(descriptor, tail):
    """Echo every chunk to our stderr as it arrives (progress bars end without a newline), keep the end."""
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
        sys.stderr.write(text)
        sys.stderr.flush()
        tail.append(text)
        kept += len(text)
        while kept - len(tail[0]) >= KEEP_CHARS:
            kept -= len(tail.pop(0))
