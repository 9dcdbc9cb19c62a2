import json
import os
import subprocess
import sys
import textwrap

import pytest

from nbddp.runtime.reporting import tracebacks

# A generated-looking script: nbddp's setup cell, then a notebook cell whose second line raises.
SCRIPT = textwrap.dedent(
    """\
    # %% nbddp setup
    from nbddp import runtime
    backend = "hf"
    ddp = runtime.setup(backend=backend, script=globals().get("__file__"))

    # %% 03_train.ipynb cell 4
    rows = [1, 2, 3]
    print(rows[10])
    """
)
SOURCEMAP = {
    "script": "train.py",
    "cells": [
        {"title": "nbddp setup", "first_line": 2, "origin": [None, None, None]},
        {"title": "03_train.ipynb cell 4", "first_line": 7, "origin": [["notebooks/03_train.ipynb", 4, 1], ["notebooks/03_train.ipynb", 4, 2]]},
    ],
}


# The same lines with only the hook that setup installs (tracebacks.install), without setup's imports of torch and
# transformers: a child in a second instead of several. test_uncaught_error_names_the_notebook_cell runs the real setup.
HOOK_ONLY_SCRIPT = SCRIPT.replace('ddp = runtime.setup(backend=backend, script=globals().get("__file__"))',
                                  "from nbddp.runtime.reporting import tracebacks; tracebacks.install(__file__)")


def run_script(directory, with_sourcemap=True, sourcemap_text=None, text=HOOK_ONLY_SCRIPT):
    script = directory / "train.py"
    script.write_text(text)
    if with_sourcemap:
        (directory / "train.sourcemap.json").write_text(sourcemap_text or json.dumps(SOURCEMAP))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=directory, timeout=120)


def test_uncaught_error_names_the_notebook_cell(tmp_path):
    result = run_script(tmp_path, text=SCRIPT)  # the generated script's setup installs the hook
    assert result.returncode == 1
    assert "IndexError: list index out of range" in result.stderr
    assert "Traceback (most recent call last)" in result.stderr
    assert "nbddp: train.py line 8 comes from notebooks/03_train.ipynb, cell 4, line 2" in result.stderr
    assert result.stderr.count("Traceback") == 1  # printed once
    assert "[rank" not in result.stderr


def test_without_a_sourcemap_only_the_traceback(tmp_path):
    result = run_script(tmp_path, with_sourcemap=False)
    assert "IndexError: list index out of range" in result.stderr
    assert "comes from" not in result.stderr


def test_a_malformed_sourcemap_leaves_the_traceback_and_says_so(tmp_path):
    result = run_script(tmp_path, sourcemap_text='{"cells": [')
    assert result.returncode == 1
    assert "Error in sys.excepthook" not in result.stderr  # the hook itself did not fail
    assert result.stderr.count("Traceback") == 1
    assert "IndexError: list index out of range" in result.stderr
    assert result.stderr.rstrip().splitlines()[-1].startswith("nbddp: could not read the source map train.sourcemap.json: not JSON")


def raise_in(script, line):
    """Raise from code compiled as if it were `line` of `script`, like a frame of the generated script."""
    code = compile("\n" * (line - 1) + "raise ValueError('bad value')", str(script), "exec")
    try:
        exec(code, {})
    except ValueError as error:
        return error


def test_lines_nbddp_wrote_are_named_as_such(tmp_path):
    script = tmp_path / "train.py"
    (tmp_path / "train.sourcemap.json").write_text(json.dumps(SOURCEMAP))
    error = raise_in(script, 3)
    report = tracebacks.format_report(type(error), error, error.__traceback__, str(script))
    assert "line 3 was written by nbddp (cell 'nbddp setup')" in report


def test_every_line_carries_the_rank_when_torchrun_runs_several(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    script = tmp_path / "train.py"
    (tmp_path / "train.sourcemap.json").write_text(json.dumps(SOURCEMAP))
    error = raise_in(script, 7)
    report = tracebacks.format_report(type(error), error, error.__traceback__, str(script))
    lines = report.splitlines()
    assert all(line.startswith("[rank 1] ") for line in lines)
    assert lines[-1].endswith("comes from notebooks/03_train.ipynb, cell 4, line 1")


def test_a_rank_that_lost_its_peer_says_where_it_waited_without_a_traceback(tmp_path, monkeypatch):
    # rank 0 stopped on bad input inside main_process_first: rank 1's barrier fails, and rank 0's report says why
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    script = tmp_path / "train.py"
    (tmp_path / "train.sourcemap.json").write_text(json.dumps(SOURCEMAP))
    code = compile("\n" * 6 + "raise RuntimeError('[pair.cc:534] Connection closed by peer [127.0.0.1]:5\\nmore')",
                   str(script), "exec")
    try:
        exec(code, {})
    except RuntimeError as raised:
        error = raised
    report = tracebacks.format_report(type(error), error, error.__traceback__, str(script))
    assert report.splitlines() == [
        "[rank 1] nbddp: stopped: another rank ended while this one waited for it (RuntimeError: [pair.cc:534] "
        "Connection closed by peer [127.0.0.1]:5)",
        report.splitlines()[1],
    ]
    assert report.splitlines()[1].endswith("train.py line 7 comes from notebooks/03_train.ipynb, cell 4, line 1")


def test_a_map_of_the_wrong_shape_is_named_after_the_traceback(tmp_path):
    script = tmp_path / "train.py"
    (tmp_path / "train.sourcemap.json").write_text(json.dumps({"cells": [{"title": "x", "first_line": 1, "origin": [[1]]}]}))
    error = raise_in(script, 7)
    report = tracebacks.format_report(type(error), error, error.__traceback__, str(script))
    assert "ValueError: bad value" in report
    assert report.splitlines()[-1].startswith("nbddp: could not read the source map ")
    assert report.splitlines()[-1].endswith('train.sourcemap.json: cell 0 is not {"title": str, "first_line": int, "origin": [...]}')


def test_an_unreadable_map_is_named_after_the_traceback(tmp_path):
    script = tmp_path / "train.py"
    (tmp_path / "train.sourcemap.json").mkdir()  # open() raises IsADirectoryError
    error = raise_in(script, 7)
    report = tracebacks.format_report(type(error), error, error.__traceback__, str(script))
    assert "ValueError: bad value" in report and "could not read the source map" in report.splitlines()[-1]


def test_bad_input_is_one_paragraph_and_exit_status_2(tmp_path):
    # The notebook cell's second line raises nbddp's DataError, as require_fields does for a bad row.
    script = tmp_path / "train.py"
    script.write_text(HOOK_ONLY_SCRIPT.replace(
        "print(rows[10])", "from nbddp.errors import DataError; raise DataError('data/x.jsonl row 17: missing \"output\"')"))
    (tmp_path / "train.sourcemap.json").write_text(json.dumps(SOURCEMAP))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert result.returncode == 2
    assert result.stderr.splitlines()[-2:] == [
        'nbddp: error: data/x.jsonl row 17: missing "output"',
        "  train.py line 8 comes from notebooks/03_train.ipynb, cell 4, line 2",
    ]
    assert "Traceback" not in result.stderr and "Error in sys.excepthook" not in result.stderr


def test_bad_input_from_several_ranks_carries_the_rank(tmp_path, monkeypatch):
    from nbddp.errors import UsageError

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    error = UsageError("model 'models/x': no such directory")
    report = tracebacks.format_report(UsageError, error, None, str(tmp_path / "train.py"))
    assert report == "[rank 1] nbddp: error: model 'models/x': no such directory\n"


def test_under_torchrun_the_report_also_goes_to_the_rank_error_file(tmp_path):
    # torchrun's agent names this file per worker; its failure summary and nbddp's failure report read it.
    script = tmp_path / "train.py"
    script.write_text(HOOK_ONLY_SCRIPT)
    (tmp_path / "train.sourcemap.json").write_text(json.dumps(SOURCEMAP))
    error_file = tmp_path / "error.json"
    env = {**os.environ, "TORCHELASTIC_ERROR_FILE": str(error_file)}
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, env=env,
                            timeout=120)
    assert result.returncode == 1
    message = json.loads(error_file.read_text())["message"]
    assert message["message"] == "IndexError: list index out of range"
    assert message["extraInfo"]["py_callstack"] in result.stderr  # the very report printed
    assert message["extraInfo"]["py_callstack"].endswith("comes from notebooks/03_train.ipynb, cell 4, line 2\n")
    assert int(message["extraInfo"]["timestamp"]) > 0


def test_without_torchrun_no_error_file_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    monkeypatch.chdir(tmp_path)
    tracebacks.write_error_file(ValueError, ValueError("x"), "report")
    assert list(tmp_path.iterdir()) == []


# An object that prints when the interpreter's finalization clears module globals.
FINALIZATION_WITNESS = textwrap.dedent(
    """\
    import atexit
    import os
    import sys

    class Witness:
        def __del__(self, write=os.write):  # module globals are gone by then: bind what it needs
            write(1, b"finalized\\n")

    witness = Witness()
    atexit.register(lambda: print("atexit ran", flush=True))
    """
)


def test_an_uncaught_error_in_a_gloo_run_skips_finalization_with_status_1(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(FINALIZATION_WITNESS + textwrap.dedent(
        f"""\
        import torch.distributed as dist
        from nbddp.runtime.reporting import tracebacks
        if sys.argv[1] == "gloo":
            dist.init_process_group("gloo", init_method="file://{tmp_path / 'store'}", rank=0, world_size=1)
        tracebacks.install(__file__)
        raise ValueError("boom")
        """))
    gloo = subprocess.run([sys.executable, str(script), "gloo"], capture_output=True, text=True, timeout=120)
    plain = subprocess.run([sys.executable, str(script), "none"], capture_output=True, text=True, timeout=120)
    assert gloo.returncode == plain.returncode == 1
    assert "ValueError: boom" in gloo.stderr and "ValueError: boom" in plain.stderr
    assert "atexit ran" in gloo.stdout and "atexit ran" in plain.stdout
    assert "finalized" not in gloo.stdout  # gloo: the process ended before finalization
    assert "finalized" in plain.stdout  # without a group: the usual interpreter exit


def test_a_known_ddp_cause_gets_a_line_saying_what_to_do(tmp_path):
    try:
        raise RuntimeError("Expected to have finished reduction in the prior iteration before starting a new one.")
    except RuntimeError as error:
        report = tracebacks.format_report(type(error), error, error.__traceback__, str(tmp_path / "train.py"))
    assert report.splitlines()[-1].startswith("nbddp: hint: under DDP every trainable parameter must get a gradient")
    assert "static_graph=True" in report and "--set ddp_find_unused_parameters=true" in report
    try:
        raise RuntimeError("something else")
    except RuntimeError as error:
        assert "nbddp: hint" not in tracebacks.format_report(type(error), error, error.__traceback__, "train.py")


def test_a_missing_package_gets_a_line_saying_where_to_install_it(tmp_path):
    try:
        import nbddp_no_such_package  # noqa: F401
    except ModuleNotFoundError as error:
        report = tracebacks.format_report(type(error), error, error.__traceback__, str(tmp_path / "train.py"))
    assert report.splitlines()[-1].startswith("nbddp: hint: `nbddp_no_such_package` is not installed where this script")
    assert "export leaves out" in report
    try:
        import vllm.sampling_params  # noqa: F401  (not installed on the CPU stacks)
    except ModuleNotFoundError as error:
        report = tracebacks.format_report(type(error), error, error.__traceback__, str(tmp_path / "train.py"))
    assert "runs on CUDA GPUs only: pip install vllm on a GPU host" in report.splitlines()[-1]
    error = ImportError("cannot import name 'x'")  # an installed package without the name: no install hint
    assert "nbddp: hint" not in tracebacks.format_report(type(error), error, None, "train.py")


def test_files_missing_from_an_offline_hub_cache_get_a_line_saying_how_to_fetch_them(tmp_path):
    try:
        raise OSError("Cannot find an appropriate cached snapshot folder for the specified revision on the local disk "
                      "and outgoing traffic has been disabled. To enable repo look-ups and downloads online, set "
                      "'HF_HUB_OFFLINE=0' as environment variable.")
    except OSError as error:
        report = tracebacks.format_report(type(error), error, error.__traceback__, str(tmp_path / "train.py"))
    assert report.splitlines()[-1].startswith("nbddp: hint: the Hugging Face hub is offline here")
    assert "`hf download <repo id>`" in report


def test_a_rank_that_exits_by_itself_says_so_with_its_status_and_cell(tmp_path, monkeypatch, capsys):
    import builtins

    from nbddp import patches

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(tracebacks.atexit, "register", lambda function: None)  # no process group: nothing to end
    script = tmp_path / "train.py"
    (tmp_path / "train.sourcemap.json").write_text(json.dumps(SOURCEMAP))
    tracebacks.install_exits(str(script))
    try:
        assert sys.exit is builtins.exit is builtins.quit
        code = compile("\n" * 6 + "import sys; sys.exit(3)", str(script), "exec")
        with pytest.raises(SystemExit) as exited:
            exec(code, {})
        asked = tracebacks._exiting[0]  # the status the rank ends with at exit, before finalization
    finally:
        patches.undo()
        monkeypatch.setattr(tracebacks, "_exiting", [None])
    assert exited.value.code == 3 and asked == 3
    err = capsys.readouterr().err
    assert err.startswith("[rank 1] nbddp: this rank ends here with status 3 while the other ranks go on (they stop "
                          "at their next collective); ")
    assert err.rstrip().endswith("train.py line 7 comes from notebooks/03_train.ipynb, cell 4, line 1")
