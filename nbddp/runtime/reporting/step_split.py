"""Where a training step's time goes, measured at the Trainer's callbacks around each optimizer step:

    between_steps     on_step_end of the step before (on_train_begin for the first) -> on_step_begin: the step
                      before's logging, saves and evaluation, and this step's batches fetched
    forward_backward  on_step_begin -> on_pre_optimizer_step: every micro batch's forward and backward, the
                      gradients' all-reduce and clipping
    optimizer         on_pre_optimizer_step -> on_step_end: the optimizer's update, the learning-rate schedule,
                      the gradients zeroed

On a GPU each mark is a CUDA event on the training device's current stream, and a step counts once the GPU has
passed its end (`query()`, never a wait): the split is the GPU's timeline, which is the wall time whether the host
or the GPU is the slower. On a CPU the host clock. On other devices nothing (their host clock runs ahead of the
work). Finished steps are added up as marks come, so a run that never logs keeps a few marks, not one per step;
`take()` hands over the steps finished since the last take, so a metrics record's split covers its own steps.
"""
import time

from nbddp.formats.metrics import STEP_PHASES

# (mark before, mark after) -> phase
PHASES = dict(zip([("step_end", "step_begin"), ("step_begin", "pre_optimizer"), ("pre_optimizer", "step_end")],
                  STEP_PHASES))


class StepSplit:
    def __init__(self, device):
        import torch

        def recorded_event():
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(device))
            return event

        self._event = recorded_event if device.type == "cuda" else None  # None: the host clock
        self.enabled = device.type in ("cuda", "cpu")
        self._marks = []  # (boundary, host time or recorded CUDA event), the first one already counted
        self._totals = self._empty()

    @staticmethod
    def _empty():
        return {"steps": 0, **{f"{phase}_s": 0.0 for phase in STEP_PHASES}}

    def mark(self, boundary: str) -> None:
        """Note that the step reached `boundary` ("step_end" also at train begin, "step_begin", "pre_optimizer")."""
        if not self.enabled:
            return
        self._marks.append((boundary, time.perf_counter() if self._event is None else self._event()))
        if boundary == "step_end":
            self._add_finished_steps()

    def take(self) -> dict | None:
        """Seconds per phase over the steps finished since the last take (on a GPU: whose end the GPU has reached),
        and `steps`, how many; None when none finished, or when the marks came in an order the phases do not name
        (a training loop without on_pre_optimizer_step: then no split is measured at all)."""
        self._add_finished_steps()
        if not self.enabled or not self._totals["steps"]:
            return None
        taken, self._totals = self._totals, self._empty()
        return taken

    def _add_finished_steps(self):
        done = len(self._marks)
        if self._event is not None:
            while done > 1 and not self._marks[done - 1][1].query():
                done -= 1
        while done > 1 and self._marks[done - 1][0] != "step_end":  # whole steps only
            done -= 1
        for (before, start), (after, end) in zip(self._marks[:done - 1], self._marks[1:done]):
            phase = PHASES.get((before, after))
            if phase is None:
                self.enabled, self._marks = False, []
                return
            self._totals[f"{phase}_s"] += end - start if self._event is None else start.elapsed_time(end) / 1e3
            self._totals["steps"] += phase == "optimizer"
        self._marks = self._marks[max(done - 1, 0):]
