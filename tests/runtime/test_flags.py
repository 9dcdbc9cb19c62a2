import os
import subprocess
import sys

import pytest

from nbddp.runtime.inputs import flags, training_overrides
from nbddp.runtime.inputs.flags import apply_flags
from nbddp.runtime.memory import batch_plan


def parameters():
    namespace = {
        "rows": 2000,
        "learning_rate": 2e-4,
        "model_name": "models/tiny",
        "packing": False,
        "max_samples": None,
        "target_modules": ["q_proj", "v_proj"],
        "chat_template": {"user": "U"},
        "backend": "auto",
        "unrelated": object(),
    }
    defined_in = {name: "01_data_prep.ipynb" for name in namespace if name not in ("backend", "unrelated")}
    defined_in["backend"] = "nbddp"
    return namespace, defined_in


def run(monkeypatch, *argv):
    monkeypatch.setattr(sys, "argv", ["generated/train.py", *argv])
    namespace, defined_in = parameters()
    apply_flags(namespace, defined_in)
    return namespace


def test_no_flags_keeps_every_default(monkeypatch):
    namespace = run(monkeypatch)
    defaults, _ = parameters()
    for name in ("rows", "learning_rate", "model_name", "packing", "max_samples", "target_modules", "backend"):
        assert namespace[name] == defaults[name]


def test_values_take_the_type_of_their_default(monkeypatch):
    namespace = run(
        monkeypatch,
        "--rows", "50",
        "--learning_rate", "1e-3",
        "--model_name", "models/other",
        "--target_modules", "['q_proj']",
        "--chat_template={'user': 'X', 'bot': 'Y'}",
    )
    assert namespace["rows"] == 50 and type(namespace["rows"]) is int
    assert namespace["learning_rate"] == 1e-3
    assert namespace["model_name"] == "models/other"
    assert namespace["target_modules"] == ["q_proj"]
    assert namespace["chat_template"] == {"user": "X", "bot": "Y"}


def test_float_accepts_an_integer(monkeypatch):
    assert run(monkeypatch, "--learning_rate", "1")["learning_rate"] == 1.0


@pytest.mark.parametrize("text, value", [("true", True), ("Yes", True), ("1", True), ("false", False), ("NO", False), ("0", False)])
def test_bool_words(monkeypatch, text, value):
    assert run(monkeypatch, "--packing", text)["packing"] is value


@pytest.mark.parametrize("text, value", [("100", 100), ("None", None), ("[1, 2]", [1, 2]), ("outputs/ckpt-5", "outputs/ckpt-5")])
def test_none_default_takes_a_literal_or_else_text(monkeypatch, text, value):
    assert run(monkeypatch, "--max_samples", text)["max_samples"] == value


def test_literal_is_never_evaluated(monkeypatch, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run(monkeypatch, "--target_modules", "__import__('os').getcwd()")
    assert exit_info.value.code == 2
    assert "--target_modules" in capsys.readouterr().err


def test_backend_choices(monkeypatch, capsys):
    assert run(monkeypatch, "--backend", "hf")["backend"] == "hf"
    with pytest.raises(SystemExit) as exit_info:
        run(monkeypatch, "--backend", "vllm")
    assert exit_info.value.code == 2
    assert "--backend" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--rows", "many"], "--rows"),
        (["--rows", "1.5"], "--rows"),
        (["--packing", "maybe"], "--packing"),
        (["--target_modules", "{'a': 1}"], "--target_modules"),
        (["--chat_template", "[1"], "--chat_template"),
    ],
)
def test_bad_value_exits_2_naming_the_flag(monkeypatch, capsys, argv, flag):
    with pytest.raises(SystemExit) as exit_info:
        run(monkeypatch, *argv)
    assert exit_info.value.code == 2
    assert f"argument {flag}:" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--epochs", "3"], ["--row", "5"], ["positional"]])
def test_unknown_or_abbreviated_flag_exits_2(monkeypatch, capsys, argv):
    with pytest.raises(SystemExit) as exit_info:
        run(monkeypatch, *argv)
    assert exit_info.value.code == 2
    assert "unrecognized arguments: " + " ".join(argv) in capsys.readouterr().err


def test_help_shows_how_to_run_and_each_flag(monkeypatch, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run(monkeypatch, "--help")
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "torchrun --nproc_per_node N generated/train.py [--name VALUE ...]" in text
    assert "--rows INT default: 2000 (from 01_data_prep.ipynb)" in text
    assert "--packing {true,false} default: False (from 01_data_prep.ipynb)" in text
    assert "--backend {auto,unsloth,hf} default: 'auto' (from nbddp)" in text
    assert "--unrelated" not in text


def test_help_shows_each_parameters_comment_from_the_script(monkeypatch, capsys, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "# %% tags=[\"parameters\"]\n"
        "rows = 2000  # training rows to use\n"
        "target_modules = [\"q_proj\",\n"
        "                  \"v_proj\"]  # LoRA targets: 100% of the attention\n"
        "packing = False\n"
        "\n"
        "# %% 01_data_prep.ipynb cell 3\n"
        "packing = True  # a later statement is no parameter's help\n"
        "rows = rows * 2  # nor this\n"
    )
    namespace, defined_in = parameters()
    namespace["__file__"] = str(script)
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    with pytest.raises(SystemExit):
        apply_flags(namespace, defined_in)
    text = " ".join(capsys.readouterr().out.split())
    assert "--rows INT training rows to use; default: 2000 (from 01_data_prep.ipynb)" in text
    assert "LoRA targets: 100% of the attention; default: ['q_proj', 'v_proj']" in text
    assert "--packing {true,false} default: False (from 01_data_prep.ipynb)" in text


def test_without_a_readable_script_help_has_no_comments():
    assert flags.assignment_comments(None, {"rows"}) == {}
    assert flags.assignment_comments("/nonexistent/train.py", {"rows"}) == {}


def test_help_survives_a_percent_sign(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["train.py", "--help"])
    with pytest.raises(SystemExit):
        apply_flags({"split": "train[:10%]"}, {"split": "01_data_prep.ipynb"})
    assert "train[:10%]" in capsys.readouterr().out


class FakeKernelApp:
    @staticmethod
    def initialized():
        return True


def test_kernel_mode_leaves_argv_alone(monkeypatch):
    # papermill's kernel runs with the kernel's own argv, e.g. `-f /tmp/kernel.json`
    monkeypatch.setitem(sys.modules, "ipykernel.kernelapp", type(sys)("ipykernel.kernelapp"))
    monkeypatch.setattr(sys.modules["ipykernel.kernelapp"], "IPKernelApp", FakeKernelApp, raising=False)
    namespace = run(monkeypatch, "-f", "/tmp/kernel-1.json")
    assert namespace["rows"] == 2000


def test_running_in_kernel_follows_the_real_kernel_singleton():
    from ipykernel.kernelapp import IPKernelApp

    assert not flags.running_in_kernel()  # imported, but no kernel runs in this process
    IPKernelApp.instance()
    try:
        assert flags.running_in_kernel()
    finally:
        IPKernelApp.clear_instance()


def test_an_unknown_flag_suggests_the_closest_parameter(monkeypatch, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run(monkeypatch, "--learning-rate", "1e-3")
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --learning-rate 1e-3 (did you mean --learning_rate?)" in capsys.readouterr().err


def test_flags_for_a_pipeline_without_parameters_say_so(monkeypatch, capsys):
    # A pipeline whose notebooks have no `parameters` cell: the script knows only nbddp's --backend.
    monkeypatch.setattr(sys, "argv", ["generated/train.py", "--x", "1"])
    with pytest.raises(SystemExit) as exit_info:
        apply_flags({"backend": "auto"}, {"backend": "nbddp"})
    assert exit_info.value.code == 2
    assert ("unrecognized arguments: --x 1 (the notebooks define no parameters: tag a cell `parameters` "
            "to make its assignments flags)") in capsys.readouterr().err


# --set NAME=VALUE: training arguments, through NBDDP_SET


@pytest.fixture
def no_overrides_yet(monkeypatch):
    """NBDDP_SET unset, and put back as it was after the test (apply_flags writes os.environ)."""
    monkeypatch.setenv(training_overrides.ENV, "")  # records the value to put back: delenv of a missing one would not
    monkeypatch.delenv(training_overrides.ENV)


def test_set_goes_to_the_environment_not_the_scripts_globals(monkeypatch, no_overrides_yet):
    namespace = run(monkeypatch, "--rows", "5", "--set", "learning_rate=1e-4", "--set=lr_scheduler_type=cosine")
    assert os.environ[training_overrides.ENV] == "learning_rate=1e-4\nlr_scheduler_type=cosine"
    assert namespace["rows"] == 5
    assert namespace["learning_rate"] == 2e-4  # the notebook's parameter of that name is not what --set changes
    assert "set" not in namespace and flags.SET_DEST not in namespace
    defaults, _ = parameters()
    assert set(namespace) == set(defaults)


def test_set_lines_follow_those_already_in_the_environment(monkeypatch):
    monkeypatch.setenv(training_overrides.ENV, "bf16=true")
    run(monkeypatch, "--set", "bf16=false")
    assert os.environ[training_overrides.ENV] == "bf16=true\nbf16=false"
    assert training_overrides.from_environment() == [training_overrides.Override("bf16", "false")]  # the flag wins


def test_without_set_the_environment_is_left_alone(monkeypatch, no_overrides_yet):
    run(monkeypatch, "--rows", "5")
    assert training_overrides.ENV not in os.environ


def test_set_works_for_a_pipeline_without_parameters(monkeypatch, capsys, no_overrides_yet):
    # Only nbddp's own parameters: --set is no notebook parameter, so "the notebooks define no parameters" must not fire.
    monkeypatch.setattr(sys, "argv", ["generated/train.py", "--set", "max_steps=5"])
    namespace = {"backend": "auto", "resume": False}
    apply_flags(namespace, {"backend": "nbddp", "resume": "nbddp"})
    assert os.environ[training_overrides.ENV] == "max_steps=5"
    assert namespace == {"backend": "auto", "resume": False}
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("value", ["learning_rate", "=1"])
def test_a_set_that_is_not_name_equals_value_exits_2(monkeypatch, capsys, no_overrides_yet, value):
    with pytest.raises(SystemExit) as exit_info:
        run(monkeypatch, "--set", value)
    assert exit_info.value.code == 2
    assert f"error: argument --set: {value}: expected NAME=VALUE, e.g. --set learning_rate=1e-4\n" in capsys.readouterr().err
    assert training_overrides.ENV not in os.environ


def test_help_teaches_set(monkeypatch, capsys):
    with pytest.raises(SystemExit):
        run(monkeypatch, "--help")
    text = " ".join(capsys.readouterr().out.split())
    assert ("--set NAME=VALUE override any keyword of the training arguments the notebook builds (TrainingArguments, "
            "SFTConfig, GRPOConfig, ...), typed as Transformers types that field; repeatable; e.g. --set "
            "learning_rate=1e-4 --set lr_scheduler_type=cosine") in text


def test_kernel_mode_reads_no_set_from_argv(monkeypatch, no_overrides_yet):
    monkeypatch.setitem(sys.modules, "ipykernel.kernelapp", type(sys)("ipykernel.kernelapp"))
    monkeypatch.setattr(sys.modules["ipykernel.kernelapp"], "IPKernelApp", FakeKernelApp, raising=False)
    run(monkeypatch, "--set", "bf16=true")  # papermill's kernel: NBDDP_SET comes from pipeline.py's environment
    assert training_overrides.ENV not in os.environ


def test_a_script_without_parameters_takes_set_before_torch_loads(tmp_path):
    # What the setup cell of a script exported from notebooks without a parameters cell runs, up to runtime.setup.
    script = tmp_path / "train.py"
    script.write_text(
        "import os, sys\n"
        "from nbddp import runtime\n"
        'backend = "auto"\n'
        'runtime.apply_flags(globals(), defined_in={"backend": "nbddp"})\n'
        'print(repr(os.environ["NBDDP_SET"]), "set" in globals(), "torch" in sys.modules, "transformers" in sys.modules)\n'
    )
    env = {**os.environ, "NBDDP_SET": "seed=1"}
    result = subprocess.run([sys.executable, str(script), "--set", "learning_rate=1e-4", "--set", "bf16=false"],
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "'seed=1\\nlearning_rate=1e-4\\nbf16=false' False False False\n"
    bad = subprocess.run([sys.executable, str(script), "--set", "bogus"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip().splitlines()[-1] == ("train.py: error: argument --set: bogus: expected NAME=VALUE, "
                                                   "e.g. --set learning_rate=1e-4")


def test_batch_flags_given_on_the_command_line_are_marked_per_process(monkeypatch):
    monkeypatch.setenv(batch_plan.PER_PROCESS, "")
    monkeypatch.delenv(batch_plan.PER_PROCESS)  # put back as it was after the test: apply_flags writes os.environ
    monkeypatch.setattr(sys, "argv", ["generated/train.py", "--gradient_accumulation_steps=2", "--rows", "5"])
    namespace = {"rows": 1, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 4}
    apply_flags(namespace, dict.fromkeys(namespace, "03_train.ipynb"))
    assert namespace["gradient_accumulation_steps"] == 2
    # the micro batch was left at the notebook's value: not the command line's, though it has a flag
    assert os.environ[batch_plan.PER_PROCESS] == "gradient_accumulation_steps=2"
    assert batch_plan.command_line_values() == {"gradient_accumulation_steps": "2"}


def test_without_batch_flags_nothing_is_marked(monkeypatch):
    monkeypatch.setenv(batch_plan.PER_PROCESS, "")
    monkeypatch.delenv(batch_plan.PER_PROCESS)
    monkeypatch.setattr(sys, "argv", ["generated/train.py", "--rows", "4"])
    namespace = {"rows": 1, "gradient_accumulation_steps": 4}
    apply_flags(namespace, dict.fromkeys(namespace, "03_train.ipynb"))
    assert batch_plan.PER_PROCESS not in os.environ
