"""One of two ranks killed with SIGKILL mid-run, as the out-of-memory killer does: the job ends within seconds and
`pipeline.py launch` names the rank, the last logged step and the last complete checkpoint; `--resume true`
continues from that checkpoint with the losses of a run that was never interrupted; with `--max-restarts 1`
torchrun restarts the workers and they resume by themselves.

The kill comes from outside, like the kernel's: a watcher reads metrics.jsonl and kills the process whose
environment says RANK=1, so nothing in the script knows about the test. Runs the example notebooks, exported
afresh, on CPU (gloo, hf backend), from the repository root (their data paths are relative to it).
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from nbddp.formats import checkpoint_markers
from nbddp.export import export
from nbddp.formats.metrics import last_step

REPO = Path(__file__).parents[2]
FLAGS = ["--backend", "hf", "--max_steps", "16", "--save_steps", "4", "--warmup_steps", "2", "--eval_steps", "1000"]
KILL_AFTER_STEP = 6  # checkpoint-4 is complete by then; checkpoint-8 may be half-written when the kill lands
EXIT_BOUND_S = 60

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def script(tmp_path_factory):
    out = tmp_path_factory.mktemp("generated")
    export(REPO / "notebooks", out)
    return out / "train.py"


@pytest.fixture(scope="module")
def uninterrupted(script, tmp_path_factory):
    """The per-step losses of the run the interrupted ones must reproduce."""
    output_dir = tmp_path_factory.mktemp("uninterrupted")
    result = subprocess.run(launch_command(script, output_dir), cwd=REPO, env=environment(), capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return losses(output_dir)


def launch_command(script, output_dir, *options, script_flags=()):
    return [sys.executable, "pipeline.py", "launch", "--nproc-per-node", "2", "--script", str(script), *options,
            "--", *FLAGS, "--output_dir", str(output_dir), *script_flags]


def environment():
    return {**os.environ, "OMP_NUM_THREADS": "1"}  # two ranks on a shared 2-core machine


def losses(output_dir):
    records = [json.loads(line) for line in (Path(output_dir) / "metrics.jsonl").read_text().splitlines()]
    return {record["step"]: record["loss"] for record in records if "event" not in record}


def pid_of_rank(script, rank):
    """The worker of `script` whose environment says RANK=<rank>, or None."""
    for proc in Path("/proc").iterdir():
        try:
            if str(script) in (proc / "cmdline").read_bytes().decode(errors="replace") and \
                    f"RANK={rank}".encode() in (proc / "environ").read_bytes().split(b"\0"):
                return int(proc.name)
        except (FileNotFoundError, ProcessLookupError, PermissionError, NotADirectoryError):  # gone, or not ours
            continue
    return None


def kill_rank_during(process, script, output_dir, rank=1):
    """Wait until metrics.jsonl shows KILL_AFTER_STEP, then SIGKILL the rank; returns the time of the kill."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None:
        if (last_step(output_dir / "metrics.jsonl") or 0) >= KILL_AFTER_STEP:  # read while rank 0 writes it
            pid = pid_of_rank(script, rank)
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                return time.monotonic()
        time.sleep(0.02)
    pytest.fail(f"training never reached step {KILL_AFTER_STEP} (exit status {process.poll()})")


def assert_same_losses(resumed, uninterrupted, after_step):
    steps = [step for step in uninterrupted if step > after_step]
    assert steps and all(step in resumed for step in steps)
    difference = max(abs(resumed[step] - uninterrupted[step]) for step in steps)
    print(f"steps {steps[0]}..{steps[-1]} after checkpoint-{after_step}: largest loss difference {difference:.3g}")
    torch.testing.assert_close([resumed[step] for step in steps], [uninterrupted[step] for step in steps],
                               rtol=1e-4, atol=1e-5)


def test_a_killed_rank_ends_the_job_and_resume_continues_where_it_stopped(script, uninterrupted, tmp_path):
    output_dir, log = tmp_path / "outputs", tmp_path / "killed.log"
    with open(log, "w") as output:
        killed = subprocess.Popen(launch_command(script, output_dir), cwd=REPO, env=environment(), stdout=output,
                                  stderr=subprocess.STDOUT)
        killed_at = kill_rank_during(killed, script, output_dir)
        status = killed.wait(timeout=EXIT_BOUND_S + 60)
    exit_s = time.monotonic() - killed_at
    report = log.read_text()
    print(f"exit {exit_s:.1f} s after the kill\n" + report[report.rindex("nbddp: training failed"):])
    assert status != 0
    assert exit_s < EXIT_BOUND_S
    assert "  rank 1 failed: killed by SIGKILL" in report
    complete = checkpoint_markers.latest_complete(output_dir)
    assert complete is not None and complete.step >= 4
    assert f"  last complete checkpoint: {complete.path} (step {complete.step}); rerun with --resume true" in report
    assert f"  last logged step: {max(losses(output_dir))} " in report

    resumed = subprocess.run(launch_command(script, output_dir, script_flags=["--resume", "true"]), cwd=REPO,
                             env=environment(), capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"nbddp: --resume: resuming from {complete.path} (step {complete.step})" in resumed.stdout
    assert checkpoint_markers.incomplete_dirs(output_dir) == []  # none left half-written
    assert [c.step for c in checkpoint_markers.complete_checkpoints(output_dir)] == [12, 16]  # save_total_limit 2
    assert_same_losses(losses(output_dir), uninterrupted, after_step=complete.step)


def test_torchrun_restarts_the_workers_and_they_resume_by_themselves(script, uninterrupted, tmp_path):
    output_dir, log = tmp_path / "outputs", tmp_path / "restarted.log"
    with open(log, "w") as output:
        restarted = subprocess.Popen(launch_command(script, output_dir, "--max-restarts", "1"), cwd=REPO,
                                     env=environment(), stdout=output, stderr=subprocess.STDOUT)
        kill_rank_during(restarted, script, output_dir)
        status = restarted.wait(timeout=600)
    text = log.read_text()
    assert status == 0, text[-3000:]
    assert "nbddp: torchrun restart 1: resuming from " in text
    resumed_from = int(text.split("nbddp: torchrun restart 1: resuming from ")[1].split("(step ")[1].split(")")[0])
    assert_same_losses(losses(output_dir), uninterrupted, after_step=resumed_from)
