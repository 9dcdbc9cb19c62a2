"""nbddp's own console messages: the `nbddp` logger, the same in `pipeline.py` and in the processes it starts.

A message is the whole line ("smoke: ...", "launch: ...", the runtime's "nbddp: ..."): info and debug lines go to
stdout, warnings and errors to stderr, whichever streams are current when it is written (pytest's capture, a
Jupyter kernel's). A `detail` line is for the run's logs: it goes to stderr, starting DETAIL_PREFIX, and
`pipeline.py`'s console leaves it out (orchestration.console_noise) unless -v, which prints it as a debug line. `pipeline.py -q` sets the level to WARNING, `-v` to DEBUG; the smoke run's kernel and torchrun's
workers get it as the run setting `log_level` (`environment`), which this module reads when it is imported.
"""
import logging
import os
import sys

from nbddp.formats.run_settings import ENV

LEVEL_ENV = ENV.LOG_LEVEL  # DEBUG, INFO (the default), WARNING or ERROR
# Where a smoke run's kernel writes its training progress lines, which the parent echoes (papermill_stderr).
PROGRESS_FILE_ENV = ENV.PROGRESS_FILE
DETAIL_PREFIX = "nbddp: details: "
LEVELS = {"DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARNING": logging.WARNING, "ERROR": logging.ERROR}

logger = logging.getLogger("nbddp")


class _Console(logging.Handler):
    def emit(self, record):
        stream = sys.stderr if record.levelno >= logging.WARNING else sys.stdout
        try:
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:  # logging's contract: report it, never raise into the caller
            self.handleError(record)


def info(message: str) -> None:
    """An info line (hidden by -q); the runtime's `nbddp: ...` lines use this and `warning`."""
    logger.info(message)


def warning(message: str) -> None:
    logger.warning(message)


def detail(message: str) -> None:
    """A line for the run's logs, not the console: `DETAIL_PREFIX` + `message`, on stdout as a debug line with -v,
    else on stderr (which the workers' log files keep and `pipeline.py` does not echo)."""
    text = DETAIL_PREFIX + message
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug(text)
        return
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def verbose() -> bool:
    """Debug lines are on (`-v`): the console shows everything, other libraries' progress bars included."""
    return logger.isEnabledFor(logging.DEBUG)


def set_level(level: int) -> None:
    logger.setLevel(level)


def quiet() -> bool:
    """Info lines are off (`-q`)."""
    return not logger.isEnabledFor(logging.INFO)


def environment() -> dict:
    """For a child process: the run setting `log_level`, this process's level; when quiet, no Hugging Face progress bars
    either (Transformers' "Loading weights", datasets' "Map")."""
    quiet_bars = {"HF_HUB_DISABLE_PROGRESS_BARS": "1"} if quiet() else {}
    return {LEVEL_ENV: logging.getLevelName(logger.getEffectiveLevel())} | quiet_bars


logger.addHandler(_Console())
logger.propagate = False
set_level(LEVELS.get(os.environ.get(LEVEL_ENV, "").upper(), logging.INFO))
