import textwrap

import jupytext
import pytest

from nbddp.errors import NotebookError, UsageError
from nbddp.orchestration import parameters

SCRIPT = textwrap.dedent('''\
    # %% [markdown]
    # A generated script

    # %% tags=["parameters"]
    # 01_data.ipynb
    rows = 2000  # comment kept
    lr: float = 2e-4
    packing = False
    name = "tiny"
    layers = [1, 2]
    extra = {"a": 1}
    cap = None

    # %%
    print(rows)
''')


@pytest.fixture
def defaults():
    return parameters.read_defaults(jupytext.reads(SCRIPT, fmt="py:percent"), "generated/train.py")


def test_defaults_are_the_literals_of_the_parameters_cell(defaults):
    assert defaults == {"rows": 2000, "lr": 2e-4, "packing": False, "name": "tiny", "layers": [1, 2],
                        "extra": {"a": 1}, "cap": None}


def test_a_script_without_a_parameters_cell_is_a_notebook_error():
    notebook = jupytext.reads("# %%\nrows = 1\n", fmt="py:percent")
    with pytest.raises(NotebookError, match="no cell is tagged `parameters`"):
        parameters.read_defaults(notebook, "generated/train.py")


def test_a_computed_default_is_an_error_at_its_cell_and_line():
    notebook = jupytext.reads('# %% [markdown]\n# x\n\n# %% tags=["parameters"]\nrows = 1\nsteps = rows * 2\n',
                              fmt="py:percent")
    with pytest.raises(NotebookError) as error:
        parameters.read_defaults(notebook, "generated/train.py")
    assert (error.value.cell, error.value.line) == (2, 2)


@pytest.mark.parametrize("name, text, expected", [
    ("rows", "3", 3),
    ("lr", "1e-5", 1e-5),
    ("lr", "1", 1.0),
    ("packing", "true", True),
    ("packing", "No", False),
    ("name", "3", "3"),
    ("layers", "[4, 5]", [4, 5]),
    ("extra", "{'b': [1]}", {"b": [1]}),
    ("cap", "7", 7),
    ("cap", "None", None),
    ("cap", "float16", "float16"),
])
def test_flag_text_is_typed_like_the_default(defaults, name, text, expected):
    value = parameters.resolve(defaults, flag_values=[(name, text)])[name]
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize("name, text, message", [
    ("rows", "3.5", "invalid int value: '3.5'"),
    ("lr", "fast", "invalid float value: 'fast'"),
    ("packing", "maybe", "expected one of true, 1, yes, false, 0, no, got 'maybe'"),
    ("layers", "{a: 1}", "expected a Python list literal, got '{a: 1}'"),
    ("layers", "(4,)", "expected a list, got tuple '(4,)'"),
    ("extra", "{b: 2}", "expected a Python dict literal, got '{b: 2}'"),  # a Python literal, as the script's flag
])
def test_a_bad_value_names_the_flag_and_what_it_expected(defaults, name, text, message):
    with pytest.raises(UsageError) as error:
        parameters.resolve(defaults, flag_values=[(name, text)])
    assert str(error.value) == f"-p {name}: {message}"


def test_an_unknown_parameter_is_named(defaults):
    with pytest.raises(UsageError, match="unknown parameter `max_step`"):
        parameters.resolve(defaults, flag_values=[("max_step", "3")])


def test_file_values_are_checked_and_flags_win_over_them(defaults, tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("rows: 10\nlr: 1\nname: big\n")
    file_values = parameters.load_parameter_file(path)
    resolved = parameters.resolve(defaults, file_values, [("rows", "20")], file_label=f"-f {path}")
    assert resolved == {"rows": 20, "lr": 1.0, "name": "big"}
    assert type(resolved["lr"]) is float


def test_a_wrongly_typed_file_value_names_the_file_and_parameter(defaults, tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("packing: 1\n")
    with pytest.raises(UsageError, match=r"params.yaml: packing: expected bool"):
        parameters.resolve(defaults, parameters.load_parameter_file(path), file_label=f"-f {path}")


@pytest.mark.parametrize("text, message", [
    ("max_steps: 0\n", "max_steps: expected 1 or more optimizer steps, or -1 to train for num_train_epochs, not 0"),
    ("lr: .nan\n", "lr: expected a finite number, not nan"),
    ("lr: -.inf\n", "lr: expected a finite number, not -inf"),
])
def test_a_file_value_the_training_arguments_would_refuse_is_refused(tmp_path, text, message):
    path = tmp_path / "params.yaml"
    path.write_text(text)
    with pytest.raises(UsageError) as error:
        parameters.resolve({"max_steps": 300, "lr": 2e-3}, parameters.load_parameter_file(path),
                           file_label=f"-f {path}")
    assert str(error.value) == f"-f {path}: {message}"


def test_a_parameter_file_must_be_a_mapping(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("- rows\n")
    with pytest.raises(UsageError, match="expected a mapping"):
        parameters.load_parameter_file(path)
    with pytest.raises(UsageError, match="-f .*missing.yaml"):
        parameters.load_parameter_file(tmp_path / "missing.yaml")


def test_script_flags_are_text_the_runtime_parses_back(defaults):
    overrides = {"rows": 3, "lr": 1e-5, "packing": True, "name": "x y", "layers": [1], "cap": None}
    flags = parameters.as_script_flags(overrides)
    assert flags == ["--rows", "3", "--lr", "1e-05", "--packing", "true", "--name", "x y", "--layers", "[1]",
                     "--cap", "None"]


def test_an_unknown_parameter_gets_the_closest_name(defaults):
    with pytest.raises(UsageError, match=r"-p row: unknown parameter `row` \(did you mean `rows`\? the script's"):
        parameters.resolve(defaults, flag_values=[("row", "3")])


def test_a_script_without_notebook_parameters_says_so():
    # The parameters cell of a pipeline whose notebooks define none holds only nbddp's own `backend`.
    with pytest.raises(UsageError, match=r"-p x: unknown parameter `x`: the notebooks define no parameters"):
        parameters.resolve({"backend": "auto", "resume": False}, flag_values=[("x", "1")])
