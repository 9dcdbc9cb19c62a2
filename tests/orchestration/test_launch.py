import os
import socket
import subprocess
import sys

import pytest

from nbddp.errors import UsageError
from nbddp.orchestration.launch import launch
from nbddp.orchestration.launch.launch import LaunchOptions, plan_launch

from .conftest import REPO, metric_lines, needs_generated_script

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def test_one_node_uses_a_standalone_rendezvous():
    plan = plan_launch("generated/train.py", ["--max_steps", "3"], LaunchOptions("4"), environ={})
    assert plan.command == TORCHRUN + ["--standalone", "--nnodes", "1", "--nproc-per-node", "4",
                                       "generated/train.py", "--max_steps", "3"]


def test_several_nodes_meet_at_a_c10d_endpoint():
    options = LaunchOptions("8", nnodes=2, node_rank=1, rdzv_endpoint="head:29500", rdzv_id="job7")
    plan = plan_launch("generated/train.py", [], options, log_dir="runs/x/logs", environ={})
    assert plan.command == TORCHRUN + [
        "--nnodes", "2", "--node-rank", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", "head:29500",
        "--rdzv-id", "job7", "--nproc-per-node", "8", "--log-dir", "runs/x/logs", "--tee", "3", "generated/train.py"]


def test_max_restarts_goes_to_torchrun():
    plan = plan_launch("generated/train.py", [], LaunchOptions("2", max_restarts=3), environ={})
    assert plan.command == TORCHRUN + ["--standalone", "--nnodes", "1", "--nproc-per-node", "2", "--max-restarts", "3",
                                       "generated/train.py"]


def test_auto_is_one_process_per_gpu_or_two_on_cpu():
    assert LaunchOptions().processes({"CUDA_VISIBLE_DEVICES": "0,1,2"}) == 3
    assert LaunchOptions().processes({"CUDA_VISIBLE_DEVICES": ""}) == launch.CPU_PROCESSES == 2


def test_environment_defaults_never_override_the_users(monkeypatch):
    monkeypatch.setattr(launch, "_cpu_count", lambda: 16)
    additions = launch.env_additions(4, {"NBDDP_TIMEOUT_S": "60"})
    assert additions == {"OMP_NUM_THREADS": "4", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
                         "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    assert launch.env_additions(32, {})["OMP_NUM_THREADS"] == "1"


@pytest.mark.parametrize("options, message", [
    (dict(nproc="0"), "--nproc-per-node 0"),
    (dict(nproc="many"), "--nproc-per-node many"),
    (dict(nnodes=2), "--nnodes 2: several nodes need --rdzv-endpoint"),
    (dict(nnodes=2, rdzv_endpoint="head"), "--rdzv-endpoint head: expected HOST:PORT"),
    (dict(nnodes=2, rdzv_endpoint="head:1", node_rank=2), "--node-rank 2: expected 0..1"),
    (dict(max_restarts=-1), "--max-restarts -1: expected 0 or more"),
])
def test_bad_options_name_the_flag(options, message):
    with pytest.raises(UsageError, match=message):
        LaunchOptions(**options)


def test_dry_run_prints_a_pasteable_line_and_runs_nothing(capsys, monkeypatch):
    monkeypatch.setattr(launch, "execute", lambda plan: pytest.fail("a dry run must not start torchrun"))
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert launch.launch("missing/train.py", ["--name", "a b"], LaunchOptions("2"), dry_run=True) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("would run: TORCH_NCCL_ASYNC_ERROR_HANDLING=1 NBDDP_TIMEOUT_S=1800 ")
    assert line.endswith("--nproc-per-node 2 missing/train.py --name 'a b'")


def test_a_missing_script_is_a_usage_error():
    with pytest.raises(UsageError, match="--script missing/train.py: no such file"):
        launch.launch("missing/train.py", options=LaunchOptions("1"))


@pytest.mark.e2e
def test_two_cpu_processes_all_reduce_over_gloo(workdir):
    status = launch.launch("allreduce.py", [str(workdir / "sum.txt")], LaunchOptions("2"), log_dir=workdir / "logs")
    assert status == 0
    world, total, threads = (workdir / "sum.txt").read_text().split()
    assert (world, total) == ("2", "3")  # ranks 0 and 1 added 1 and 2
    assert int(threads) >= 1
    assert len(list((workdir / "logs").rglob("stdout.log"))) == 2  # one log per rank


@pytest.mark.e2e
def test_torchrun_status_comes_back(workdir):
    # allreduce.py without its output argument fails on rank 0 with IndexError.
    assert launch.launch("allreduce.py", [], LaunchOptions("2")) != 0


@pytest.mark.e2e
def test_max_restarts_restarts_failed_workers(workdir):
    # fails_once.py fails on torchrun's first attempt and succeeds on the restart.
    assert launch.launch("fails_once.py", [str(workdir / "restart.txt")], LaunchOptions("2")) != 0
    assert not (workdir / "restart.txt").exists()
    assert launch.launch("fails_once.py", [str(workdir / "restart.txt")], LaunchOptions("2", max_restarts=1)) == 0
    assert (workdir / "restart.txt").read_text() == "1\n"


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_nodes(nnodes, script, script_args, cwd, timeout_s=300):
    """`pipeline.py launch` once per node, as each node of a multi-node job would run it (here all on this
    machine, one CPU process each); returns each launcher's exit status and output."""
    endpoint = f"127.0.0.1:{free_port()}"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    nodes = [
        subprocess.Popen([sys.executable, str(REPO / "pipeline.py"), "launch", "--nnodes", str(nnodes), "--node-rank",
                          str(rank), "--rdzv-endpoint", endpoint, "--nproc-per-node", "1", "--script", script, "--",
                          *script_args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for rank in range(nnodes)
    ]
    return [(node.wait(timeout=timeout_s), node.stdout.read()) for node in nodes]


@pytest.mark.e2e
def test_two_launchers_form_one_two_node_job(workdir):
    results = start_nodes(2, "allreduce.py", [str(workdir / "sum.txt")], workdir)
    assert [status for status, _ in results] == [0, 0], results
    for rank, (_, output) in enumerate(results):
        assert f"--nnodes 2 --node-rank {rank} --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:" in output
    world, total, _ = (workdir / "sum.txt").read_text().split()
    assert (world, total) == ("2", "3")  # one process per node, both in the all_reduce


@pytest.mark.e2e
@needs_generated_script
def test_the_generated_script_trains_as_a_two_node_job(tmp_path):
    results = start_nodes(2, "generated/train.py", ["--max_steps", "2", "--output_dir", str(tmp_path / "out")], REPO)
    assert [status for status, _ in results] == [0, 0], results
    assert "world_size=2" in "".join(output for _, output in results)
    assert [record["step"] for record in metric_lines(tmp_path / "out" / "metrics.jsonl")] == [1, 2]
    assert (tmp_path / "out" / "lora_adapter" / "adapter_config.json").exists()


def test_the_workers_read_end_of_file_not_the_terminals_input(tmp_path):
    # An open pipe on pipeline.py's stdin, never written to or closed: a worker reading it would wait forever.
    script = tmp_path / "reads_stdin.py"
    script.write_text("import os, sys\nprint(f\"rank {os.environ['RANK']} read {sys.stdin.readline()!r}\", flush=True)\n")
    command = [sys.executable, "pipeline.py", "launch", "--nproc-per-node", "2", "--script", str(script)]
    with subprocess.Popen(command, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as process:
        try:
            status = process.wait(timeout=120)
        finally:
            process.terminate()  # pipeline.py stops torchrun and its workers, and waits for them
            process.wait(timeout=60)
        output = process.stdout.read()
    assert status == 0
    assert "rank 0 read ''" in output and "rank 1 read ''" in output
