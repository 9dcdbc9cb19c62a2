"""What the whole suite shares: the tier and the number of xdist workers a command line gets, and the reference
DDP runs (tests/fixtures/e2e/reference_runs.py) that the default tier's end-to-end tests read. The runs take about a
minute of CPU, so they start in the background as soon as the first test of a session that selected such a test
begins, and overlap with the rest of the suite; the tests wait for them. Under pytest-xdist every worker shares one
set (the first worker to ask starts it)."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

# One thread a process: xdist's workers share the cores, and each test's children (papermill kernels, torchrun's
# ranks) run beside the other worker's, so a thread a core in every process oversubscribes them (PyTorch's CPU
# threads then wait on each other). Measured on 2 cores: 17 e2e tests, 128 s with PyTorch's default, 80 s with this
# (tests/TIMINGS.md). torchrun sets the same for its ranks when it starts more than one; a value set already wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")

def names_single_tests(config):
    """The command line names tests (`path::name`), not files, folders or the whole suite."""
    return bool(config.args) and all("::" in arg for arg in config.args)


def pytest_configure(config):
    """A test named on the command line runs whatever its tier: pyproject.toml's `-m "not e2e"` picks the default
    tier of the whole suite, a file or a folder."""
    if names_single_tests(config) and config.option.markexpr == "not e2e":
        config.option.markexpr = ""


def pytest_xdist_auto_num_workers(config):
    """Workers for `-n auto` (pyproject.toml's addopts): none for tests named on the command line, whose run the
    workers' start-up (seconds) would only slow; otherwise xdist's own count, a worker per core."""
    return 0 if names_single_tests(config) else None


def pytest_collection_modifyitems(items):
    """The slowest first, so that xdist's workers finish together rather than one waiting on a long test at the end:
    e2e tests, then the rest, then those reading the reference runs, which have run in the background meanwhile.
    (A stable sort: each group keeps pytest's order.)"""
    def group(item):
        if item.get_closest_marker("e2e"):
            return 0
        return 2 if "ddp_reference_runs" in getattr(item, "fixturenames", ()) else 1

    items.sort(key=group)


REFERENCE_RUNS = Path(__file__).parent / "fixtures" / "e2e" / "reference_runs.py"
REFERENCE_RUNS_BOUND_S = 1200  # export and two short trainings, on a 2-core machine shared with other work


def reference_runs_dir(tmp_path_factory):
    """A folder every worker of this session sees: the session's base temporary folder (xdist: the folder above
    the workers' own)."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "ddp-reference-runs"


@pytest.fixture(scope="session", autouse=True)
def start_reference_runs(request, tmp_path_factory):
    """Start the reference runs once per session, if a selected test reads them."""
    if not any("ddp_reference_runs" in getattr(item, "fixturenames", ()) for item in request.session.items):
        return
    out = reference_runs_dir(tmp_path_factory)
    try:
        out.mkdir()  # atomic: the first worker to get here starts them
    except FileExistsError:
        return
    # The run that outlives them all: xdist's controller (the workers' parent), or this process.
    session_pid = os.getppid() if os.environ.get("PYTEST_XDIST_WORKER") else os.getpid()
    with open(out / "driver.log", "w") as log:
        driver = subprocess.Popen([sys.executable, str(REFERENCE_RUNS), str(out), str(session_pid)], stdout=log,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    (out / "driver.pid").write_text(str(driver.pid))


def running(pid):
    """The process exists and has not exited (a zombie, not yet reaped by its parent, has)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture(scope="session")
def ddp_reference_runs(tmp_path_factory):
    """The reference runs' folder once they have finished: results.json ({step: {returncode, stdout, stderr}}),
    generated/, one/, two/, saves.log, trained_logits.pt. Fails if a step failed."""
    out = reference_runs_dir(tmp_path_factory)
    results_path = out / "results.json"
    deadline = time.monotonic() + REFERENCE_RUNS_BOUND_S
    while not results_path.exists():
        driver_pid = (out / "driver.pid").read_text() if (out / "driver.pid").exists() else ""
        if time.monotonic() > deadline or (driver_pid and not running(int(driver_pid))):
            if not results_path.exists():  # it may have written them just now
                log = (out / "driver.log").read_text() if (out / "driver.log").exists() else ""
                pytest.fail(f"the reference runs ended or took {REFERENCE_RUNS_BOUND_S} s without results; "
                            f"{out / 'driver.log'}:\n{log}")
        time.sleep(0.2)
    results = json.loads(results_path.read_text())
    for step, result in results.items():
        output = result["stdout"][-3000:] + result["stderr"][-6000:]
        assert result["returncode"] == 0, f"{step}: {result['command']}\n{output}"
    assert set(results) == {"export", "one", "two"}
    return out
