"""SIGINT and SIGTERM end the whole job: `pipeline.py launch` and `run` stop torchrun, every worker, papermill and
its kernel within seconds, print one line (where to resume), and exit 130 or 143.

The fixture trains_until_stopped.py writes each process's pid and parent pid into <output_dir>/pids/, so the tests
see that no process of the job outlives the command. A terminal's Ctrl-C reaches the command's whole process group
(here killpg, three times, as an impatient user does); a supervisor (`timeout`, docker stop, systemd) signals its
pid alone.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nbddp.formats import checkpoint_markers
from nbddp.orchestration import stopping

from .conftest import REPO

EXIT_BOUND_S = 20  # from the signal to the command's exit
START_BOUND_S = 120  # torchrun, gloo and torch in two processes on a busy 2-core machine


def start(arguments, cwd, log):
    return subprocess.Popen([sys.executable, *arguments], cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"},
                            start_new_session=True)  # a process group of its own, as a terminal gives a command


def wait_for(condition, process, what):
    deadline = time.monotonic() + START_BOUND_S
    while time.monotonic() < deadline:
        if condition():
            return
        if process.poll() is not None:
            break
        time.sleep(0.1)
    process.kill()
    pytest.fail(f"never saw {what} (exit status {process.poll()})")


def job_pids(pid_dir):
    """Every process that wrote a pid file, and its parent (torchrun, or papermill)."""
    return {int(pid) for path in Path(pid_dir).glob("*.pid") for pid in path.read_text().split()}


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie has exited: only its parent has not reaped it yet
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def stopped(process, log, pid_dir):
    """Wait for the command to exit; its status and output; asserts no process of the job is left."""
    try:
        status = process.wait(timeout=EXIT_BOUND_S)
    except subprocess.TimeoutExpired:
        process.kill()
        status = None
    output = Path(log.name).read_text()
    survivors = {pid for pid in job_pids(pid_dir) if alive(pid)}
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    assert status is not None, f"still running {EXIT_BOUND_S} s after the signal:\n{output[-3000:]}"
    assert survivors == set(), output[-3000:]
    return status, output


@pytest.mark.e2e
@pytest.mark.parametrize("sender, signum, status", [
    ("terminal", signal.SIGINT, 130),  # Ctrl-C, three times
    ("supervisor", signal.SIGTERM, 143),  # docker stop, systemd, a CI cancel
])
def test_a_signal_stops_torchrun_and_every_worker_and_says_where_to_resume(workdir, sender, signum, status):
    output_dir = workdir / "outputs"
    with open(workdir / "launch.log", "w") as log:
        launched = start([str(REPO / "pipeline.py"), "launch", "--nproc-per-node", "2", "--script",
                          "trains_until_stopped.py", "--", "--output_dir", str(output_dir)], workdir, log)
        wait_for(lambda: len(job_pids(output_dir / "pids")) == 3 and checkpoint_markers.latest_complete(output_dir),
                 launched, "two workers and a complete checkpoint")
        if sender == "terminal":
            for _ in range(3):
                os.killpg(launched.pid, signum)
                time.sleep(0.3)
        else:
            os.kill(launched.pid, signum)
        exit_status, output = stopped(launched, log, output_dir / "pids")
    assert exit_status == status, output[-3000:]
    assert "Traceback" not in output
    last = output.splitlines()[-1]
    complete = checkpoint_markers.latest_complete(output_dir)
    assert last == (f"error: stopped by {signal.Signals(signum).name}; torchrun and its workers have exited; last "
                    f"complete checkpoint: {complete.path} (step {complete.step}); rerun with --resume true to "
                    "continue from it")


@pytest.mark.e2e
def test_a_signal_during_the_smoke_run_stops_papermill_and_its_kernel_and_never_launches(workdir):
    # `run` as pipeline.py runs it; the fixture has no notebooks to be fresh against (see test_run.py).
    command = ("import sys; from nbddp.orchestration import run; run.check_export_fresh = lambda script: None; "
               "from nbddp.cli import main; sys.exit(main(sys.argv[1:]))")
    with open(workdir / "run.log", "w") as log:
        running = start(["-c", command, "run", "--script", "trains_until_stopped.py", "--device", "cpu",
                         "--nproc-per-node", "2", "-p", "step_s", "30"], workdir, log)  # 3 smoke steps: 90 s
        wait_for(lambda: list(workdir.glob("runs/*-run/smoke/pids/0.pid")), running, "the smoke run's kernel")
        os.kill(running.pid, signal.SIGINT)  # `timeout -s INT`, say
        smoke_dir = next(workdir.glob("runs/*-run/smoke"))
        exit_status, output = stopped(running, log, smoke_dir / "pids")
    assert exit_status == 130, output[-3000:]
    assert output.splitlines()[-1] == (f"error: stopped by SIGINT; papermill and its kernel have exited; the notebook "
                                       f"run wrote into {smoke_dir.relative_to(workdir)}")
    assert "launch:" not in output and "Traceback" not in output


@pytest.mark.e2e
@pytest.mark.parametrize("how", ["SIGTERM from outside", "early exit"])
def test_the_rank_that_stopped_first_is_named(workdir, how):
    output_dir = workdir / "outputs"
    flags = ["--end_rank", "1", "--end_step", "10"] if how == "early exit" else []
    with open(workdir / "launch.log", "w") as log:
        launched = start([str(REPO / "pipeline.py"), "launch", "--nproc-per-node", "2", "--script",
                          "trains_until_stopped.py", "--", "--output_dir", str(output_dir), *flags], workdir, log)
        wait_for(lambda: len(job_pids(output_dir / "pids")) == 3 and checkpoint_markers.latest_complete(output_dir),
                 launched, "two workers and a complete checkpoint")
        rank_1 = int((output_dir / "pids" / "1.pid").read_text().split()[0])
        if how != "early exit":
            os.kill(rank_1, signal.SIGTERM)  # `kill`, a scheduler's time limit, a preemption
        exit_status, output = stopped(launched, log, output_dir / "pids")
    report = output[output.rindex("nbddp: training failed"):].splitlines()
    assert exit_status == 1 and report[0] == "nbddp: training failed (torchrun exit status 1)", output[-3000:]
    assert report[1] == ("  rank 1 ended early: exited with status 0 while the other ranks still ran (its script "
                         "ended early)" if how == "early exit" else
                         "  rank 1 failed: killed by SIGTERM from outside torchrun (kill, a scheduler's time limit or "
                         f"preemption; pid {rank_1})")
    assert report[2].startswith("  rank 0 ")
    assert report[-1].startswith(f"  last complete checkpoint: {output_dir}/checkpoint-")


def test_a_signal_between_children_ends_the_command_with_one_line(workdir):
    # `run`'s export check takes seconds (libcst): a Ctrl-C then, while no child runs
    command = ("import sys, time; from nbddp.orchestration import run; "
               "run.check_export_fresh = lambda script: (open('checking', 'w').close(), time.sleep(60)); "
               "from nbddp.cli import main; sys.exit(main(sys.argv[1:]))")
    with open(workdir / "run.log", "w") as log:
        running = start(["-c", command, "run", "--script", "trains_until_stopped.py"], workdir, log)
        wait_for(lambda: (workdir / "checking").exists(), running, "the export check")
        os.killpg(running.pid, signal.SIGINT)
        status = running.wait(timeout=EXIT_BOUND_S)
    assert (status, (workdir / "run.log").read_text()) == (130, "error: stopped by SIGINT\n")


@pytest.fixture
def own_handlers():
    """This process's signal handlers, put back afterwards (once stopped, `stopping` ignores the signals)."""
    saved = {signum: signal.getsignal(signum) for signum in stopping.SIGNALS}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def test_the_first_signal_counts_and_a_child_that_outlives_the_grace_is_killed(monkeypatch, own_handlers):
    monkeypatch.setattr(stopping, "STOP_GRACE_S", 1)
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True); time.sleep(60)"
    with pytest.raises(stopping.Interrupted) as stopped:
        with stopping.child([sys.executable, "-c", code], stdout=subprocess.PIPE) as (process, stop):
            process.stdout.readline()  # it ignores SIGTERM from now on
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGTERM)  # changes nothing
            status = process.wait(timeout=30)
    assert status == -signal.SIGKILL
    assert (stopped.value.exit_status, str(stopped.value)) == (130, "stopped by SIGINT")
    assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN  # the job is ending: a third Ctrl-C changes nothing too
