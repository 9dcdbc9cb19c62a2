"""What of the children's stderr the console shows: nbddp's lines and what went wrong, not other libraries' noise.

A default run's workers print about fifty stderr lines that are not nbddp's: the progress bars of datasets' `map`,
Transformers' weight loading and TRL's dataset preparation on every rank, tqdm's blank lines, torch's
`pin_memory` warnings; papermill adds its cell bar. They stay in the run's logs (each rank's files, torchrun's and
papermill's stderr logs); `Filtered` leaves them out of the console, a whole line at a time, unless -v. A traceback,
an error, nbddp's own warnings and anything else pass.
"""
import re

from nbddp import log

PREFIX = re.compile(r"^\[[A-Za-z_]*\d+\]:")  # torchrun's --tee prefix: [default0]:
BAR = re.compile(r"\d+%\||\[\d+:\d\d\S*, [^\]]*/s\]")  # tqdm: `Map:  50%|█████ | 1500/3000 [00:01<00:01, ...]`
WARNING = re.compile(r"^\S.*:\d+: \w*Warning: ")  # Python's warnings: `path.py:759: UserWarning: ...`
LAUNCHER = re.compile(r"^[WI]\d{4} \d\d:\d\d:\d\d")  # torch's glog-style warning and info lines: `W1207 00:02:07...`
MAX_LINE = 1 << 16  # a longer line without a newline is judged as it is (a progress bar that never ends one)


def noise(line: str) -> bool:
    """Whether `line` (one line, torchrun's prefix and all) is another library's progress, warning or blank line,
    or an nbddp line for the logs only (log.DETAIL_PREFIX)."""
    text = PREFIX.sub("", line).rstrip("\r\n")
    return (not text.strip() or "\r" in text or bool(BAR.search(text)) or bool(WARNING.match(text))
            or bool(LAUNCHER.match(text)) or text.startswith(log.DETAIL_PREFIX))


class Filtered:
    """A stream-like `write` and `flush` over `stream` that passes on whole lines, leaving out `noise` and the source
    line Python prints under a warning; `close` passes on an unterminated last line. With -v (log.verbose) it
    passes everything on as it comes. `mid_line`: what it passed on ends in the middle of a line."""

    def __init__(self, stream):
        self.stream = stream
        self.everything = log.verbose()
        self.pending = ""
        self.warned = set()  # the prefixes (ranks) whose last line was a warning: their next may be its source line
        self.mid_line = False

    def write(self, text):
        if self.everything:
            self._pass(text)
            return
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        if len(self.pending) > MAX_LINE:
            lines.append(self.pending)
            self.pending = ""
        for line in lines:
            self._line(line + "\n")

    def flush(self):
        self.stream.flush()

    def close(self):
        if self.pending:
            self._line(self.pending)
            self.pending = ""
        self.stream.flush()

    def _line(self, line):
        prefix = PREFIX.match(line)
        prefix = prefix.group() if prefix else ""
        text = line[len(prefix):]
        under_warning = prefix in self.warned and text.startswith("  ")  # `  super().__init__(loader)`
        (self.warned.add if WARNING.match(text) else self.warned.discard)(prefix)
        if not (under_warning or noise(line)):
            self._pass(line)

    def _pass(self, text):
        if text:
            self.stream.write(text)
            self.mid_line = not text.endswith("\n")
