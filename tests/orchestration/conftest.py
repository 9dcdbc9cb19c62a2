"""Fixture scripts shaped like generated/train.py, copied into a scratch working directory per test."""

import shutil
from pathlib import Path

import pytest

from nbddp.formats import metrics

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

