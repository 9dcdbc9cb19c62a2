import json
import zipfile

import pytest

from nbddp.formats import checkpoint_markers
from nbddp.formats.checkpoint_markers import MARKER

NO_TENSORS = (2).to_bytes(8, "little") + b"{}"  # a whole safetensors file: the header's length, an empty header


def write_checkpoint(output_dir, step, complete=True, completed_at=None):
    """A checkpoint-<step> directory with a model file; marked complete (at `completed_at`, else now) or not."""
    path = output_dir / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "adapter_model.safetensors").write_bytes(NO_TENSORS)
    if complete:
        checkpoint_markers.mark_complete(path, step, world_size=2)
        if completed_at is not None:
            (path / MARKER).write_text(json.dumps({"step": step, "world_size": 2, "completed_at": completed_at}))
    return path


def test_the_marker_says_what_was_completed(tmp_path):
    path = write_checkpoint(tmp_path, 8, complete=False)
    assert checkpoint_markers.read_marker(path) is None
    checkpoint = checkpoint_markers.mark_complete(path, 8, world_size=2)
    assert checkpoint_markers.read_marker(path) == checkpoint
    assert (checkpoint.path, checkpoint.step, checkpoint.world_size) == (path, 8, 2)
    assert sorted(p.name for p in path.iterdir()) == ["adapter_model.safetensors", MARKER]  # no temp file left


def test_an_incomplete_checkpoint_is_never_the_latest(tmp_path):
    write_checkpoint(tmp_path, 4)
    write_checkpoint(tmp_path, 8)
    write_checkpoint(tmp_path, 12, complete=False)  # a rank was killed while writing it
    (tmp_path / "checkpoint-16").mkdir()  # killed before writing anything
    assert checkpoint_markers.latest_complete(tmp_path).step == 8
    assert [path.name for path in checkpoint_markers.incomplete_dirs(tmp_path)] == ["checkpoint-12", "checkpoint-16"]


@pytest.mark.parametrize("marker", ["", "{", '{"step": 8}', "[1, 2]", '{"step": "x", "world_size": 2, "completed_at": 1}',
                                    b'{"step": 8, "world_size": 2, "completed_at": 1, "run": "\xff"}'])
def test_a_marker_that_is_not_ours_means_damaged_not_incomplete(tmp_path, marker):
    path = write_checkpoint(tmp_path, 8, complete=False)
    (path / MARKER).write_bytes(marker if isinstance(marker, bytes) else marker.encode())
    assert checkpoint_markers.read_marker(path) is None
    assert checkpoint_markers.latest_complete(tmp_path) is None
    assert checkpoint_markers.incomplete_dirs(tmp_path) == []  # not a half-written one, to be deleted
    assert checkpoint_markers.damaged_dirs(tmp_path) == [(path, f"its marker {MARKER} is not the JSON nbddp writes")]


def test_latest_means_last_completed_not_highest_step(tmp_path):
    write_checkpoint(tmp_path, 50, completed_at=1000.0)  # an earlier run in the same output_dir
    write_checkpoint(tmp_path, 10, completed_at=2000.0)
    assert checkpoint_markers.latest_complete(tmp_path).step == 10


def test_only_checkpoint_directories_count(tmp_path):
    write_checkpoint(tmp_path, 4)
    (tmp_path / "lora_adapter").mkdir()
    (tmp_path / "checkpoint-x").mkdir()
    (tmp_path / "checkpoint-9").write_text("a file")
    assert [path.name for path in checkpoint_markers.checkpoint_dirs(tmp_path)] == ["checkpoint-4"]
    assert checkpoint_markers.checkpoint_dirs(tmp_path / "missing") == []


def test_remove_deletes_the_marker_first(tmp_path, monkeypatch):
    path = write_checkpoint(tmp_path, 4)
    seen = []
    monkeypatch.setattr(checkpoint_markers.shutil, "rmtree", lambda p: seen.append((p / MARKER).exists()))
    checkpoint_markers.remove(path)
    assert seen == [False]  # by the time the files go, the directory no longer claims to be complete


def test_rotation_keeps_the_newest_complete_checkpoints(tmp_path):
    for step, at in [(2, 1.0), (4, 2.0), (6, 3.0), (8, 4.0)]:
        write_checkpoint(tmp_path, step, completed_at=at)
    write_checkpoint(tmp_path, 10, complete=False)
    deleted = checkpoint_markers.rotate(tmp_path, keep=2)
    assert [path.name for path in deleted] == ["checkpoint-2", "checkpoint-4"]
    assert [path.name for path in checkpoint_markers.checkpoint_dirs(tmp_path)] == ["checkpoint-10", "checkpoint-6",
                                                                                     "checkpoint-8"]


def test_rotation_spares_the_best_checkpoint_and_keeps_all_without_a_limit(tmp_path):
    for step, at in [(2, 1.0), (4, 2.0), (6, 3.0)]:
        write_checkpoint(tmp_path, step, completed_at=at)
    assert checkpoint_markers.rotate(tmp_path, keep=None) == []
    assert checkpoint_markers.rotate(tmp_path, keep=0) == []
    deleted = checkpoint_markers.rotate(tmp_path, keep=1, protected=[str(tmp_path / "checkpoint-2"), None])
    assert [path.name for path in deleted] == ["checkpoint-4"]


def test_the_marker_names_its_run_and_older_markers_have_none(tmp_path):
    run = checkpoint_markers.new_run_id()
    path = write_checkpoint(tmp_path, 4, complete=False)
    assert checkpoint_markers.mark_complete(path, 4, world_size=2, run=run).run == run
    assert json.loads((path / MARKER).read_text())["run"] == run
    assert checkpoint_markers.read_marker(path).run == run
    older = write_checkpoint(tmp_path, 8, completed_at=1000.0)  # the JSON before runs had ids
    assert checkpoint_markers.read_marker(older).run is None
    assert checkpoint_markers.new_run_id() != run


def test_unmark_makes_a_checkpoint_incomplete_and_keeps_its_files(tmp_path):
    path = write_checkpoint(tmp_path, 4)
    checkpoint_markers.unmark(path)
    checkpoint_markers.unmark(path)  # nothing to remove: nothing happens
    assert checkpoint_markers.read_marker(path) is None
    assert [p.name for p in path.iterdir()] == ["adapter_model.safetensors"]


def test_move_aside_takes_every_checkpoint_of_the_folder_into_its_runs_folder(tmp_path):
    run = "20261201T101500Z-3fa2c1"
    checkpoint_markers.mark_complete(write_checkpoint(tmp_path, 2, complete=False), 2, world_size=1, run=run)
    write_checkpoint(tmp_path, 4, complete=False)  # half-written: moved too, never rewritten in place
    (tmp_path / "metrics.jsonl").write_text("")
    (tmp_path / "trainer-2").mkdir()
    moved = checkpoint_markers.move_aside(tmp_path)
    assert moved == tmp_path / "nbddp-previous-runs" / run
    assert sorted(p.name for p in moved.iterdir()) == ["checkpoint-2", "checkpoint-4"]
    assert checkpoint_markers.read_marker(moved / "checkpoint-2").run == run  # still complete, marker and all
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl", "nbddp-previous-runs", "trainer-2"]
    assert checkpoint_markers.move_aside(tmp_path) is None  # nothing left to move


def test_move_aside_never_merges_into_a_folder_that_exists(tmp_path):
    write_checkpoint(tmp_path, 2, completed_at=1000.0)  # no run id: "unknown"
    first = checkpoint_markers.move_aside(tmp_path)
    write_checkpoint(tmp_path, 2, complete=False)
    second = checkpoint_markers.move_aside(tmp_path)
    assert (first.name, second.name) == ("unknown", "unknown-2")
    assert (first / "checkpoint-2" / MARKER).exists() and not (second / "checkpoint-2" / MARKER).exists()


def test_rotation_of_one_run_spares_the_checkpoints_of_another(tmp_path):
    for step, at, run in [(50, 1.0, "old"), (2, 2.0, "new"), (4, 3.0, "new"), (6, 4.0, "new")]:
        path = write_checkpoint(tmp_path, step, complete=False)
        checkpoint_markers.mark_complete(path, step, world_size=1, run=run)
        (path / MARKER).write_text(json.dumps({"step": step, "world_size": 1, "completed_at": at, "run": run}))
    deleted = checkpoint_markers.rotate(tmp_path, keep=1, run="new")
    assert [path.name for path in deleted] == ["checkpoint-2", "checkpoint-4"]
    assert [c.step for c in checkpoint_markers.complete_checkpoints(tmp_path)] == [50, 6]


HEADER = b'{"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}'  # 16 bytes of tensor data


def write_zip(path, cut=0):
    """A zip archive as torch.save writes one, less its last `cut` bytes."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", b"\x80\x02}q\x00." * 50)
    path.write_bytes(path.read_bytes()[:len(path.read_bytes()) - cut])


@pytest.mark.parametrize("name, content, why", [
    ("optimizer.pt", b"", "optimizer.pt is empty (0 bytes)"),
    ("optimizer.pt", "cut", "optimizer.pt is cut short ("),
    ("adapter_model.safetensors", NO_TENSORS[:6], "adapter_model.safetensors is cut short (6 bytes, not a whole"),
    ("adapter_model.safetensors", (len(HEADER)).to_bytes(8, "little") + HEADER + b"\0" * 8,
     f"adapter_model.safetensors is cut short ({16 + len(HEADER)} bytes of the {24 + len(HEADER)} its header"),
    ("trainer_state.json", b'{"global_step": 4, "log_hi', "trainer_state.json is not valid JSON ("),
])
def test_a_marked_checkpoint_whose_files_would_not_load_is_damaged(tmp_path, name, content, why):
    write_checkpoint(tmp_path, 2)
    path = write_checkpoint(tmp_path, 4)
    if content == "cut":
        write_zip(path / name, cut=10)
    else:
        (path / name).write_bytes(content)
    [(found, reason)] = checkpoint_markers.damaged_dirs(tmp_path)
    assert found == path and reason.startswith(why)
    assert checkpoint_markers.latest_complete(tmp_path).step == 2  # the one before it is proposed


def test_whole_files_are_no_damage(tmp_path):
    path = write_checkpoint(tmp_path, 4)
    write_zip(path / "optimizer.pt")
    (path / "rng_state_0.pth").write_bytes(b"\x80\x02legacy torch.save")  # not a zip: not judged beyond its size
    (path / "rng_state_1.pth").write_bytes(b"\x80\x02legacy torch.save")
    (path / "trainer_state.json").write_text('{"global_step": 4}')
    (path / "tokenizer.json").write_text("{")  # not loaded on resume
    assert checkpoint_markers.damaged_dirs(tmp_path) == [] and checkpoint_markers.latest_complete(tmp_path).step == 4


def test_a_marker_that_contradicts_its_directory_is_damaged(tmp_path):
    wrong_step = write_checkpoint(tmp_path, 4)
    (wrong_step / MARKER).write_text(json.dumps({"step": 40, "world_size": 2, "completed_at": 1.0}))
    wrong_world = write_checkpoint(tmp_path, 6)
    (wrong_world / MARKER).write_text(json.dumps({"step": 6, "world_size": 8, "completed_at": 2.0}))
    for rank in (0, 1):
        (wrong_world / f"rng_state_{rank}.pth").write_bytes(b"state")
    assert checkpoint_markers.damaged_dirs(tmp_path) == [
        (wrong_step, f"its marker {MARKER} says step 40, the directory is checkpoint-4"),
        (wrong_world, f"its marker {MARKER} says 8 processes wrote it, the directory holds the RNG states of 2"),
    ]
    assert checkpoint_markers.latest_complete(tmp_path) is None


def test_setting_aside_moves_the_directory_whole(tmp_path):
    first, second = write_checkpoint(tmp_path / "a", 4), write_checkpoint(tmp_path / "b", 4)
    second.rename(tmp_path / "a" / "x")
    moved = checkpoint_markers.set_aside(first)
    assert moved == tmp_path / "a" / checkpoint_markers.DAMAGED / "checkpoint-4" and not first.exists()
    assert sorted(p.name for p in moved.iterdir()) == ["adapter_model.safetensors", MARKER]
    (tmp_path / "a" / "x").rename(first)
    assert checkpoint_markers.set_aside(first).name == "checkpoint-4-2"  # the first is kept
    assert checkpoint_markers.checkpoint_dirs(tmp_path / "a") == []
