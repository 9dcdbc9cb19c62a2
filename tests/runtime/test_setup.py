"""`runtime.setup` and what `from nbddp import runtime` imports (nbddp/runtime/__init__.py)."""
import builtins
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from nbddp import patches, runtime
from nbddp.errors import UsageError
from nbddp.runtime.inputs import flags
from nbddp.runtime.context import DistributedContext


@pytest.fixture
def cpu_script_mode(monkeypatch):
    """One CPU process run as a script; what setup changes in this interpreter is undone afterwards."""
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    monkeypatch.delitem(sys.modules, "unsloth", raising=False)
    monkeypatch.delitem(sys.modules, "unsloth.chat_templates", raising=False)
    had_display = builtins.__dict__.pop("display", None)  # a script has none
    yield
    patches.undo()
    if had_display is not None:
        builtins.display = had_display


def test_setup_reports_backend_and_world(cpu_script_mode, capsys):
    ddp = runtime.setup(backend="auto", script=None)
    assert isinstance(ddp, DistributedContext) and ddp.world_size == 1
    strategy, backend, patched = capsys.readouterr().out.splitlines()
    assert strategy == "nbddp: --strategy auto: ddp: no CUDA GPU, and accelerate runs FSDP only on GPUs"
    assert backend == "nbddp: backend=hf (Transformers+PEFT fallback: no CUDA) strategy=ddp world_size=1 device=cpu"
    assert patched.startswith(f"nbddp: {len(patches.active())} patches of ")
    assert {"notebook-display", "unsloth-fallback-module", "trl-unsloth-arguments", "checkpoint-markers"} <= set(
        patches.active())
    assert sys.modules["unsloth"].FastLanguageModel


def test_setup_installs_the_excepthook_for_a_script(cpu_script_mode, tmp_path):
    before = sys.excepthook
    runtime.setup(backend="hf", script=str(tmp_path / "train.py"))
    assert sys.excepthook is not before


def test_script_mode_gets_a_display_that_prints(cpu_script_mode, capsys):
    runtime.setup(backend="hf", script=None)
    capsys.readouterr()
    exec("display({'rows': 3}, 'text', include=['text/plain'])", {})  # as a notebook cell calls it: bare
    assert capsys.readouterr().out == "{'rows': 3}\n'text'\n"


def test_a_display_already_there_is_kept(cpu_script_mode):
    def own_display(*objects, **options):
        pass

    builtins.display = own_display
    runtime.setup(backend="hf", script=None)
    assert builtins.display is own_display


def test_a_kernel_keeps_its_own_display(cpu_script_mode, monkeypatch):
    monkeypatch.setattr(runtime, "running_in_kernel", lambda: True)  # IPython's display is in the kernel's namespace
    runtime.setup(backend="hf", script=None)
    assert not hasattr(builtins, "display")


def test_unsloth_on_cpu_exits_2_in_script_mode(cpu_script_mode, capsys):
    with pytest.raises(SystemExit) as exit_info:
        runtime.setup(backend="unsloth", script=None)
    assert exit_info.value.code == 2
    assert "nbddp: error: --backend unsloth needs a CUDA GPU" in capsys.readouterr().err


def test_unsloth_on_cpu_raises_in_a_kernel(cpu_script_mode, monkeypatch, tmp_path):
    monkeypatch.setattr(runtime, "running_in_kernel", lambda: True)
    before = sys.excepthook
    with pytest.raises(UsageError):
        runtime.setup(backend="unsloth", script=str(tmp_path / "train.py"))
    assert sys.excepthook is before  # a kernel reports errors itself


def run_setup(log_level):
    """A fresh interpreter (this one has imported everything) that prints which heavy modules `from nbddp import
    runtime` loaded, runs the hf backend's setup as a generated script does, then prints which tools it loaded."""
    code = textwrap.dedent(
        """
        import sys
        from nbddp import runtime
        print(sorted(m for m in ("torch", "transformers", "trl") if m in sys.modules))
        runtime.setup(backend="hf", script=None)
        print(sorted(m for m in ("libcst", "jupytext", "papermill", "IPython") if m in sys.modules))
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "NBDDP_LOG_LEVEL": log_level})
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def setup_at_info():
    """One setup at the default log level, read by two tests (a child takes seconds of imports)."""
    return run_setup("INFO")


def test_imports_stay_light(setup_at_info):
    # `--help` answers before torch loads; Unsloth must be imported before transformers/trl/peft/datasets, which
    # only the hf backend's setup imports (to patch TRL); the runtime never loads the export or orchestration tools.
    assert setup_at_info.splitlines()[0] == "[]"
    assert setup_at_info.splitlines()[-1] == "[]"


def test_flags_module_is_what_the_package_exports():
    assert runtime.apply_flags is flags.apply_flags


def test_the_runtimes_info_lines_follow_nbddps_log_level(setup_at_info):
    # `pipeline.py launch -q` gives the workers NBDDP_LOG_LEVEL=WARNING: the runtime's `nbddp: ...` info lines go.
    assert "nbddp: backend=hf" in setup_at_info
    assert "nbddp: backend=hf" not in run_setup("WARNING")


def test_the_paths_notebooks_imported_before_the_rooms_still_import_the_same_modules():
    # Notebooks made by `nbddp new` earlier import e.g. `from nbddp.runtime.models import require_model`.
    import importlib

    for old, new in runtime.MOVED.items():
        assert importlib.import_module(old) is importlib.import_module(new)
    from nbddp.runtime.checkpointing import choose_gradient_checkpointing
    from nbddp.runtime.memory.gradient_checkpointing import choose_gradient_checkpointing as moved

    assert choose_gradient_checkpointing is moved
