"""nbddp's own console messages: the `nbddp` logger, the same in `pipeline.py` and in the processes it starts.

A message is the whole line ("smoke: ...", "launch: ...", the runtime's "nbddp: ..."): info and debug lines go to
stdout, warnings and errors to stderr, whichever streams are current when it is written (pytest's capture, a
Jupyter kernel's). `pipeline.py -q` sets the level to WARNING, `-v` to DEBUG; the smoke run's kernel and torchrun's
workers get it as NBDDP_LOG_LEVEL (`environment`), which this module reads when it is imported.
"""
import logging
import os
import sys

LEVEL_ENV = "NBDDP_LOG_LEVEL"  # DEBUG, INFO (the default), WARNING or ERROR
# Where a smoke run's kernel writes its training progress lines, which the parent echoes (papermill_stderr).
PROGRESS_FILE_ENV = "NBDDP_PROGRESS_FILE"
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


def set_level(level: int) -> None:
    logger.setLevel(level)


def quiet() -> bool:
    """Info lines are off (`-q`)."""
    return not logger.isEnabledFor(logging.INFO)


def environment() -> dict:
    """For a child process: NBDDP_LOG_LEVEL, this process's level; when quiet, no Hugging Face progress bars either
    (Transformers' "Loading weights", datasets' "Map")."""
    quiet_bars = {"HF_HUB_DISABLE_PROGRESS_BARS": "1"} if quiet() else {}
    return {LEVEL_ENV: logging.getLevelName(logger.getEffectiveLevel())} | quiet_bars


logger.addHandler(_Console())
logger.propagate = False
set_level(LEVELS.get(os.environ.get(LEVEL_ENV, "").upper(), logging.INFO))
