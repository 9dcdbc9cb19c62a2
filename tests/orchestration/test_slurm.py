"""`launch --slurm`: the sbatch script's content, that it is never written over, and its torchrun line run here."""
import os
import shlex
import subprocess
import sys

import pytest

from nbddp.errors import UsageError
from nbddp.orchestration.launch.slurm import SlurmOptions, job_script, write_job_script

from .test_launch import free_port

OPTIONS = SlurmOptions(nodes=4, gpus_per_node=8, job_name="sft-8b", time="1-12:00:00", partition="gpu,gpu-long",
                       cpus_per_node=96, max_restarts=2)


def lines_of(text):
    return text.splitlines()


def test_the_job_asks_slurm_for_nodes_gpus_and_one_task_per_node(tmp_path):
    text = job_script("generated/train.py", ["--max_steps", "100"], OPTIONS, python="/venv/bin/python", workdir=tmp_path)
    assert lines_of(text)[:10] == [
        "#!/bin/bash",
        "#SBATCH --job-name=sft-8b",
        "#SBATCH --nodes=4",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --cpus-per-task=96",
        "#SBATCH --time=1-12:00:00",
        "#SBATCH --partition=gpu,gpu-long",
        f"#SBATCH --chdir={tmp_path}",
        "#",
    ]


def test_one_torchrun_per_node_meets_at_the_first_node(tmp_path):
    text = job_script("generated/train.py", ["--max_steps", "100"], OPTIONS, python="/venv/bin/python", workdir=tmp_path)
    lines = lines_of(text)
    assert 'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)"' in lines
    assert "export MASTER_ADDR  # not on the line above: `export` would hide a failure of scontrol from `set -e`" in lines
    assert 'export MASTER_PORT="${MASTER_PORT:-$(( 20000 + SLURM_JOB_ID % 10000 ))}"' in lines
    assert 'export TORCH_NCCL_ASYNC_ERROR_HANDLING="${TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}"' in lines
    assert 'export NBDDP_TIMEOUT_S="${NBDDP_TIMEOUT_S:-1800}"' in lines
    assert "srun --ntasks-per-node=1 --kill-on-bad-exit=1 --cpus-per-task=96 bash -c '" in lines
    torchrun = " ".join(line.strip().rstrip("\\") for line in lines if line.strip().startswith(("exec", "--")))
    assert ('exec "$0" -m torch.distributed.run --nnodes "$SLURM_NNODES" --node-rank "$SLURM_NODEID"  '
            '--rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" --rdzv-id "$SLURM_JOB_ID"  '
            '--nproc-per-node 8 --max-restarts 2 "$@"') == torchrun
    assert lines[-1] == "' /venv/bin/python generated/train.py --max_steps 100"
    assert "threads=$(( $(nproc) / 8 ))" in text


def test_optional_directives_are_left_to_slurm(tmp_path):
    text = job_script("generated/train.py", [], SlurmOptions(), workdir=tmp_path)
    directives = [line for line in lines_of(text) if line.startswith("#SBATCH")]
    assert directives == ["#SBATCH --job-name=nbddp", "#SBATCH --nodes=1", "#SBATCH --ntasks-per-node=1",
                          "#SBATCH --gpus-per-node=1", f"#SBATCH --chdir={tmp_path}"]
    assert "--max-restarts" not in text and "--cpus-per-task" not in text


def test_the_script_is_valid_bash_even_with_awkward_flags(tmp_path):
    path = tmp_path / "job.sbatch"
    path.write_text(job_script("generated/train.py", ["--prompt", "it's \"quoted\" $HOME"], OPTIONS, workdir=tmp_path / "a b"))
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True).returncode == 0
    last = lines_of(path.read_text())[-1]
    assert shlex.split(last[1:])[-2:] == ["--prompt", "it's \"quoted\" $HOME"]  # reaches the script verbatim


@pytest.mark.parametrize("options, message", [
    (dict(nodes=0), "--nodes 0: expected at least 1"),
    (dict(gpus_per_node=0), "--gpus-per-node 0: expected at least 1"),
    (dict(cpus_per_node=0), "--cpus-per-node 0: expected at least 1"),
    (dict(max_restarts=-1), "--max-restarts -1: expected 0 or more"),
    (dict(job_name="my job"), "--job-name 'my job': expected letters, digits"),
    (dict(time="1:00\n#SBATCH --exclusive"), "--time '1:00\\\\n#SBATCH --exclusive': expected"),
    (dict(partition=""), "--partition '': expected"),
])
def test_bad_options_name_the_flag(options, message):
    with pytest.raises(UsageError, match=message):
        SlurmOptions(**options)


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hi')\n")
    return tmp_path


def test_writes_the_script_and_says_how_to_submit_it(project, capsys):
    path = write_job_script("train.py", ["--max_steps", "3"], SlurmOptions(nodes=2), "jobs/train.sbatch")
    assert path.read_text() == job_script("train.py", ["--max_steps", "3"], SlurmOptions(nodes=2))
    out = capsys.readouterr().out.splitlines()
    assert out == ["wrote jobs/train.sbatch: 2 node(s) x 1 GPU(s) running train.py", "submit it with: sbatch jobs/train.sbatch"]


def test_an_existing_file_is_never_overwritten(project):
    (project / "train.sbatch").write_text("#!/bin/bash\n# my own edits\n")
    with pytest.raises(UsageError, match="-o train.sbatch: already exists; nbddp does not overwrite it"):
        write_job_script("train.py", [], SlurmOptions(), "train.sbatch")
    assert (project / "train.sbatch").read_text() == "#!/bin/bash\n# my own edits\n"
    assert sorted(path.name for path in project.iterdir()) == ["train.py", "train.sbatch"]  # no temp file left


def test_a_missing_script_writes_nothing(project):
    with pytest.raises(UsageError, match="--script generated/train.py: no such file"):
        write_job_script("generated/train.py", [], SlurmOptions(), "train.sbatch")
    assert sorted(path.name for path in project.iterdir()) == ["train.py"]


FAKE_SRUN = """#!/bin/bash
# srun on one node: drop srun's own options and run the task here.
while [[ $1 == --* ]]; do shift; done
exec "$@"
"""
FAKE_SCONTROL = "#!/bin/bash\necho 127.0.0.1\n"


@pytest.mark.e2e
def test_the_job_runs_its_torchrun_line_with_slurm_faked(workdir):
    """The whole job script under bash with SLURM's variables set and fake srun/scontrol: 1 node, 2 CPU workers."""
    bin_dir = workdir / "fake-bin"
    bin_dir.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    path = write_job_script("allreduce.py", [str(workdir / "sum.txt")], SlurmOptions(gpus_per_node=2), "train.sbatch")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CUDA_VISIBLE_DEVICES": "",
           "SLURM_JOB_NODELIST": "node[1]", "SLURM_NNODES": "1", "SLURM_NODEID": "0", "SLURM_JOB_ID": "4242",
           "MASTER_PORT": str(free_port())}
    env.pop("OMP_NUM_THREADS", None)
    result = subprocess.run(["bash", str(path)], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    world, total, threads = (workdir / "sum.txt").read_text().split()
    assert (world, total) == ("2", "3")
    assert int(threads) == max(1, len(os.sched_getaffinity(0)) // 2)  # the job script's per-node default
