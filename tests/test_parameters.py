import pytest

from nbddp.errors import NotebookError
from nbddp.export.notebooks import SourceCell
from nbddp.export.parameters import merge_parameters, read_parameters
from nbddp.export.rewrites.base import CellLocation
from nbddp.runtime.inputs import flags


def parameters_cell(notebook, number, source):
    return SourceCell(CellLocation(f"notebooks/{notebook}", number), "code", source, frozenset({"parameters"}))


def read_by_the_runtime(merged, tmp_path):
    """{name: notebook} as the runtime reads it for --help from the merged cell, in a script as export writes it."""
    script = tmp_path / "train.py"
    script.write_text(f"# %% [markdown]\n# header\n\n{flags.PARAMETERS_MARKER}\n{merged.source}\n\n"
                      "# %% nbddp setup\nfrom nbddp import runtime\n")
    return flags.defined_in(str(script))


def test_literal_assignments_are_read_with_their_values_and_lines():
    cell = parameters_cell("01_data.ipynb", 2, "# rows to keep\nrows = 2000  # small\n\nlr: float = -1e-4\nnames = ['a',\n         'b']\n")
    parameters = read_parameters(cell)
    assert [(p.name, p.value, p.line, p.first_line, p.last_line) for p in parameters] == [
        ("rows", 2000, 2, 1, 2),
        ("lr", -1e-4, 4, 3, 4),
        ("names", ["a", "b"], 5, 5, 6),
    ]


@pytest.mark.parametrize(
    "source, line, message",
    [
        ("rows = 10\nsteps = rows * 2\n", 2, "not a literal"),
        ("rows = 10\nimport os\n", 2, "only `name = literal` assignments"),
        ("a = b = 1\n", 1, "only `name = literal` assignments"),
        ("a, b = 1, 2\n", 1, "only `name = literal` assignments"),
        ("x: int\n", 1, "only `name = literal` assignments"),
        ("a = 1; b = 2\n", 1, "only `name = literal` assignments"),
        ("name = f'{1}'\n", 1, "not a literal"),
    ],
)
def test_anything_but_a_literal_assignment_is_an_error_at_its_line(source, line, message):
    with pytest.raises(NotebookError, match=message) as error:
        read_parameters(parameters_cell("01_data.ipynb", 3, source))
    assert (error.value.notebook, error.value.cell, error.value.line) == ("notebooks/01_data.ipynb", 3, line)


@pytest.mark.parametrize("name", ["backend", "resume"])
def test_a_name_the_script_uses_itself_is_an_error(name):
    with pytest.raises(NotebookError, match=f"'{name}' is taken"):
        read_parameters(parameters_cell("01_data.ipynb", 1, f"{name} = 'hf'\n"))


def test_merge_keeps_comments_names_notebooks_and_appends_nbddp_parameters(tmp_path):
    merged = merge_parameters([
        parameters_cell("01_data.ipynb", 2, "rows = 8  # how many\n\n# seed for shuffling\nseed = 0"),
        parameters_cell("02_train.ipynb", 1, "lr = 1e-3"),
    ], workdir="../notebooks")
    assert merged.source.splitlines() == [
        "# 01_data.ipynb",
        "rows = 8  # how many",
        "# seed for shuffling",
        "seed = 0",
        "# 02_train.ipynb",
        "lr = 1e-3",
        "# nbddp",
        'backend = "auto"  # auto | unsloth | hf',
        "resume = False  # continue from the last complete checkpoint in output_dir",
        'batch_layout = "notebook"  # notebook | per-device | auto | N: how the processes share the batch (README)',
        'strategy = "auto"  # ddp | fsdp | auto: a whole model per GPU, sharded across them, or by the memory estimate',
        'workdir = "../notebooks"  # where the cells run, from this script\'s folder: the notebooks\', as in Jupyter',
    ]
    assert merged.origin == [
        None,
        ["notebooks/01_data.ipynb", 2, 1],
        ["notebooks/01_data.ipynb", 2, 3],
        ["notebooks/01_data.ipynb", 2, 4],
        None,
        ["notebooks/02_train.ipynb", 1, 1],
        None,
        None,
        None,
        None,
        None,
        None,
    ]
    assert read_by_the_runtime(merged, tmp_path) == {
        "rows": "01_data.ipynb", "seed": "01_data.ipynb", "lr": "02_train.ipynb",
        "backend": "nbddp", "resume": "nbddp", "batch_layout": "nbddp", "strategy": "nbddp",
        "workdir": "nbddp"}


def test_same_name_with_the_same_default_is_merged_once(tmp_path):
    merged = merge_parameters([
        parameters_cell("01_data.ipynb", 1, "seed = 0"),
        parameters_cell("02_train.ipynb", 1, "# the seed again\nseed: int = 0\nlr = 0.1"),
    ])
    assert merged.source.count("seed") == 1
    assert "# the seed again" not in merged.source
    assert read_by_the_runtime(merged, tmp_path)["seed"] == "01_data.ipynb"
    assert "lr = 0.1" in merged.source


def test_same_name_with_different_defaults_names_both_places():
    with pytest.raises(NotebookError) as error:
        merge_parameters([
            parameters_cell("01_data.ipynb", 2, "rows = 1\nseed = 0"),
            parameters_cell("02_train.ipynb", 4, "lr = 0.1\nseed = 1"),
        ])
    assert (error.value.notebook, error.value.cell, error.value.line) == ("notebooks/02_train.ipynb", 4, 2)
    assert "notebooks/01_data.ipynb, cell 2, line 2" in str(error.value)


def test_equal_values_of_different_types_are_different_defaults():
    with pytest.raises(NotebookError, match="defaults to 1.0 here but to 1 in"):
        merge_parameters([parameters_cell("01_a.ipynb", 1, "x = 1"), parameters_cell("02_b.ipynb", 1, "x = 1.0")])


def test_no_parameters_cells_still_give_nbddp_backend_resume_batch_layout_strategy_and_workdir(tmp_path):
    merged = merge_parameters([])
    assert merged.source.splitlines() == [
        "# nbddp",
        'backend = "auto"  # auto | unsloth | hf',
        "resume = False  # continue from the last complete checkpoint in output_dir",
        'batch_layout = "notebook"  # notebook | per-device | auto | N: how the processes share the batch (README)',
        'strategy = "auto"  # ddp | fsdp | auto: a whole model per GPU, sharded across them, or by the memory estimate',
        'workdir = "."  # where the cells run, from this script\'s folder: the notebooks\', as in Jupyter',
    ]
    assert read_by_the_runtime(merged, tmp_path) == {
        "backend": "nbddp", "resume": "nbddp", "batch_layout": "nbddp", "strategy": "nbddp",
        "workdir": "nbddp"}


def test_the_runtime_reads_multi_line_defaults_and_takes_no_comment_of_the_author_for_a_notebook(tmp_path):
    merged = merge_parameters([
        parameters_cell("01_data.ipynb", 2,
                        "# as in colab.ipynb\nnames = [\n'a',\nNone,\n]\n# see 02_train.ipynb\nrows = 1"),
        parameters_cell("02_train.ipynb", 1, "lr: float = 1e-3"),
    ])
    assert read_by_the_runtime(merged, tmp_path) == {
        "names": "01_data.ipynb", "rows": "01_data.ipynb", "lr": "02_train.ipynb",
        "backend": "nbddp", "resume": "nbddp", "batch_layout": "nbddp", "strategy": "nbddp",
        "workdir": "nbddp"}


def test_the_runtime_reads_no_parameters_without_a_script_or_a_parameters_cell(tmp_path):
    assert flags.defined_in(None) == {} and flags.defined_in(str(tmp_path / "missing.py")) == {}
    (tmp_path / "plain.py").write_text("rows = 1\n")
    assert flags.defined_in(str(tmp_path / "plain.py")) == {}
