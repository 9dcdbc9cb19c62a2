"""Fixture scripts shaped like generated/train.py, copied into a scratch working directory per test."""

import contextlib
import io
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nbddp.formats import metrics
from nbddp.orchestration import parameters

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A scratch working directory holding copies of the fixture scripts (and the failing one's source map)."""
    for path in FIXTURES.iterdir():
        shutil.copy(path, tmp_path / path.name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def metric_lines(path):
    """The per-step records of a metrics.jsonl."""
    return metrics.steps(metrics.read(path))


REPO = Path(__file__).parents[2]
# Tests of the real example pipeline (notebooks/ -> generated/train.py) run from the repository root.
needs_generated_script = pytest.mark.skipif(not (REPO / "generated" / "train.py").exists(),
                                            reason="generated/train.py is not exported")


@pytest.fixture
def repo_root(monkeypatch):
    monkeypatch.chdir(REPO)
    return REPO


class OverrideCheckInProcess:
    """`parameters.subprocess` for the tests: the `--set` check's child (training_overrides.main, which imports
    transformers) runs in this process, so the suite imports transformers once instead of once per check. Any other
    command runs as a child as usual."""

    TimeoutExpired = subprocess.TimeoutExpired

    def run(self, command, **kwargs):
        if command[:2] != [sys.executable, "-c"] or "training_overrides" not in command[2]:
            return subprocess.run(command, **kwargs)
        from nbddp.runtime.inputs import training_overrides

        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            status = training_overrides.main(command[3:])
        return subprocess.CompletedProcess(command, status, printed.getvalue(), "")


@pytest.fixture(autouse=True)
def override_check_in_process(request, monkeypatch):
    """The `--set` check in this process, except in e2e tests, which run everything as the user's command does.
    test_overrides.py's test_the_parent_checks_without_importing_transformers runs the real child."""
    if request.node.get_closest_marker("e2e") is None:
        monkeypatch.setattr(parameters, "subprocess", OverrideCheckInProcess())
