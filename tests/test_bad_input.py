"""Bad input met at run time, end to end: each case exits 2 with one paragraph naming what and where, and writes
nothing. (Bad notebooks at export time: tests/test_export_command.py; flags: tests/runtime/test_flags.py.)"""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.export.stages import code, markdown, write_stage

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "generated" / "train.py"

_spec = importlib.util.spec_from_file_location("pipeline", REPO / "pipeline.py")
pipeline = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pipeline)

pytestmark = pytest.mark.e2e
needs_generated_script = pytest.mark.skipif(not SCRIPT.exists(), reason="generated/train.py is not exported")


def files_under(directory):
    return sorted(str(path.relative_to(directory)) for path in Path(directory).rglob("*"))


def run_script(*flags, cwd=REPO, script=SCRIPT, torchrun=False, env=None):
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1"] if torchrun else [sys.executable]
    environ = {**os.environ, "CUDA_VISIBLE_DEVICES": "", **(env or {})}
    return subprocess.run([*launcher, str(script), *flags], cwd=cwd, env=environ, capture_output=True, text=True, timeout=600)


def assert_one_paragraph(result, *expected):
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    for text in expected:
        assert text in result.stderr


@pytest.fixture
def no_parameters(tmp_path, monkeypatch):
    """A pipeline whose notebooks have no parameters cell, exported: its script knows only nbddp's --backend."""
    monkeypatch.chdir(tmp_path)
    write_stage(tmp_path / "notebooks", "01_only.ipynb", [markdown("# Only"), code("total = sum(range(4))\nprint(total)")])
    assert pipeline.main(["export"]) == 0
    return tmp_path


NO_PARAMETERS = "the notebooks define no parameters: tag a cell `parameters`"


def test_flags_for_a_script_without_parameters(no_parameters):
    before = files_under(no_parameters)
    result = run_script("--x", "1", cwd=no_parameters, script="generated/train.py")
    assert_one_paragraph(result, "unrecognized arguments: --x 1 (" + NO_PARAMETERS)
    assert files_under(no_parameters) == before


def test_flags_for_a_script_without_parameters_under_torchrun(no_parameters):
    result = run_script("--x", "1", cwd=no_parameters, script="generated/train.py", torchrun=True)
    # The worker exits 2; torchrun itself reports a failed worker with its own status 1.
    assert result.returncode == 1
    assert NO_PARAMETERS in result.stderr and "exitcode  : 2" in result.stderr


def test_smoke_parameters_for_a_script_without_parameters(no_parameters, capsys):
    assert pipeline.main(["smoke", "-p", "x", "1", "--device", "cpu"]) == 2
    assert "-p x: unknown parameter `x`: the notebooks define no parameters" in capsys.readouterr().err
    assert not (no_parameters / "runs").exists()


@pytest.fixture
def scratch(tmp_path):
    """An output_dir that must not appear, and caches kept out of the user's home."""
    return {"out": tmp_path / "out", "env": {"HF_DATASETS_CACHE": str(tmp_path / "datasets"), "NBDDP_CACHE": str(tmp_path / "models")}}


@needs_generated_script
def test_a_data_row_missing_a_field(tmp_path, scratch):
    rows = [json.loads(line) for line in (REPO / "data" / "tiny_instructions.jsonl").read_text().splitlines()][:300]
    del rows[16]["output"]
    data = tmp_path / "bad.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = run_script("--data_path", str(data), "--output_dir", str(scratch["out"]), env=scratch["env"])
    assert_one_paragraph(result, f'nbddp: error: {data} row 17: missing "output" (1 of 300 rows lack it)',
                         "comes from notebooks/01_data_prep.ipynb, cell ")
    assert not scratch["out"].exists() and not (tmp_path / "models").exists()


@needs_generated_script
def test_a_data_path_that_does_not_exist(scratch):
    result = run_script("--data_path", "../data/tiny_instruction.jsonl", "--output_dir", str(scratch["out"]), env=scratch["env"])
    assert_one_paragraph(result, "nbddp: error: data file '../data/tiny_instruction.jsonl': no such file "
                                 "(did you mean '../data/tiny_instructions.jsonl'?)",
                         "comes from notebooks/01_data_prep.ipynb, cell ")
    assert not scratch["out"].exists()


@needs_generated_script
def test_a_model_path_that_does_not_exist(scratch):
    result = run_script("--model_name", "../models/tyny-llama", "--output_dir", str(scratch["out"]), env=scratch["env"])
    assert_one_paragraph(result, "nbddp: error: model '../models/tyny-llama': no such directory (did you mean "
                                 "'../models/tiny-llama'?)",
                         "comes from notebooks/01_data_prep.ipynb, cell ")
    assert not scratch["out"].exists()


@needs_generated_script
def test_an_output_dir_that_cannot_be_written(tmp_path, scratch):
    (tmp_path / "file").write_text("")
    result = run_script("--output_dir", str(tmp_path / "file" / "out"), env=scratch["env"])
    assert_one_paragraph(result, f"nbddp: error: output_dir '{tmp_path / 'file' / 'out'}': {tmp_path / 'file'} is a file")
    assert "nbddp: backend=" not in result.stdout  # stopped before the runtime set up, so before any work
    assert files_under(tmp_path) == ["file"]


@needs_generated_script
def test_a_full_disk(tmp_path, scratch):
    result = run_script("--output_dir", str(scratch["out"]), env={**scratch["env"], "NBDDP_MIN_FREE_GIB": "1e12"})
    assert_one_paragraph(result, f"nbddp: error: output_dir '{scratch['out']}': only ", "less than 1e+12 GiB (NBDDP_MIN_FREE_GIB)")
    assert files_under(tmp_path) == []


@needs_generated_script
@pytest.mark.parametrize("flags, message", [
    (["--max_step", "3"], "unrecognized arguments: --max_step 3 (did you mean --max_steps?)"),
    (["--max_steps", "three"], "argument --max_steps: invalid int value: 'three'"),
])
def test_an_unknown_flag_or_a_wrongly_typed_value(tmp_path, flags, message):
    result = run_script(*flags, "--output_dir", str(tmp_path / "out"))
    assert_one_paragraph(result, message)
    assert files_under(tmp_path) == []


def test_an_output_dir_from_the_environment_that_cannot_be_written(no_parameters):
    # A script without an `output_dir` parameter trains into NBDDP_OUTPUT_DIR (ddp.output_dir): checked first too.
    (no_parameters / "file").write_text("")
    before = files_under(no_parameters)
    result = run_script(cwd=no_parameters, script="generated/train.py",
                        env={"NBDDP_OUTPUT_DIR": str(no_parameters / "file" / "out")})
    assert_one_paragraph(result, f"nbddp: error: NBDDP_OUTPUT_DIR '{no_parameters / 'file' / 'out'}': "
                                 f"{no_parameters / 'file'} is a file, not a directory")
    assert result.stdout == "" and files_under(no_parameters) == before


@needs_generated_script
def test_a_dtype_that_is_none_of_the_models(tmp_path):
    result = run_script("--dtype", "float17", "--output_dir", str(tmp_path / "out"))
    assert_one_paragraph(result, "argument --dtype: expected None (auto detection) or one of float16, bfloat16, "
                                 "float32, not 'float17'")
    assert files_under(tmp_path) == []


@needs_generated_script
@pytest.mark.parametrize("timeout", ["abc", "0", "-5"])
def test_a_process_group_timeout_that_is_no_number_of_seconds(scratch, timeout):
    result = run_script("--max_steps", "1", "--output_dir", str(scratch["out"]),
                        env={**scratch["env"], "NBDDP_TIMEOUT_S": timeout})
    assert_one_paragraph(result, f"nbddp: error: NBDDP_TIMEOUT_S='{timeout}': expected a number of seconds above 0")
    assert not scratch["out"].exists()


@needs_generated_script
@pytest.mark.parametrize("setting", ["cuda_graphs", "one_launch_optimizer"])
def test_an_on_off_setting_that_is_neither_on_nor_off(scratch, setting):
    variable = f"NBDDP_{setting.upper()}"
    result = run_script("--max_steps", "1", "--output_dir", str(scratch["out"]),
                        env={**scratch["env"], variable: "sometimes"})
    assert_one_paragraph(result, f"nbddp: error: {variable}='sometimes': expected 1 or 0 (on or off): the run "
                                 f"setting `{setting}`")
    assert not scratch["out"].exists()


def launch_two(*flags, env=None):
    """`pipeline.py launch` of the generated script on 2 CPU processes."""
    command = [sys.executable, "pipeline.py", "launch", "--nproc-per-node", "2", "--", *flags]
    return subprocess.run(command, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
                          capture_output=True, text=True, timeout=600)


@needs_generated_script
@pytest.mark.parametrize("bad, why", [
    ('{"instruction": "Copy the words.", "input": "a b", "out', "not JSON (Unterminated string starting at: column"),
    ("[1, 2, 3]", "a JSON list, not an object"),
])
def test_a_data_line_that_is_no_json_object_on_two_processes(tmp_path, scratch, bad, why):
    lines = (REPO / "data" / "tiny_instructions.jsonl").read_text().splitlines()
    data = tmp_path / "bad.jsonl"
    data.write_text("\n".join([*lines[:1500], bad, *lines[1500:]]) + "\n")
    result = launch_two("--backend", "hf", "--data_path", str(data), "--output_dir", str(scratch["out"]),
                        env=scratch["env"])
    assert result.returncode == 1 and "exitcode  : 2" in result.stderr  # the worker exits 2, torchrun 1
    assert f"nbddp: error: {data}, line 1501: {why}" in result.stderr
    assert f"the line begins {bad[:60]!r}" in result.stderr
    assert "rank 0 failed: DataError: " in result.stderr
    assert f'File "{REPO / "nbddp"}' not in result.stderr and 'pipeline.py", line' not in result.stderr
    assert not scratch["out"].exists()
    assert not [proc for proc in Path("/proc").glob("[0-9]*/cmdline")
                if str(data).encode() in _read_or_empty(proc)]  # no worker outlived the job


def _read_or_empty(path):
    try:
        return path.read_bytes()
    except OSError:  # the process ended meanwhile
        return b""
