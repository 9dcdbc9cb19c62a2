import sys
import textwrap

import jupytext
import pytest

from nbddp.errors import NotebookError, UsageError
from nbddp.formats.parameters import Parameter, ParametersCellError, read_cell
from nbddp.orchestration import parameters as orchestration_parameters
from nbddp.runtime.inputs import flags


def test_a_cell_reads_into_names_defaults_comments_and_notebooks_in_order():
    source = textwrap.dedent('''\
        # 01_data_prep.ipynb
        # rows to keep
        rows = 2000  # training rows to use
        lr: float = -1e-4
        names = ["a",  # the first
                 "b"]
        # see 02_train.ipynb
        # 02_train.ipynb
        cap = None;
        # nbddp
        backend = "auto"  # auto | unsloth | hf
    ''')
    assert read_cell(source) == [
        Parameter("rows", 2000, "training rows to use", "01_data_prep.ipynb", 3, 3),
        Parameter("lr", -1e-4, None, "01_data_prep.ipynb", 4, 4),
        Parameter("names", ["a", "b"], "the first", "01_data_prep.ipynb", 5, 6),
        Parameter("cap", None, None, "02_train.ipynb", 9, 9),
        Parameter("backend", "auto", "auto | unsloth | hf", "nbddp", 11, 11),
    ]


def test_a_cell_without_notebook_lines_or_assignments():
    assert read_cell("x = 1\n") == [Parameter("x", 1, None, None, 1, 1)]
    assert read_cell("# only a comment\n") == [] and read_cell("") == []


@pytest.mark.parametrize("source, line, name", [
    ("rows = 10\nsteps = rows * 2\n", 2, "steps"),
    ("name = f'{1}'\n", 1, "name"),
    ("keys = {[1]: 2}\n", 1, "keys"),
    ("rows = 10\nimport os\n", 2, None),
    ("a = b = 1\n", 1, None),
    ("a, b = 1, 2\n", 1, None),
    ("x: int\n", 1, None),
    ("a = 1; b = 2\n", 1, None),
    ("rows += 1\n", 1, None),
    ("rows = 1\n%pip install x\n", 2, None),
])
def test_anything_but_a_literal_assignment_is_one_error_naming_its_line(source, line, name):
    with pytest.raises(ParametersCellError) as error:
        read_cell(source)
    assert (error.value.line, error.value.name) == (line, name)


def test_orchestration_names_the_cell_and_line():
    notebook = jupytext.reads('# %% tags=["parameters"]\nrows = 1\nsteps = rows * 2\n', fmt="py:percent")
    with pytest.raises(NotebookError, match=r"^train.py, cell 1, line 2: `steps` is not a literal$"):
        orchestration_parameters.read_defaults(notebook, "train.py")


def test_the_runtime_names_the_scripts_line_of_an_unreadable_parameters_cell(tmp_path, monkeypatch, capsys):
    script = tmp_path / "train.py"
    script.write_text(f"# %% [markdown]\n# header\n\n{flags.PARAMETERS_MARKER}\nrows = 1\nsteps = rows * 2\n")
    with pytest.raises(SystemExit) as exit_info:
        flags.defined_in(str(script))
    assert exit_info.value.code == 2
    message = f"nbddp: error: {script}, line 6, in the parameters cell: `steps` is not a literal\n"
    assert capsys.readouterr().err == message


# One typing rule: each (name, default, text) gives the script's `--name text` and orchestration's `-p name text`
# the same value, or the same message.
TYPING = [
    ("rows", 2000, "50", 50),
    ("rows", 2000, " 7 ", 7),
    ("rows", 2000, "1.5", "invalid int value: '1.5'"),
    ("lr", 2e-4, "1", 1.0),
    ("lr", 2e-4, "1e-5", 1e-5),
    ("lr", 2e-4, "fast", "invalid float value: 'fast'"),
    ("packing", False, "Yes", True),
    ("packing", False, "0", False),
    ("packing", False, "maybe", "expected one of true, 1, yes, false, 0, no, got 'maybe'"),
    ("name", "tiny", "3", "3"),
    ("name", "tiny", "None", "None"),
    ("cap", None, "7", 7),
    ("cap", None, "None", None),
    ("cap", None, "[1, 2]", [1, 2]),
    ("cap", None, "outputs/ckpt-5", "outputs/ckpt-5"),
    ("cap", None, "{[1]: 2}", "{[1]: 2}"),
    ("dtype", None, "bfloat16", "bfloat16"),
    ("dtype", "bfloat16", "None", None),
    ("dtype", None, "fp16", "expected None (auto detection) or one of float16, bfloat16, float32, not 'fp16'"),
    ("dtype", "auto", "fp16", "fp16"),  # not Unsloth's dtype: a plain str parameter
    ("layers", [1, 2], "[4, 5]", [4, 5]),
    ("layers", [1, 2], "(4,)", "expected a list, got tuple '(4,)'"),
    ("layers", [1, 2], "__import__('os').getcwd()",
     "expected a Python list literal, got \"__import__('os').getcwd()\""),
    ("extra", {"a": 1}, "{'b': [1]}", {"b": [1]}),
    ("extra", {"a": 1}, "{b: 2}", "expected a Python dict literal, got '{b: 2}'"),
    ("shape", (1, 2), "(3, 4)", (3, 4)),
    # what the training arguments would refuse or train on as nonsense (issues 41 and 43)
    ("max_steps", 300, "-1", -1),  # the Trainer's "train for num_train_epochs"
    ("max_steps", 300, "-5", "expected 1 or more optimizer steps, or -1 to train for num_train_epochs, not -5"),
    ("max_steps", 300, "0", "expected 1 or more optimizer steps, or -1 to train for num_train_epochs, not 0"),
    ("learning_rate", 2e-3, "1e400", "expected a finite number, not '1e400' (inf)"),
    ("learning_rate", 2e-3, "nan", "expected a finite number, not nan"),
]


def by_the_script(monkeypatch, capsys, name, default, text):
    """The value of `--name text`, or the message argparse exits with."""
    monkeypatch.setattr(sys, "argv", ["train.py", f"--{name}", text])
    namespace = {name: default}
    try:
        flags.apply_flags(namespace, {name: "01_data_prep.ipynb"})
    except SystemExit as exit_info:
        assert exit_info.code == 2
        return capsys.readouterr().err.splitlines()[-1].removeprefix(f"train.py: error: argument --{name}: ")
    return namespace[name]


def by_orchestration(name, default, text):
    """The value of `-p name text`, or its UsageError's message."""
    try:
        return orchestration_parameters.resolve({name: default}, flag_values=[(name, text)])[name]
    except UsageError as error:
        return str(error).removeprefix(f"-p {name}: ")


@pytest.mark.parametrize("name, default, text, expected", TYPING)
def test_script_flags_and_orchestration_type_a_text_alike(monkeypatch, capsys, name, default, text, expected):
    script = by_the_script(monkeypatch, capsys, name, default, text)
    orchestration = by_orchestration(name, default, text)
    assert script == orchestration == expected
    assert type(script) is type(orchestration) is type(expected)
