"""What a smoke run changed in the project outside runs/ (nbddp/orchestration/smoke/project_changes.py)."""
from nbddp.orchestration.smoke import project_changes


def test_created_changed_and_removed_entries_are_named_and_runs_hidden_and_caches_are_not_listed(tmp_path):
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "01_a.ipynb").write_text("{}")
    (tmp_path / "old.txt").write_text("x")
    run_dir = tmp_path / "runs" / "t-run" / "smoke"
    run_dir.mkdir(parents=True)
    before = project_changes.snapshot(tmp_path, run_dir)
    assert set(before) == {"notebooks", "notebooks/01_a.ipynb", "old.txt"}
    (tmp_path / "notebooks" / "01_a.ipynb").write_text('{"cells": []}')
    (tmp_path / "old.txt").unlink()
    (tmp_path / "lora_model").mkdir()
    (tmp_path / "lora_model" / "NOTES.txt").write_text("y")
    for name in ("__pycache__", ".git", "unsloth_compiled_cache", "notebooks/.ipynb_checkpoints"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "f").write_text("z")
    (run_dir / "train.ipynb").write_text("{}")
    after = project_changes.snapshot(tmp_path, run_dir)
    assert project_changes.changes(before, after) == [
        "lora_model (created)", "lora_model/NOTES.txt (created)", "notebooks/01_a.ipynb (changed)",
        "old.txt (removed)"]


def test_the_report_names_ten_paths_and_counts_the_rest_and_says_nothing_when_nothing_changed(tmp_path):
    assert project_changes.report(tmp_path, []) is None
    text = project_changes.report(tmp_path, [f"f{index} (created)" for index in range(12)])
    assert text.startswith(f"smoke: the notebook changed 12 path(s) in {tmp_path} outside runs/")
    assert "f9 (created) and 2 more." in text and "f10" not in text


def test_a_project_too_big_to_list_is_not_listed(tmp_path, monkeypatch):
    monkeypatch.setattr(project_changes, "MAX_ENTRIES", 3)
    for index in range(5):
        (tmp_path / f"f{index}").write_text("")
    assert project_changes.snapshot(tmp_path, tmp_path / "runs") is None
    monkeypatch.setattr(project_changes, "MAX_ENTRIES", 5)
    assert len(project_changes.snapshot(tmp_path, tmp_path / "runs")) == 5
