"""The one exception family nbddp raises for bad input; the CLI prints it and exits with its status. Also
`lost_peer`: whether a rank's error says that another rank's process ended, which the runtime's excepthook and the
failure report both ask."""

# What a collective raises when a peer's process ended: gloo's tcp transport (pair.cc) on EOF and ECONNRESET, and,
# in gloo's own messages only (a BrokenPipeError of a closed stdout is no lost peer), EPIPE on a blocking write
# and a socket closed before use.
_LOST_PEER = ("Connection closed by peer", "Connection reset by peer")
_LOST_PEER_IN_GLOO = ("Broken pipe", "Socket unexpectedly closed")


def lost_peer(message: str) -> bool:
    """Whether the error `message` is a collective's on finding its peer's process gone."""
    return any(words in message for words in _LOST_PEER) or (
        "pair.cc" in message and any(words in message for words in _LOST_PEER_IN_GLOO))


class NbddpError(Exception):
    """Root of nbddp's errors. `exit_status` is what `pipeline.py` exits with."""

    exit_status = 2


class UsageError(NbddpError):
    """A bad command-line flag or value; the message names the flag."""


class DataError(NbddpError):
    """Input data the notebooks cannot use; the message names the file (or dataset) and the row."""


class NotebookError(NbddpError):
    """Something wrong in a notebook, located by notebook path, 1-based cell and 1-based line."""

    def __init__(self, notebook, message, cell=None, line=None, hint=None):
        self.notebook = str(notebook)
        self.cell = cell
        self.line = line
        self.message = message
        self.hint = hint
        super().__init__(str(self))

    @property
    def location(self):
        parts = [self.notebook]
        if self.cell is not None:
            parts.append(f"cell {self.cell}")
        if self.line is not None:
            parts.append(f"line {self.line}")
        return ", ".join(parts)

    def __str__(self):
        text = f"{self.location}: {self.message}"
        return f"{text}\n  hint: {self.hint}" if self.hint else text


class TrainingError(NbddpError):
    """Training itself went wrong in a way nbddp can explain (a loss that is not finite): one paragraph naming the
    step and what to do, and exit status 1, as for a failed run rather than bad input."""

    exit_status = 1
