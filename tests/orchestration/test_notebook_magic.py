"""`%load_ext nbddp` / `%nbddp ...`: the CLI from a notebook, in a child process started in the project root, its
output streamed into the cell, a failure shown as an error, an interrupt passed on; the kernel never imports torch."""
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import nbformat
import pytest

from nbddp import cli
from nbddp.orchestration import notebook_magic
from nbddp.orchestration.notebook_magic import CommandFailed, nbddp_magic, project_root
from nbddp.orchestration.smoke.kernel import write_kernelspec

REPO = Path(__file__).parents[2]
NBDDP = [sys.executable, "-m", "nbddp"]
WAIT_BOUND_S = 120  # for a child to start, or to end on a signal, on a busy machine


class Children:
    """The commands the magic streams (`streamed`) and its `export --check` runs (`checked`, answered with
    `check_status`), as (command, working directory)."""

    def __init__(self):
        self.streamed, self.checked, self.check_status = [], [], 0

    def check(self, command, cwd, **kwargs):
        self.checked.append((command, cwd))
        return subprocess.CompletedProcess(command, self.check_status, "generated files are stale\n")


@pytest.fixture
def children(monkeypatch):
    """Record the magic's children instead of starting them."""
    calls = Children()
    monkeypatch.setattr(notebook_magic, "stream", lambda command, cwd: calls.streamed.append((command, cwd)) or 0)
    monkeypatch.setattr(notebook_magic.subprocess, "run", calls.check)
    return calls


def test_it_runs_in_the_parent_of_a_notebooks_folder_and_elsewhere_where_the_kernel_is(tmp_path):
    assert project_root(tmp_path / "job" / "notebooks") == tmp_path / "job"
    assert project_root(tmp_path / "job" / "experiments") == tmp_path / "job" / "experiments"
    assert project_root(tmp_path / "job") == tmp_path / "job"


def test_run_exports_first_when_the_notebooks_changed(tmp_path, monkeypatch, children):
    (tmp_path / "notebooks").mkdir()
    monkeypatch.chdir(tmp_path / "notebooks")
    children.check_status = 1  # stale
    nbddp_magic("run --nproc-per-node 4 -p max_steps 100 --set 'learning_rate=1e-4'")
    assert children.checked == [([*NBDDP, "export", "--check"], tmp_path)]
    assert children.streamed == [([*NBDDP, "export"], tmp_path),
                                 ([*NBDDP, "run", "--nproc-per-node", "4", "-p", "max_steps", "100", "--set",
                                   "learning_rate=1e-4"], tmp_path)]


def test_a_fresh_export_another_script_help_and_export_itself_run_only_the_command(tmp_path, monkeypatch, children):
    monkeypatch.chdir(tmp_path)
    nbddp_magic("smoke -p max_steps 3")  # fresh: the check passes
    assert len(children.checked) == 1
    children.check_status = 1
    for line in ["run --script out/train.py", "launch --script=out/train.py", "run --help", "export --check",
                 "regress --only a"]:
        nbddp_magic(line)
    assert len(children.checked) == 1
    assert [command[3:] for command, cwd in children.streamed] == [
        ["smoke", "-p", "max_steps", "3"], ["run", "--script", "out/train.py"], ["launch", "--script=out/train.py"],
        ["run", "--help"], ["export", "--check"], ["regress", "--only", "a"]]
    assert {cwd for command, cwd in children.streamed} == {tmp_path}


def test_help_is_the_clis_and_says_what_the_magic_needs(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    nbddp_magic("--help")
    out = capfd.readouterr().out
    assert out.startswith("usage: nbddp [-h] [--version]")
    assert "python pipeline.py run                      export check -> smoke -> launch" in out
    assert "the notebook saved (export reads the .ipynb on disk)" in out
    assert "memory this kernel holds is not\nfree for the ranks, so free it" in out
    assert "or restart the kernel" in out


def test_a_failing_command_shows_its_output_then_one_line_of_error(tmp_path, monkeypatch, capfd):
    from IPython.core.interactiveshell import InteractiveShell

    monkeypatch.chdir(tmp_path)
    shell = InteractiveShell.instance()
    try:
        shell.run_line_magic("load_ext", "nbddp")
        result = shell.run_cell("%nbddp launch --script train.py --nproc-per-node 0")
    finally:
        InteractiveShell.clear_instance()
    assert isinstance(result.error_in_exec, CommandFailed) and result.error_in_exec.returncode == 2
    out, err = capfd.readouterr()
    shown = out + err
    child = "error: --nproc-per-node 0: expected a positive number of processes or 'auto'"
    failure = ("CommandFailed: `nbddp launch --script train.py --nproc-per-node 0` exited with status 2; "
               "its output is above")
    assert child in shown and failure in shown, shown
    assert shown.index(child) < shown.index(failure)
    assert "Traceback" not in shown, shown


def test_a_failing_check_is_shown_and_nothing_else_runs(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)  # no notebooks/: export has nothing to read
    with pytest.raises(CommandFailed, match=r"`nbddp export --check` exited with status 2"):
        nbddp_magic("run")
    assert f"error: notebooks: no such folder ({tmp_path / 'notebooks'})" in capfd.readouterr().out
    assert not (tmp_path / "runs").exists()


@pytest.fixture
def interrupt_raises():
    """SIGINT raises KeyboardInterrupt here, as in a kernel, however pytest was started: a job started in the
    background (`nohup pytest &`) inherits SIGINT ignored, and Python then installs no handler for it."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_an_interrupt_reaches_the_child_which_ends_before_it_goes_on(tmp_path, capfd, interrupt_raises):
    ready = tmp_path / "ready"
    # The child sets its own handler, says it trains, then waits for the signal;
    # the bound only ends a child that never gets one.
    child = ("import pathlib, signal, sys, time\n"
             "def stop(signum, frame):\n"
             "    print('child: stopped by SIGINT; resume from checkpoint-2', flush=True)\n"
             "    sys.exit(130)\n"
             "signal.signal(signal.SIGINT, stop)\n"
             "print('child: training', flush=True)\n"
             f"pathlib.Path({str(ready)!r}).touch()\n"
             f"time.sleep({WAIT_BOUND_S})\n")

    def press_interrupt():  # the kernel's interrupt button: SIGINT to the kernel (its process group, here ours)
        deadline = time.monotonic() + WAIT_BOUND_S
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=press_interrupt, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        notebook_magic.stream([sys.executable, "-c", child], tmp_path)
    # the child's last words prove the signal ended it, not the bound
    assert capfd.readouterr().out == "child: training\nchild: stopped by SIGINT; resume from checkpoint-2\n"


def test_the_magic_loads_no_torch_libcst_or_export_code():
    code = ("import sys\nfrom IPython.core.interactiveshell import InteractiveShell\n"
            "InteractiveShell.instance().run_line_magic('load_ext', 'nbddp')\n"
            "print(sorted(m for m in ('torch', 'libcst', 'jupytext', 'papermill', 'nbddp.export')\n"
            "             if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.e2e
def test_a_notebook_runs_the_job_on_two_processes_from_its_kernel(tmp_path, monkeypatch):
    from nbclient import NotebookClient

    project = tmp_path / "job"
    assert cli.main(["new", str(project)]) == 0
    stage = project / "notebooks" / "03_train.ipynb"
    stage.write_text(stage.read_text().replace("warmup_steps = 10", "warmup_steps = 1"))  # just edited and saved
    notebook = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("%load_ext nbddp"),
        nbformat.v4.new_code_cell("%nbddp run --nproc-per-node 2 --device cpu -p max_steps 2"),
        nbformat.v4.new_code_cell("import sys\n"
                                  "print(sorted(m for m in ('torch', 'libcst', 'nbddp.export') if m in sys.modules))"),
    ])
    monkeypatch.setenv("JUPYTER_PATH", str(write_kernelspec(tmp_path / "jupyter")))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    monkeypatch.delenv("NBDDP_LOG_LEVEL", raising=False)
    NotebookClient(notebook, timeout=170, kernel_name="python3",
                   resources={"metadata": {"path": str(project / "notebooks")}}).execute()
    shown = "".join(output.get("text", "") for output in notebook.cells[1].outputs)
    assert "nbddp: the notebooks changed since the last export; exporting first" in shown
    assert "warmup_steps = 1\n" in (project / "generated" / "train.py").read_text()
    assert "nbddp: step 3/3 (100%)" in shown and "smoke: ok" in shown, shown  # the smoke run's steps
    assert "[default0]:nbddp: step 2/2 (100%)" in shown, shown  # the training run's, from rank 0
    assert f"run: done; everything is in {project / 'runs'}" in shown, shown
    assert notebook.cells[2].outputs[0]["text"] == "[]\n"  # the kernel imported neither torch nor export code
