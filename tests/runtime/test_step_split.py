import torch

from nbddp.formats.metrics import STEP_PHASES
from nbddp.runtime.reporting import step_split
from nbddp.runtime.reporting.step_split import StepSplit

STEP = ["step_begin", "pre_optimizer", "step_end"]


def host_clock(monkeypatch, times):
    clock = iter(times)
    monkeypatch.setattr(step_split.time, "perf_counter", lambda: next(clock))


def test_on_a_cpu_the_host_clock_splits_each_step_into_its_phases(monkeypatch):
    # train begin at 0; step 1: batches until 1, forward and backward until 5, optimizer until 6; step 2 likewise
    host_clock(monkeypatch, [0.0, 1.0, 5.0, 6.0, 6.5, 9.5, 10.0])
    split = StepSplit(torch.device("cpu"))
    for boundary in ["step_end", *STEP, *STEP]:
        split.mark(boundary)
    assert split.take() == {"steps": 2, "between_steps_s": 1.5, "forward_backward_s": 7.0, "optimizer_s": 1.5}
    assert split.take() is None  # nothing finished since


def test_each_take_covers_the_steps_since_the_last(monkeypatch):
    host_clock(monkeypatch, [0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 9.0])
    split = StepSplit(torch.device("cpu"))
    for boundary in ["step_end", *STEP]:
        split.mark(boundary)
    first = split.take()
    for boundary in STEP:
        split.mark(boundary)
    assert first == {"steps": 1, "between_steps_s": 1.0, "forward_backward_s": 1.0, "optimizer_s": 1.0}
    assert split.take() == {"steps": 1, "between_steps_s": 1.0, "forward_backward_s": 2.0, "optimizer_s": 3.0}


def test_a_loop_without_a_pre_optimizer_callback_gets_no_split_rather_than_a_wrong_one(monkeypatch):
    host_clock(monkeypatch, [0.0, 1.0, 2.0, 3.0, 4.0])
    split = StepSplit(torch.device("cpu"))
    for boundary in ["step_end", "step_begin", "step_end", "step_begin", "step_end"]:
        split.mark(boundary)
    assert split.take() is None
    split.mark("step_begin")  # marks no longer count
    assert split.take() is None and not split.enabled


def test_a_device_whose_host_clock_runs_ahead_gets_no_split():
    split = StepSplit(torch.device("meta"))
    for boundary in ["step_end", *STEP]:
        split.mark(boundary)
    assert split.take() is None


class FakeEvent:
    """A CUDA event on a GPU timeline that the test moves on by hand."""
    timeline = []  # the device times at which the recorded events complete, in order
    now = 0.0  # how far the GPU has got

    def __init__(self):
        self.at = FakeEvent.timeline.pop(0)  # recorded at creation

    def query(self):
        return self.at <= FakeEvent.now

    def elapsed_time(self, end):
        assert self.query() and end.query()  # torch raises for an event not yet reached
        return (end.at - self.at) * 1e3


def test_on_a_gpu_it_reads_the_gpu_timeline_and_leaves_what_the_gpu_has_not_reached(monkeypatch):
    split = StepSplit(torch.device("cuda"))
    monkeypatch.setattr(split, "_event", FakeEvent)
    FakeEvent.timeline, FakeEvent.now = [0.0, 0.5, 3.0, 3.25, 3.5, 6.5, 7.0], 0.0  # the GPU has not started
    for boundary in ["step_end", *STEP, *STEP]:
        split.mark(boundary)
    FakeEvent.now = 4.0  # the host queued step 2; the GPU is in its forward: step 2 waits for the next take
    assert split.take() == {"steps": 1, "between_steps_s": 0.5, "forward_backward_s": 2.5, "optimizer_s": 0.25}
    assert split.take() is None
    FakeEvent.now = 7.0
    assert split.take() == {"steps": 1, "between_steps_s": 0.25, "forward_backward_s": 3.0, "optimizer_s": 0.5}


def test_a_run_that_never_logs_keeps_a_few_marks_not_one_per_step(monkeypatch):
    host_clock(monkeypatch, [float(t) for t in range(1 + 3 * 1000)])
    split = StepSplit(torch.device("cpu"))
    split.mark("step_end")
    for _ in range(1000):
        for boundary in STEP:
            split.mark(boundary)
        assert len(split._marks) <= 3
    assert split.take() == {"steps": 1000, "between_steps_s": 1000.0, "forward_backward_s": 1000.0,
                            "optimizer_s": 1000.0}


def test_the_phases_between_the_callbacks():
    assert step_split.PHASES == {("step_end", "step_begin"): "between_steps",
                                 ("step_begin", "pre_optimizer"): "forward_backward",
                                 ("pre_optimizer", "step_end"): "optimizer"}
    assert sorted(step_split.PHASES.values()) == sorted(STEP_PHASES)

