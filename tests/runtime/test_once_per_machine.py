"""The once-per-machine folder: this job's alone, private to its user, never followed through links, gone after."""
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap

import pytest

from nbddp.errors import UsageError
from nbddp.runtime.context import DistributedContext


@pytest.fixture
def private_tmp(monkeypatch, tmp_path):
    """The temporary directory, in tmp_path rather than the shared /tmp; torchrun's run id unset."""
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    return tmp_path / "tmp"


def rank(local_rank=0):
    return DistributedContext(rank=local_rank, local_rank=local_rank, world_size=2, local_world_size=2)


def folder_of_this_job(private_tmp, tmp_path):
    """The folder a first claim of this job makes (emptied), and the files that claim made in it."""
    rank().write_file(str(tmp_path / "cfg.yaml"), "a: 1\n")
    [folder] = private_tmp.glob("nbddp-once-*")
    return folder, sorted(folder.iterdir())


def test_the_folder_and_its_files_are_private_to_the_user(private_tmp, tmp_path):
    folder, files = folder_of_this_job(private_tmp, tmp_path)
    assert stat.S_IMODE(os.lstat(folder).st_mode) == 0o700
    assert [stat.S_IMODE(os.lstat(file).st_mode) for file in files] == [0o600]


def test_a_symlink_planted_in_the_folder_is_refused_and_its_target_left_alone(private_tmp, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("someone's file\n")
    folder, files = folder_of_this_job(private_tmp, tmp_path)
    for file in files:
        file.unlink()
        file.symlink_to(victim)
    with pytest.raises(UsageError) as refused:
        rank().write_file(str(tmp_path / "cfg.yaml"), "a: 1\n")
    assert str(refused.value) == (f"{files[0]}: a symbolic link, where nbddp keeps a once-per-machine file of its "
                                  f"own; something other than this job writes in {folder}: remove that folder")
    assert victim.read_text() == "someone's file\n"


@pytest.mark.parametrize("plant", ["a folder others can write in", "a symbolic link to a folder"])
def test_a_folder_made_by_someone_else_is_refused(private_tmp, tmp_path, plant):
    folder, _ = folder_of_this_job(private_tmp, tmp_path)
    shutil.rmtree(folder)
    if plant == "a symbolic link to a folder":
        (tmp_path / "elsewhere").mkdir()
        folder.symlink_to(tmp_path / "elsewhere")
        expected = f"{folder}: a symbolic link, where nbddp keeps this job's once-per-machine files"
    else:
        folder.mkdir()
        folder.chmod(0o777)
        expected = f"{folder}: a folder of uid {os.getuid()} with mode drwxrwxrwx, where nbddp keeps"
    with pytest.raises(UsageError, match=expected):
        rank().shell(f"echo ran >> {tmp_path / 'log'}")
    assert not (tmp_path / "log").exists() and not any((tmp_path / "elsewhere").glob("*"))


def test_another_job_under_the_same_agent_pid_does_the_work_again(private_tmp, tmp_path, monkeypatch):
    # A job that crashed left its folder; a later one whose torchrun agent got the same pid has another run id.
    for run_id in ("3f1c-first-job", "9a2e-second-job"):
        monkeypatch.setenv("TORCHELASTIC_RUN_ID", run_id)
        rank().shell(f"echo ran >> {tmp_path / 'log'}")
        rank(1).shell(f"echo ran >> {tmp_path / 'log'}")
    assert (tmp_path / "log").read_text() == "ran\nran\n"


WORKER = textwrap.dedent("""\
    import glob, os, stat, sys, tempfile
    from nbddp.runtime.context import init_distributed

    ddp = init_distributed()
    ddp.shell(f"echo ran >> {sys.argv[1]}")
    ddp.write_file(sys.argv[1] + ".txt", "text\\n")
    ddp.barrier()
    [folder] = glob.glob(os.path.join(tempfile.gettempdir(), "nbddp-once-*"))
    print(oct(stat.S_IMODE(os.lstat(folder).st_mode)), flush=True)
    ddp.shutdown()
    """)


@pytest.mark.e2e
def test_two_gloo_processes_do_the_work_once_and_leave_no_folder_behind(tmp_path):
    (tmp_path / "tmp").mkdir()
    worker, log = tmp_path / "worker.py", tmp_path / "log"
    worker.write_text(WORKER)
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp"), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                             str(worker), str(log)], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert len(log.read_text().splitlines()) == 1 and (tmp_path / "log.txt").read_text() == "text\n"
    # The two ranks print into one pipe, so their lines may interleave: count, do not split.
    assert result.stdout.count("0o700") == 2 and result.stdout.count(f"Writing {tmp_path / 'log.txt'}") == 1
    assert not list((tmp_path / "tmp").glob("nbddp-once-*"))
