"""Run papermill with its stderr shown as it comes, up to its own traceback and without its cell progress bar
(console_noise; both with -v), and kept whole in a log file; and, on the same console, each line the kernel appends
to a progress file (its training progress, `nbddp.runtime.reporting.progress`) as it comes.

When a cell fails, papermill ends with a traceback of its own command line (click's frames), then
`PapermillExecutionError` and every frame of the cell's exception, often a hundred lines of library
internals, all before nbddp's report, which names the source notebook cell and line. The console gets
what comes before that traceback; the log file (named in the report) and the executed notebook keep it.
"""

import codecs
import subprocess
import sys
import threading

from nbddp.orchestration import console_noise, stopping

TRACEBACK_START = "Traceback (most recent call last):"


def run(command, env, log_path, progress_path=None) -> int:
    """Run `command`, echo its stderr up to the first traceback, write all of it to `log_path`; its exit status.
    `progress_path`: a file whose lines are echoed too, each on a line of its own, while `command` runs.
    A SIGINT or SIGTERM stops papermill and its kernel and raises stopping.Interrupted (the console echoes no more)."""
    with open(log_path, "w", encoding="utf-8") as log, \
            stopping.child(command, env=env, stderr=subprocess.PIPE) as (process, stop):
        shown = console_noise.Filtered(sys.stderr)
        console = _UntilTraceback(shown)
        done = threading.Event()
        follower = None if progress_path is None else threading.Thread(
            target=_follow, args=(progress_path, console, done), daemon=True)
        if follower is not None:
            follower.start()
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        for chunk in iter(lambda: process.stderr.read1(1 << 16), b""):
            text = decoder.decode(chunk)
            log.write(text)
            if stop.signum is not None:
                console.stop()
            console.write(text)
        done.set()
        if follower is not None:
            follower.join()
        if stop.signum is not None:
            console.stop()
        console.close()
        shown.close()
        return process.wait()


def _follow(path, console, done, poll_s=0.2):
    """Echo the complete lines appended to `path` until `done` is set, then those left."""
    offset, pending = 0, b""
    while True:
        finished = done.wait(poll_s)
        try:
            with open(path, "rb") as file:
                file.seek(offset)
                pending += file.read()
                offset = file.tell()
        except FileNotFoundError:  # nothing trained yet
            pass
        *lines, pending = pending.split(b"\n")
        for line in lines:
            console.line(line.decode("utf-8", errors="replace"))
        if finished:
            return


class _UntilTraceback:
    """Passes text on to `stream` until a line starts a traceback; holds back a tail that may be its beginning."""

    def __init__(self, stream):
        self.stream = stream
        self.pending = ""
        self.stopped = False
        self.mid_line = False  # what it passed on so far does not end with a newline
        self.lock = threading.Lock()  # `line` comes from another thread than `write`

    def stop(self):
        """Pass nothing more on (a signal is stopping the job), and end the line the stream is on."""
        with self.lock:
            if not self.stopped and self.mid_line:
                self._emit("\n")
            self.pending, self.stopped = "", True

    def line(self, text):
        """Pass on a whole line of another source, starting a new line when the stream is in the middle of one."""
        with self.lock:
            if not self.stopped:
                self._emit(("\n" if self.mid_line else "") + text + "\n")

    def write(self, text):
        with self.lock:
            self._write(text)

    def _write(self, text):
        if self.stopped:
            return
        self.pending += text
        start = self.pending.find(TRACEBACK_START)
        if start >= 0:
            self._emit(self.pending[:start])
            self.pending, self.stopped = "", True
            return
        held = _longest_prefix_suffix(self.pending, TRACEBACK_START)
        self._emit(self.pending[:len(self.pending) - held])
        self.pending = self.pending[len(self.pending) - held:]

    def close(self):
        if not self.stopped:
            self._emit(self.pending)
            self.pending = ""

    def _emit(self, text):
        if text:
            self.stream.write(text)
            self.stream.flush()
            self.mid_line = not text.endswith("\n")


def _longest_prefix_suffix(text, marker) -> int:
    """The length of the longest end of `text` that is a beginning of `marker` (0 when none)."""
    for length in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-length:]):
            return length
    return 0
