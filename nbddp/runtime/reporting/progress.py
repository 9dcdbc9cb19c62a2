"""`TrainingProgress`: rank 0's one view of training, in place of Transformers' ProgressCallback and PrinterCallback.

On a terminal it is Transformers' tqdm bar, updated in place, with the last loss and tokens/s on it; elsewhere
(torchrun's pipes, CI, a log file), where every refresh of a bar would be a line, it is a line at the first step
and at every 10% of the steps, and the held-out loss when it is measured:

    nbddp: step 30/300 (10%): loss 2.3100, 8,291 tokens/s, ETA 35 s
    nbddp: step 100/300: held-out loss 2.4449

Either way only while training, and never Transformers' dict of every logged step. In a smoke run's Jupyter kernel
the notebook keeps Transformers' own display, and the lines go to the run setting `progress_file`, which `pipeline.py
smoke` echoes to its console (`nbddp.orchestration.smoke.papermill_stderr`). The level of the `nbddp` logger
(`nbddp.log`, the run setting `log_level`) rules: WARNING (`-q`) shows nothing, DEBUG (`-v`) a line for every logged
step. Other ranks show nothing. tokens/s is MetricsCallback's, which adds it to the logs (`metrics`).
"""
import logging
import os
import sys
import time

from transformers import ProgressCallback
from transformers import trainer as transformers_trainer

from nbddp import log, patches

PATCH = "progress-and-metrics-callbacks"
LINES = 10  # away from a terminal: a line at every tenth of max_steps


class TrainingProgress(ProgressCallback):
    def __init__(self):
        super().__init__()
        self.file = os.environ.get(log.PROGRESS_FILE_ENV)  # a smoke run's kernel: lines into this file
        self.shown = False  # this process shows progress: rank 0, at INFO or DEBUG
        self.in_place = False  # as Transformers' bar (a terminal) rather than lines
        self.started = self.first_step = self.last_line_step = 0
        self.latest = {}  # the last training log: loss, tokens_per_s

    def on_train_begin(self, args, state, control, **kwargs):
        self.shown = state.is_world_process_zero and not log.quiet()
        self.in_place = self.shown and self.file is None and not args.disable_tqdm and sys.stderr.isatty()
        self.started, self.first_step, self.last_line_step = time.monotonic(), state.global_step, state.global_step
        self.latest = {}
        if self.in_place:
            super().on_train_begin(args, state, control, **kwargs)

    def on_step_end(self, args, state, control, **kwargs):
        if self.in_place:
            super().on_step_end(args, state, control, **kwargs)
        elif self.shown and not control.should_log:  # a step that logs is shown once its loss is known, in on_log
            self._maybe_line(state)

    def on_prediction_step(self, args, state, control, eval_dataloader=None, **kwargs):
        if self.in_place:
            super().on_prediction_step(args, state, control, eval_dataloader=eval_dataloader, **kwargs)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not self.shown or not logs:
            return
        if "loss" in logs:
            self.latest = logs
            if self.in_place and self.training_bar is not None:
                self.training_bar.set_postfix_str(self._figures(), refresh=False)
            else:
                self._maybe_line(state)
        elif "eval_loss" in logs:
            self._say(f"step {state.global_step}/{state.max_steps}: held-out loss {logs['eval_loss']:.4f}")

    def on_train_end(self, args, state, control, **kwargs):
        if self.in_place and self.training_bar is not None:
            super().on_train_end(args, state, control, **kwargs)
        self.shown = False  # a trainer.evaluate() of the notebook's own, afterwards, says what it wants to

    def _maybe_line(self, state):
        step, total = state.global_step, max(state.max_steps, 1)
        tenth_passed = step * LINES // total > self.last_line_step * LINES // total
        due = step == self.first_step + 1 or step >= total or tenth_passed
        if not (due or log.logger.isEnabledFor(logging.DEBUG)) or step == self.last_line_step:
            return
        self.last_line_step = step
        done = step - self.first_step
        eta = (time.monotonic() - self.started) / done * (total - step) if done > 0 else None
        figures = ", ".join(filter(None, [self._figures(), f"ETA {_duration(eta)}" if eta is not None else ""]))
        self._say(f"step {step}/{total} ({100 * step // total}%)" + (f": {figures}" if figures else ""))

    def _figures(self) -> str:
        figures = []
        if isinstance(self.latest.get("loss"), (int, float)):
            figures.append(f"loss {self.latest['loss']:.4f}")
        if isinstance(self.latest.get("tokens_per_s"), (int, float)):
            figures.append(f"{self.latest['tokens_per_s']:,.0f} tokens/s")
        return ", ".join(figures)

    def _say(self, text):
        line = f"nbddp: {text}"
        if self.in_place and self.training_bar is not None:
            self.training_bar.write(line)
        elif self.file is not None:
            with open(self.file, "a", encoding="utf-8") as file:
                file.write(line + "\n")
        else:
            log.logger.info(line)


def register() -> None:
    """Give every Trainer built from now on a `TrainingProgress`: in place of Transformers' ProgressCallback and of
    the PrinterCallback it takes with `disable_tqdm`; in a Jupyter kernel, beside Transformers' notebook display and
    only for a smoke run (the run setting `progress_file`). Registering twice is once."""
    if transformers_trainer.DEFAULT_PROGRESS_CALLBACK is TrainingProgress:
        return
    if transformers_trainer.DEFAULT_PROGRESS_CALLBACK is ProgressCallback:
        for name in ("DEFAULT_PROGRESS_CALLBACK", "PrinterCallback"):
            patches.set_attribute(PATCH, transformers_trainer, name, TrainingProgress)
    elif os.environ.get(log.PROGRESS_FILE_ENV):
        patches.append(PATCH, transformers_trainer.DEFAULT_CALLBACKS, TrainingProgress)


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds // 60 % 60:02d} min"
