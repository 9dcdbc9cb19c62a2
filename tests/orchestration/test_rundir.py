import re

from nbddp.orchestration.project.rundir import new_run_dir


def test_run_dirs_are_utc_stamped_and_never_shared(tmp_path):
    first = new_run_dir("smoke", tmp_path / "runs")
    second = new_run_dir("smoke", tmp_path / "runs")
    assert re.fullmatch(r"\d{8}T\d{6}Z-smoke", first.name)
    assert first != second and first.is_dir() and second.is_dir()
