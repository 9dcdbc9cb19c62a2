import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from types import SimpleNamespace

import pytest
import torch

from nbddp.errors import UsageError
from nbddp.runtime import context, ddp_core, run_overrides
from nbddp.runtime.context import DistributedContext, init_distributed

TORCHRUN_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture
def single_process(monkeypatch):
    for name in TORCHRUN_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    return init_distributed()


def test_single_process_defines_the_same_names(single_process):
    ddp = single_process
    assert (ddp.rank, ddp.local_rank, ddp.world_size) == (0, 0, 1)
    assert ddp.device == torch.device("cpu") and not ddp.on_gpu
    assert ddp.is_main_process
    assert ddp.device_map() is None
    assert not torch.distributed.is_initialized()


def test_single_process_barriers_and_shutdown_are_harmless(single_process):
    ran = []
    with single_process.main_process_first():
        ran.append("block")
    single_process.barrier()
    single_process.shutdown()
    single_process.shutdown()
    assert ran == ["block"]


@pytest.mark.parametrize("backend, in_kernel, ends_process", [
    ("gloo", False, True),
    ("gloo", True, False),  # a kernel lives on; nothing of gloo is torn down at its exit
    ("nccl", False, False),  # destroy_process_group joins NCCL's own threads
])
def test_shutdown_ends_a_gloo_script_after_leaving_the_group(monkeypatch, backend, in_kernel, ends_process):
    calls = []
    monkeypatch.setattr(ddp_core.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(ddp_core.dist, "get_backend", lambda: backend)
    monkeypatch.setattr(ddp_core.dist, "barrier", lambda: calls.append("barrier"))
    monkeypatch.setattr(ddp_core.dist, "destroy_process_group", lambda: calls.append("destroy"))
    monkeypatch.setattr(ddp_core, "running_in_kernel", lambda: in_kernel)
    monkeypatch.setattr(ddp_core, "exit_without_finalization", lambda: calls.append("exit"))
    DistributedContext(world_size=2).shutdown()
    assert calls == ["barrier", "destroy"] + (["exit"] if ends_process else [])


class Stream:
    def __init__(self, name, calls, error=None):
        self.name, self.calls, self.error = name, calls, error

    def flush(self):
        self.calls.append(f"flush {self.name}")
        if self.error:
            raise self.error


@pytest.mark.parametrize("stdout_error, status", [(None, 0), (BrokenPipeError(), 120)])
def test_exit_without_finalization_does_what_exit_does_before_finalizing(monkeypatch, stdout_error, status):
    calls = []
    monkeypatch.setattr(ddp_core.threading, "_shutdown", lambda: calls.append("join threads"))
    monkeypatch.setattr(ddp_core.atexit, "_run_exitfuncs", lambda: calls.append("atexit"))
    monkeypatch.setattr(ddp_core.sys, "stdout", Stream("stdout", calls, stdout_error))
    monkeypatch.setattr(ddp_core.sys, "stderr", Stream("stderr", calls))
    monkeypatch.setattr(ddp_core.os, "_exit", lambda code: calls.append(f"exit {code}"))
    ddp_core.exit_without_finalization()
    assert calls == ["join threads", "atexit", "flush stdout", "flush stderr", f"exit {status}"]


def test_gpu_rank_places_the_model_on_its_own_device():
    ddp = DistributedContext(rank=3, local_rank=1, world_size=4, local_world_size=2, device=torch.device("cuda", 1))
    assert ddp.on_gpu and not ddp.is_main_process
    assert ddp.device_map() == {"": 1}
    assert ddp.gpu_only(True) is True and ddp.gpu_only("bf16") == "bf16"


def test_a_cells_last_value_is_displayed_once_by_the_main_process_unless_none(monkeypatch):
    import builtins

    shown = []
    monkeypatch.setattr(builtins, "display", shown.append, raising=False)
    main, other = DistributedContext(rank=0, world_size=2), DistributedContext(rank=1, world_size=2)
    for ddp in (main, other):
        ddp.show(["the generated text"])
        ddp.show(None)  # what a call that returns nothing gives: Jupyter shows nothing
        ddp.show(0)
    assert shown == [["the generated text"], 0]


@pytest.fixture
def two_ranks_of_one_machine(monkeypatch, tmp_path):
    """Two ranks' contexts in this process; their once-per-machine files in tmp_path, not the shared /tmp."""
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    return [DistributedContext(rank=rank, local_rank=rank, world_size=2, local_world_size=2) for rank in (0, 1)]


def test_shell_runs_a_command_as_ipython_does(single_process, tmp_path, capfd, monkeypatch):
    monkeypatch.setenv("SHELL", "/bin/bash")  # IPython runs $SHELL -c; /bin/sh would put `&>` in the background
    single_process.shell(f"(sleep 0.2; echo fetched > {tmp_path / 'a'}) &> /dev/null; [[ -f {tmp_path / 'a'} ]] && echo done"
                         "; echo warning >&2")
    assert (tmp_path / "a").read_text() == "fetched\n"
    assert capfd.readouterr() == ("done\n", "warning\n")


def test_shell_leaves_a_background_server_running_and_reads_no_input(single_process, capfd, tmp_path):
    started = time.monotonic()
    # `!nohup ollama serve &`: the cell ends, the server runs on (a minute: far longer than a busy machine's start)
    single_process.shell(f"sleep 60 & echo $! > {tmp_path / 'pid'}; echo started")
    server = int((tmp_path / "pid").read_text())
    try:
        assert time.monotonic() - started < 30
        os.kill(server, 0)  # still running
    finally:
        os.kill(server, signal.SIGKILL)
    assert capfd.readouterr().out == "started\n"
    single_process.shell("read answer")  # a prompt gets end of input at once, not a silent wait
    assert "`!read answer` exited with status 1" in capfd.readouterr().err


def test_a_failing_command_is_named_as_written_not_with_the_values_filled_in(single_process, capfd):
    single_process.shell("exit 7 # Bearer {token}", {"token": "hf_SECRET"})
    assert capfd.readouterr().err == ("nbddp: warning: `!exit 7 # Bearer {token}` exited with status 7; the script "
                                      "goes on, as a notebook does\n")


@pytest.mark.parametrize(
    "command, expected",
    [
        ("echo {name}-{n + 1}", "data.json-3"),  # filled in from the variables
        ("echo $name $$HOME", "data.json $HOME"),  # `$$` is IPython's escape for `$`
        ("echo data/{pdf,txt}", "data/{pdf,txt}"),  # not Python that runs: left for the shell (sh has no brace expansion)
        ("echo $HOME_OF_NOBODY-{name}", "-{name}"),  # one failure leaves the command as written; the shell expands $VAR
    ],
)
def test_shell_fills_in_variables_as_ipython_does(single_process, capfd, monkeypatch, command, expected):
    monkeypatch.setenv("SHELL", "/bin/sh")
    monkeypatch.setenv("HOME", "/home/x")
    single_process.shell(command, {"name": "data.json", "n": 2})
    assert capfd.readouterr().out == expected.replace("$HOME", "/home/x") + "\n"


def test_shell_runs_once_per_machine_each_time_a_rank_asks_again(two_ranks_of_one_machine, tmp_path):
    rank0, rank1 = two_ranks_of_one_machine
    log = tmp_path / "log"
    fetch, other = f"echo fetch >> {log}", f"echo other >> {log}"
    rank0.shell(fetch)
    rank1.shell(fetch)  # rank 1 gets there after rank 0 has run it
    rank1.shell(fetch)  # rank 1 first this time, at the command's second run (a loop, say)
    rank0.shell(other)
    rank0.shell(fetch)  # rank 0's second run of it: rank 1 has done that one
    assert log.read_text().splitlines() == ["fetch", "fetch", "other"]


def test_a_rank_that_asks_while_another_runs_the_command_waits_for_it(tmp_path):
    # Two ranks of one machine, started together: one runs the slow download, the other waits, then finds the file.
    worker = textwrap.dedent(f"""\
        import os, sys
        from nbddp.runtime.context import DistributedContext
        rank = int(sys.argv[1])
        ddp = DistributedContext(rank=rank, local_rank=rank, world_size=2, local_world_size=2)
        ddp.shell("sleep 1 && echo $$ >> {tmp_path / 'log'} && touch {tmp_path / 'fetched'}")
        print(os.path.exists("{tmp_path / 'fetched'}"))
        """)
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # the once-per-machine files, away from the shared /tmp
    ranks = [subprocess.Popen([sys.executable, "-c", worker, str(rank)], env=env, stdout=subprocess.PIPE, text=True)
             for rank in (0, 1)]
    assert [rank.communicate(timeout=60)[0] for rank in ranks] == ["True\n", "True\n"]
    assert len((tmp_path / "log").read_text().splitlines()) == 1


def test_a_failing_command_goes_on_as_in_a_notebook(single_process, tmp_path, capfd):
    # `!git clone` again after the smoke run (or the run before) made the folder: it fails, the run goes on.
    clone = f"mkdir {tmp_path / 'OpenEnv'} && echo cloned"
    single_process.shell(clone)
    single_process.shell(clone)
    out, err = capfd.readouterr()
    assert out == "cloned\n"
    assert err.count("exited with status 1; the script goes on") == 1


def test_a_failing_command_still_runs_once_per_machine(two_ranks_of_one_machine, tmp_path, capfd):
    for rank in two_ranks_of_one_machine:  # the second rank finds it done, failed or not: it does not retry
        rank.shell(f"echo tried >> {tmp_path / 'log'}; exit 3")
    assert (tmp_path / "log").read_text() == "tried\n"
    assert capfd.readouterr().err.count("exited with status 3") == 1


def test_write_file_writes_once_per_machine_and_says_so_as_ipython_does(two_ranks_of_one_machine, tmp_path, capsys):
    rank0, rank1 = two_ranks_of_one_machine
    path = tmp_path / "export_model.py"
    rank0.write_file(str(path), "import os\n")
    rank1.write_file(str(path), "import os\n")
    rank0.write_file(str(path), "x = 1\n", append=True)
    assert path.read_text() == "import os\nx = 1\n"
    rank0.write_file(str(path), "y = 2\n")
    rank0.write_file(str(tmp_path / "new.txt"), "z\n", append=True)
    assert path.read_text() == "y = 2\n"
    assert capsys.readouterr().out.splitlines() == [f"Writing {path}", f"Appending to {path}", f"Overwriting {path}",
                                                    f"Writing {tmp_path / 'new.txt'}"]


def test_device_properties_on_cpu_have_what_memory_stats_cells_read(single_process):
    properties = single_process.device_properties()
    assert properties.name == "CPU (no GPU)" and properties.total_memory > 2 ** 30  # this host's memory
    # The rest of Unsloth's memory-stats cell runs without CUDA too.
    assert round(torch.cuda.max_memory_reserved() / properties.total_memory * 100, 3) == 0


def test_device_properties_on_a_gpu_are_its_own(monkeypatch):
    asked = []
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: asked.append(device) or "props")
    ddp = DistributedContext(rank=1, local_rank=1, world_size=2, device=torch.device("cuda", 1))
    assert ddp.device_properties() == "props" and asked == [torch.device("cuda", 1)]
    assert ddp.device_properties(0) == "props" and asked[1:] == [0]  # a device the notebook names, as written


def test_device_properties_of_any_device_on_cpu_are_the_stand_in(single_process):
    assert single_process.device_properties(1) == single_process.device_properties()


@pytest.mark.parametrize("cap, steps, expected", [(None, 60, 60), ("3", 60, 3), ("3", -1, 3), ("100", 60, 60),
                                                  (" 5", 60, 5)])
def test_max_steps_is_the_notebooks_unless_capped(monkeypatch, single_process, cap, steps, expected):
    if cap is None:
        monkeypatch.delenv("NBDDP_MAX_STEPS", raising=False)
    else:
        monkeypatch.setenv("NBDDP_MAX_STEPS", cap)
    assert single_process.max_steps(steps) == expected


def test_a_capped_run_says_so_once_per_call_on_the_main_process(monkeypatch, capsys):
    monkeypatch.setenv("NBDDP_MAX_STEPS", "3")
    DistributedContext(rank=1, world_size=2).max_steps(-1)
    DistributedContext().max_steps(-1)
    assert capsys.readouterr().err == ("nbddp: NBDDP_MAX_STEPS=3: training stops after 3 steps (the notebook says its "
                                       "epochs)\n")


def test_the_cap_holds_for_a_max_steps_given_with_set(monkeypatch):
    from transformers import TrainingArguments

    monkeypatch.setenv("NBDDP_MAX_STEPS", "3")  # a smoke run's: `run --set max_steps=500` trains 500 after it
    monkeypatch.setenv("NBDDP_SET", "max_steps=500")
    ddp = DistributedContext()
    config = ddp.training_args(TrainingArguments)(output_dir="out", use_cpu=True, report_to="none",
                                                  max_steps=ddp.max_steps(60))
    assert config.max_steps == 3


@pytest.mark.parametrize("cap", ["0", "three", "-2"])
def test_a_bad_cap_is_a_usage_error(monkeypatch, single_process, cap):
    monkeypatch.setenv("NBDDP_MAX_STEPS", cap)
    with pytest.raises(context.UsageError, match=f"NBDDP_MAX_STEPS='{cap}': expected a whole number of steps"):
        single_process.max_steps(60)


def test_output_dir_is_the_notebooks_unless_the_run_sets_one(monkeypatch, single_process):
    monkeypatch.delenv("NBDDP_OUTPUT_DIR", raising=False)
    assert single_process.output_dir("outputs") == "outputs"
    monkeypatch.setenv("NBDDP_OUTPUT_DIR", "runs/x-smoke")
    assert single_process.output_dir("outputs") == "runs/x-smoke"


def test_gpu_only_is_false_on_cpu(single_process):
    assert single_process.gpu_only(True) is False


@pytest.mark.parametrize("n, cpus, ranks, expected", [(8, 16, 2, 8), (8, 16, 4, 4), (8, 2, 4, 1), (0, 8, 1, 1), (None, 8, 1, None)])
def test_cap_num_proc(monkeypatch, n, cpus, ranks, expected):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cpus)))
    ddp = DistributedContext(local_world_size=ranks, world_size=ranks)
    assert ddp.cap_num_proc(n) == expected


def test_bitsandbytes_optimizer_falls_back_on_cpu_with_one_warning(single_process, capsys):
    assert single_process.optimizer("paged_adamw_8bit") == "adamw_torch"
    assert single_process.optimizer("paged_adamw_8bit") == "adamw_torch"
    assert capsys.readouterr().err.count("optim='paged_adamw_8bit' needs bitsandbytes and CUDA") == 1


def test_other_optimizers_pass_through(single_process, capsys):
    assert single_process.optimizer("adamw_torch_fused") == "adamw_torch_fused"
    assert capsys.readouterr().err == ""


def test_only_rank_zero_warns(capsys):
    ddp = DistributedContext(rank=1, world_size=2)
    assert ddp.optimizer("adamw_8bit") == "adamw_torch"
    assert capsys.readouterr().err == ""


def test_bitsandbytes_optimizer_kept_on_gpu_with_bitsandbytes(monkeypatch):
    monkeypatch.setattr(run_overrides.importlib.util, "find_spec", lambda name: object() if name == "bitsandbytes" else None)
    ddp = DistributedContext(device=torch.device("cuda", 0))
    assert ddp.optimizer("adamw_8bit") == "adamw_8bit"


def test_too_few_gpus_for_the_local_rank_is_a_usage_error(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "2")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(context.UsageError, match="--nproc_per_node 2 or fewer"):
        init_distributed()


WORKER = textwrap.dedent(
    """\
    import atexit, os, sys, time
    from nbddp.runtime.context import init_distributed

    ddp = init_distributed()

    def note(event):
        with open(sys.argv[1], "a") as log:
            log.write(f"{ddp.rank} {event}\\n")

    with ddp.main_process_first():
        note("enter")
        if ddp.local_rank == 0:
            time.sleep(1.0)  # rank 1 would enter now if it did not wait
        note("leave")
    # A notebook's `!command` as notebooks write it: under a condition that a rank arriving after the download
    # finds false, and in a block only rank 0 runs. Neither may leave the other rank waiting at the barrier.
    fetched = os.path.join(sys.argv[2], "fetched")
    if ddp.rank == 1:
        time.sleep(0.5)
    if not os.path.exists(fetched):
        ddp.shell(f"echo {ddp.rank} shell >> {sys.argv[1]} && touch {fetched}")
    if ddp.is_main_process:
        ddp.shell(f"echo 0 rank0-shell >> {sys.argv[1]}")
    ddp.barrier()
    note(f"after-barrier world_size={ddp.world_size} local_world_size={ddp.local_world_size} device={ddp.device}")

    from transformers import TrainingArguments  # Trainer must see the same world, over gloo

    args = TrainingArguments(output_dir=sys.argv[2], report_to=[])
    note(f"trainer world_size={args.world_size} parallel_mode={args.parallel_mode.value}")
    atexit.register(note, "atexit callbacks ran")
    ddp.shutdown()  # a gloo script ends here, without finalization
    note("after shutdown")
    """
)


@pytest.mark.e2e
def test_two_gloo_processes_take_turns_and_trainer_sees_them(tmp_path):
    worker, log = tmp_path / "worker.py", tmp_path / "events.log"
    worker.write_text(WORKER)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(worker), str(log), str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    events = log.read_text().splitlines()
    # Rank 0 may run the commands while rank 1 enters; each ran once, and nobody waited forever.
    assert sorted(event for event in events if "shell" in event) == ["0 rank0-shell", "0 shell"]
    events = [event for event in events if "shell" not in event]
    assert events[:4] == ["0 enter", "0 leave", "1 enter", "1 leave"]
    assert sorted(events[4:]) == [
        "0 after-barrier world_size=2 local_world_size=2 device=cpu",
        "0 atexit callbacks ran",
        "0 trainer world_size=2 parallel_mode=distributed",
        "1 after-barrier world_size=2 local_world_size=2 device=cpu",
        "1 atexit callbacks ran",
        "1 trainer world_size=2 parallel_mode=distributed",
    ]


def resumable_output(tmp_path):
    """An output_dir as a killed run leaves it: checkpoint-4 complete, checkpoint-8 half-written."""
    from nbddp.formats import checkpoint_markers

    for step in (4, 8):
        (tmp_path / f"checkpoint-{step}").mkdir()
    checkpoint_markers.mark_complete(tmp_path / "checkpoint-4", 4, world_size=1)
    return SimpleNamespace(args=SimpleNamespace(output_dir=str(tmp_path)))


def test_no_resume_unless_asked(tmp_path):
    trainer = resumable_output(tmp_path)
    assert DistributedContext().checkpoint_to_resume(trainer) is None
    assert (tmp_path / "checkpoint-8").exists()  # nothing is touched either


def test_resume_takes_the_last_complete_checkpoint_and_removes_incomplete_ones(tmp_path, capsys):
    trainer = resumable_output(tmp_path)
    assert DistributedContext(resume=True).checkpoint_to_resume(trainer) == str(tmp_path / "checkpoint-4")
    assert not (tmp_path / "checkpoint-8").exists()
    out = capsys.readouterr().out
    assert f"nbddp: removing {tmp_path / 'checkpoint-8'}: incomplete" in out
    assert f"nbddp: --resume: resuming from {tmp_path / 'checkpoint-4'} (step 4)" in out


def test_a_torchrun_restart_resumes_by_itself(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    for name in TORCHRUN_ENV:
        monkeypatch.delenv(name, raising=False)
    trainer = resumable_output(tmp_path)
    assert init_distributed().checkpoint_to_resume(trainer) == str(tmp_path / "checkpoint-4")
    assert "nbddp: torchrun restart 1: resuming from" in capsys.readouterr().out


def test_resume_without_a_complete_checkpoint_starts_over_and_says_so(tmp_path, capsys):
    trainer = SimpleNamespace(args=SimpleNamespace(output_dir=str(tmp_path / "outputs")))
    assert DistributedContext(resume=True).checkpoint_to_resume(trainer) is None
    assert f"no complete checkpoint in {tmp_path / 'outputs'}; training from the start" in capsys.readouterr().out


def test_a_checkpoint_from_another_world_size_is_resumed_with_a_warning(tmp_path, capsys):
    trainer = resumable_output(tmp_path)  # its marker predates global_batch
    DistributedContext(world_size=2, resume=True).checkpoint_to_resume(trainer)  # no group: nothing to broadcast
    assert "was written by 1 processes, this run has 2" in capsys.readouterr().err


def laid_out_output(tmp_path, global_batch):
    from nbddp.formats import checkpoint_markers
    from nbddp.runtime.memory.batch_plan import plan

    (tmp_path / "checkpoint-4").mkdir()
    checkpoint_markers.mark_complete(tmp_path / "checkpoint-4", 4, world_size=1, global_batch=global_batch)
    return SimpleNamespace(args=SimpleNamespace(output_dir=str(tmp_path), nbddp_batch_plan=plan(2, 4, 2, "notebook")))


def test_the_same_global_batch_on_other_processes_resumes_quietly(tmp_path, capsys):
    trainer = laid_out_output(tmp_path, global_batch=8)
    assert DistributedContext(world_size=2, resume=True).checkpoint_to_resume(trainer) == str(tmp_path / "checkpoint-4")
    assert capsys.readouterr().err == ""


def test_a_checkpoint_of_another_global_batch_is_refused(tmp_path):
    trainer = laid_out_output(tmp_path, global_batch=16)  # e.g. written under --batch_layout per-device
    with pytest.raises(UsageError, match=r"checkpoint-4 was trained with a global batch of 16 rows per step, this "
                                         r"run's is 8 .*resuming would change the training in mid-run"):
        DistributedContext(world_size=2, resume=True).checkpoint_to_resume(trainer)
