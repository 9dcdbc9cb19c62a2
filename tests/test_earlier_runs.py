"""What an earlier run left in output_dir, met by `pipeline.py launch` on 2 CPU processes: bytes in metrics.jsonl
that are no record, checkpoints whose marker or files would not load, an output_dir that is a file. Each ends
with the right thing done and said in a line, or one clean report: no traceback, nothing of the user's deleted,
no process left behind. (The same files read in isolation: tests/formats/test_metrics.py,
tests/test_checkpoint_markers.py, tests/orchestration/test_failure_report.py.)
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nbddp.formats import checkpoint_markers
from nbddp.formats.checkpoint_markers import DAMAGED, MARKER

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "generated" / "train.py"
FLAGS = ["--backend", "hf", "--save_steps", "2", "--warmup_steps", "1", "--eval_steps", "1000"]

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not SCRIPT.exists(), reason="generated/train.py is not exported")]


def launch(output_dir, *flags, timeout=600):
    command = [sys.executable, "pipeline.py", "launch", "--nproc-per-node", "2", "--", *FLAGS,
               "--output_dir", str(output_dir), *flags]
    result = subprocess.run(command, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                            text=True, timeout=timeout)
    assert not processes_of(output_dir), "a process of the run outlived it"
    return result


def assert_no_nbddp_traceback(text):
    """No frame of nbddp's code or pipeline.py (torchrun prints its own ChildFailedError traceback, which names
    the failed ranks)."""
    assert f'File "{REPO / "nbddp"}' not in text and 'pipeline.py", line' not in text, text[-3000:]


def processes_of(output_dir):
    """The pids of processes whose command line names `output_dir`."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and str(output_dir).encode() in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
        except OSError:  # gone meanwhile
            continue
    return found


def digest(folder):
    return {str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(Path(folder).rglob("*")) if path.is_file()}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 4-step run's output_dir, with checkpoint-2 and checkpoint-4."""
    output_dir = tmp_path_factory.mktemp("finished") / "outputs"
    result = launch(output_dir, "--max_steps", "4")
    assert result.returncode == 0, result.stderr[-3000:]
    assert [c.step for c in checkpoint_markers.complete_checkpoints(output_dir)] == [2, 4]
    return output_dir


@pytest.fixture
def earlier(finished, tmp_path):
    """A copy of the finished run's output_dir, for one test to spoil."""
    return Path(shutil.copytree(finished, tmp_path / "outputs"))


def test_a_metrics_line_that_is_not_utf8_neither_stops_a_resume_nor_its_report(earlier):
    with open(earlier / "metrics.jsonl", "ab") as file:
        file.write(b"\xff\xfe not text\n[1, 2, 3]\n")
    result = launch(earlier, "--max_steps", "6", "--resume", "true")
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"nbddp: --resume: resuming from {earlier / 'checkpoint-4'} (step 4)" in result.stdout
    records = [json.loads(line) for line in (earlier / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [record["step"] for record in records if "event" not in record] == [1, 2, 3, 4, 5, 6]
    assert_no_nbddp_traceback(result.stderr)


ADAPTER_CONFIG = "lora_adapter/adapter_config.json"


def test_resuming_a_finished_run_says_so_and_trains_nothing(finished, earlier):
    before = digest(earlier)
    result = launch(earlier, "--max_steps", "4", "--resume", "true")
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"nbddp: {earlier / 'checkpoint-4'} (step 4) is where this training ends (max_steps is 4): nothing left " \
           "to train. Loaded its weights; the script goes on after training." in result.stdout
    assert "held-out loss after 4 steps: " in result.stdout  # the notebook's cells after training ran
    assert "nbddp: step 5" not in result.stdout
    after = digest(earlier)
    # the same files, bar TensorBoard's new event file, the held-out loss the notebook's evaluate() logs once more,
    # and PEFT's adapter_config.json, whose target_modules (a set) come in another order
    kept = {name for name in after if not name.startswith("runs/")} - {"metrics.jsonl", ADAPTER_CONFIG}
    assert {name: after[name] for name in kept} == {name: before[name] for name in kept}  # the adapter's weights too
    config = [json.loads((earlier / ADAPTER_CONFIG).read_text()), json.loads((finished / ADAPTER_CONFIG).read_text())]
    assert [{**c, "target_modules": sorted(c["target_modules"])} for c in config][0] == \
           [{**c, "target_modules": sorted(c["target_modules"])} for c in config][1]
    lines = (earlier / "metrics.jsonl").read_text().splitlines()
    assert lines[:-1] == (finished / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[-1])["event"] == "eval"
    assert [c.step for c in checkpoint_markers.complete_checkpoints(earlier)] == [2, 4]
    assert_no_nbddp_traceback(result.stderr)


def damage_marker(checkpoint):
    marker = (checkpoint / MARKER).read_bytes()
    (checkpoint / MARKER).write_bytes(marker[:len(marker) // 2])  # the data files stay intact
    return f"its marker {MARKER} is not the JSON nbddp writes"


def empty_optimizer(checkpoint):
    (checkpoint / "optimizer.pt").write_bytes(b"")
    return "optimizer.pt is empty (0 bytes)"


def contradicting_marker(checkpoint):
    marker = json.loads((checkpoint / MARKER).read_text())
    (checkpoint / MARKER).write_text(json.dumps({**marker, "step": 40, "world_size": 8}))
    return f"its marker {MARKER} says step 40, the directory is checkpoint-4"


@pytest.mark.parametrize("spoil", [damage_marker, empty_optimizer, contradicting_marker])
def test_a_checkpoint_that_would_not_load_is_set_aside_and_the_one_before_resumed(earlier, spoil):
    why = spoil(earlier / "checkpoint-4")
    files = digest(earlier / "checkpoint-4")
    result = launch(earlier, "--max_steps", "6", "--resume", "true")
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    moved = earlier / DAMAGED / "checkpoint-4"
    assert f"nbddp: warning: {earlier / 'checkpoint-4'} would not load ({why}): moved it to {moved}, whole" in output
    assert f"nbddp: --resume: resuming from {earlier / 'checkpoint-2'} (step 2)" in output
    assert digest(moved) == files  # set aside, not deleted
    assert [c.step for c in checkpoint_markers.complete_checkpoints(earlier)] == [4, 6]  # trained on from step 2
    assert_no_nbddp_traceback(result.stderr)


def test_an_output_dir_that_is_a_file_is_reported_once_without_a_crash(tmp_path):
    output_dir = tmp_path / "outputs"
    output_dir.write_text("the user's")
    result = launch(output_dir, "--max_steps", "4")
    assert result.returncode == 1  # torchrun's, for workers that exited 2
    assert f"nbddp: error: output_dir '{output_dir}': exists and is not a directory" in result.stderr
    assert f"  output_dir {output_dir}: not a folder, so no steps were logged" in result.stderr
    assert_no_nbddp_traceback(result.stderr)
    assert output_dir.read_text() == "the user's"


@pytest.mark.parametrize("below", ["dangling link", "file"])
def test_an_output_dir_that_cannot_be_made_stops_before_the_model_loads(tmp_path, below):
    if below == "file":
        (tmp_path / "file").write_text("the user's")
        output_dir, what = tmp_path / "file" / "out", f"{tmp_path / 'file'} is a file, not a directory"
    else:
        (tmp_path / "link").symlink_to(tmp_path / "gone")
        output_dir, what = tmp_path / "link", f"{tmp_path / 'link'} is a symbolic link to {tmp_path / 'gone'}, " \
                                              "which does not exist"
    result = launch(output_dir, "--max_steps", "4")
    assert result.returncode == 1 and "exitcode  : 2" in result.stderr  # the workers exit 2, torchrun 1
    assert f"nbddp: error: output_dir '{output_dir}': {what}" in result.stderr
    assert "nbddp: backend=" not in result.stdout
    assert_no_nbddp_traceback(result.stderr)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["file" if below == "file" else "link"]


def no_nan_literals(text):
    raise AssertionError(f"{text} in metrics.jsonl, which is not standard JSON")


def test_a_loss_that_turns_non_finite_stops_the_run_at_that_step(tmp_path):
    output_dir = tmp_path / "outputs"
    result = launch(output_dir, "--max_steps", "8", "--save_steps", "1", "--learning_rate", "1e30")
    assert result.returncode == 1
    report = result.stderr[result.stderr.rindex("nbddp: training failed"):]
    stopped = "the training loss is not finite (NaN or infinite) at step 3 of 8: training stopped there"
    assert f"  rank 0 failed: NonFiniteLoss: {stopped}" in report and "  rank 1 failed too: the same error" in report
    assert "a learning rate too high for this model (learning_rate 1e+30)" in report
    assert f"{output_dir / 'checkpoint-2'} holds the weights that gave that loss: moved into {DAMAGED}/. Last " \
           f"complete checkpoint before it: {output_dir / 'checkpoint-1'} (step 1)" in report
    assert f"  last complete checkpoint: {output_dir / 'checkpoint-1'} (step 1); rerun with --resume true" in report
    assert (output_dir / DAMAGED / "checkpoint-2" / MARKER).exists()  # set aside whole, not deleted
    assert not (output_dir / "lora_adapter").exists()  # the cells after training did not run
    records = [json.loads(line, parse_constant=no_nan_literals)
               for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    assert max(record["step"] for record in records if "event" not in record) == 2
    assert_no_nbddp_traceback(result.stderr)
