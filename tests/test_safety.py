"""Safety: parameter values are literals and never code, no shell but for a notebook's own `!command`, and no remote
model code unless the notebook asks for it."""
import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from nbddp.errors import UsageError
from nbddp.orchestration import parameters
from nbddp.runtime.inputs.flags import apply_flags

REPO = Path(__file__).resolve().parent.parent
PAYLOAD = "__import__('os').system('touch {marker}')"
DEFAULTS = {"rows": 8, "lr": 1e-3, "packing": False, "name": "tiny", "layers": [1], "extra": {"a": 1},
            "shape": (1, 2), "cap": None}


@pytest.fixture
def marker(tmp_path):
    """A file the payload would create if it ran."""
    path = tmp_path / "pwned"
    yield path
    assert not path.exists(), "a parameter value was run as code"


@pytest.mark.parametrize("name", DEFAULTS)
def test_script_flags_never_run_a_value(name, marker, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["generated/train.py", f"--{name}", PAYLOAD.format(marker=marker)])
    namespace = dict(DEFAULTS)
    try:
        apply_flags(namespace, {parameter: "01_data.ipynb" for parameter in DEFAULTS})
    except SystemExit as exit_info:  # refused as a bad value: fine, as long as it did not run
        assert exit_info.code == 2 and f"argument --{name}:" in capsys.readouterr().err
    else:
        assert namespace[name] == PAYLOAD.format(marker=marker)  # str and None defaults keep the text


@pytest.mark.parametrize("name", DEFAULTS)
def test_orchestration_parameters_never_run_a_value(name, marker):
    try:
        value = parameters.parse_flag(name, PAYLOAD.format(marker=marker), DEFAULTS[name])
    except UsageError as error:
        assert str(error).startswith(f"-p {name}: ")
    else:
        assert value == PAYLOAD.format(marker=marker)


def test_a_parameter_file_cannot_construct_objects(tmp_path, marker):
    path = tmp_path / "params.yaml"
    path.write_text(f'rows: !!python/object/apply:os.system ["touch {marker}"]\n')
    with pytest.raises(UsageError, match="not valid YAML"):
        parameters.load_parameter_file(path)


def test_papermill_injects_a_value_as_a_string_literal(marker):
    # smoke hands -p values to papermill, which writes them into the injected-parameters cell.
    from papermill.translators import PythonTranslator

    cell = PythonTranslator.codify({"name": PAYLOAD.format(marker=marker)})
    namespace = {}
    exec(cell, namespace)  # the injected cell, as the kernel runs it
    assert namespace["name"] == PAYLOAD.format(marker=marker)


def python_files():
    return sorted((REPO / "nbddp").rglob("*.py")) + [REPO / "pipeline.py"]


SUBPROCESS_CALLS = {"run", "Popen", "call", "check_call", "check_output"}


def shell_uses(source, filename):
    """`file:line` of each subprocess call with a shell=... that is not literally False, and each os.system/os.popen."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        name = node.func.attr
        shell = [k for k in node.keywords if k.arg == "shell" and not (isinstance(k.value, ast.Constant) and k.value.value is False)]
        if (name in SUBPROCESS_CALLS and shell) or name in {"system", "popen"}:
            found.append(f"{filename}:{node.lineno}")
    return found


def test_the_detector_finds_shell_calls():
    source = "import subprocess, os\nsubprocess.run('ls', shell=True)\nsubprocess.Popen(['ls'], shell=flag)\nos.system('ls')\n"
    assert shell_uses(source, "x.py") == ["x.py:2", "x.py:3", "x.py:4"]
    assert shell_uses("subprocess.run(['ls'], shell=False)\n", "x.py") == []


def test_no_shell_in_nbddp_or_the_cli_but_the_notebooks_own_commands():
    found = [use for path in python_files() for use in shell_uses(path.read_text(), str(path.relative_to(REPO)))]
    # DistributedContext.shell runs a notebook's `!command`, which export writes into the script as the string
    # literal the author typed; a value reaches it only where the command asks for one (`!wget {url}`), as in
    # Jupyter (docs/safety.md).
    assert [use.split(":")[0] for use in found] == ["nbddp/runtime/notebook_emulation.py"]
    assert len(python_files()) > 20  # the walk saw the package


REMOTE_CONFIG = '{"model_type": "nbddp_remote", "auto_map": {"AutoConfig": "remote.RemoteConfig", "AutoModelForCausalLM": "remote.RemoteModel"}}'
REMOTE_CODE = textwrap.dedent("""\
    import os, pathlib
    pathlib.Path(os.environ["NBDDP_TEST_MARKER"]).touch()  # what a hostile model repo could do instead
    from transformers import PretrainedConfig
    class RemoteConfig(PretrainedConfig):
        model_type = "nbddp_remote"
""")


@pytest.fixture
def remote_code_model(tmp_path, monkeypatch, marker):
    """A model folder whose config names custom code, which would create `marker` when run."""
    model = tmp_path / "remote_model"
    model.mkdir()
    (model / "config.json").write_text(REMOTE_CONFIG)
    (model / "remote.py").write_text(REMOTE_CODE)
    monkeypatch.setenv("NBDDP_TEST_MARKER", str(marker))
    return model


def test_the_hf_backend_does_not_run_a_models_code(remote_code_model):
    from nbddp.fallback import models as hf_backend

    with pytest.raises(ValueError, match="trust_remote_code=True"):
        hf_backend.FastLanguageModel.from_pretrained(str(remote_code_model))


def test_a_notebook_that_trusts_the_code_gets_it_run(remote_code_model, tmp_path):
    # The other side of the test above: the folder's code does run once the notebook says trust_remote_code=True.
    code = ("from nbddp.fallback import models as hf_backend\n"
            f"try:\n    hf_backend.FastLanguageModel.from_pretrained({str(remote_code_model)!r}, trust_remote_code=True)\n"
            "except Exception:\n    pass  # the stand-in config is no real model; running its module is the point\n")
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "CUDA_VISIBLE_DEVICES": ""}
    subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=300, check=True)
    marker = Path(env["NBDDP_TEST_MARKER"])
    assert marker.exists()
    marker.unlink()  # for the fixture's check


def test_the_example_notebooks_do_not_trust_remote_code():
    for path in sorted((REPO / "notebooks").glob("*.py")):
        assert "trust_remote_code" not in path.read_text(), path.name


def files_under(directory):
    return sorted(path.relative_to(directory).as_posix() for path in Path(directory).rglob("*") if path.is_file())


@pytest.mark.e2e
@pytest.mark.skipif(not (REPO / "generated" / "train.py").exists(), reason="generated/train.py is not exported")
def test_a_run_writes_only_under_output_dir_and_the_documented_caches(tmp_path):
    """The example pipeline run in a copy of the repository, with its own HOME and TMPDIR: what it writes outside
    output_dir is the tiny model's weights (~/.cache/nbddp) and the datasets cache (~/.cache/huggingface), no more."""
    import shutil

    project, home, scratch = tmp_path / "project", tmp_path / "home", tmp_path / "tmp"
    shutil.copytree(REPO / "generated", project / "generated")
    shutil.copytree(REPO / "notebooks", project / "notebooks")  # where the cells run
    shutil.copytree(REPO / "models" / "tiny-llama", project / "models" / "tiny-llama")
    (project / "data").mkdir()
    shutil.copy(REPO / "data" / "tiny_instructions.jsonl", project / "data")
    home.mkdir()
    scratch.mkdir()
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("HF_", "NBDDP_", "XDG_", "TRANSFORMERS_", "TENSORBOARD_", "UNSLOTH_"))}
    env |= {"HOME": str(home), "TMPDIR": str(scratch), "CUDA_VISIBLE_DEVICES": ""}
    inputs = files_under(project)

    result = subprocess.run([sys.executable, "generated/train.py", "--max_steps", "2", "--eval_steps", "2",
                             "--output_dir", "../out"], cwd=project, env=env, capture_output=True, text=True, timeout=600)

    assert result.returncode == 0, result.stderr
    written = sorted(set(files_under(project)) - set(inputs))
    assert [path for path in written if not path.startswith("out/")] == []
    assert {"out/metrics.jsonl", "out/lora_adapter/adapter_config.json"} <= set(written)
    assert any(path.startswith("out/runs/") and "tfevents" in path for path in written)  # TensorBoard, in output_dir
    caches = {tuple(path.split("/")[:3]) for path in files_under(home)}
    assert caches == {(".cache", "nbddp", "models"), (".cache", "huggingface", "datasets")}
    assert files_under(scratch) == []
