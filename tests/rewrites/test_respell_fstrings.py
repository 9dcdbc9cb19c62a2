import importlib.util
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook
from rewrite_case import LOCATION, assert_rewrites, assert_unchanged

from nbddp.errors import NotebookError
from nbddp.export.rewrites.respell_fstrings import OLD_FSTRINGS, RUNNING, RespellFstrings
from nbddp.export.syntax import check_syntax

# On Python 3.12 or newer every cell below parses as written, so there is nothing to respell.
pytestmark = pytest.mark.skipif(not OLD_FSTRINGS, reason="Python 3.12's f-strings parse here")

MESSAGE = (f"gave the strings inside this f-string's {{...}} the other quote: Python {RUNNING} ends an f-string at "
           "its own quote, 3.12 does not")

_spec = importlib.util.spec_from_file_location("pipeline", Path(__file__).parents[2] / "pipeline.py")
pipeline = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pipeline)


@pytest.mark.parametrize(
    "before, after",
    [
        ('q = f"{sample["question"]}"', "q = f\"{sample['question']}\""),
        ("q = f'{sample['question']}'", "q = f'{sample[\"question\"]}'"),
        ('q = f"{row[b"k"]!r:>{width}}"', "q = f\"{row[b'k']!r:>{width}}\""),  # prefix, conversion, format spec
        ('q = f"{x:{"<"}10}"', "q = f\"{x:{'<'}10}\""),  # a string in the format spec
        ('q = f"{row["a" "b"]}"', "q = f\"{row['a' 'b']}\""),
        ('q = f"{f"{x}"!r} {f"{y:.2f}"}"', "q = f\"{f'{x}'!r} {f'{y:.2f}'}\""),  # f-strings inside
        ('q = f"""{x + """a"""}"""', "q = f\"\"\"{x + '''a'''}\"\"\""),
        ('q = f"{row["k"]=}"', "q = f\"{row['k']=}\""),
    ],
)
def test_inner_strings_take_the_other_quote(before, after):
    changes = assert_rewrites(RespellFstrings, f"{before}\n", f"{after}\n")
    assert changes == [(1, MESSAGE)]


def test_only_the_f_strings_this_python_rejects_change_at_their_lines():
    changes = assert_rewrites(
        RespellFstrings,
        '''\
        image = dataset[100]["decoded_image"]
        instruction = (
            f"{dataset[100]["question"]}, reason between {REASONING_START} and {REASONING_END} "
            f"and answer between {SOLUTION_START} and {SOLUTION_END}"
        )
        note = f"""{row["k"]}""" + f"{row['k']}"
        ''',
        '''\
        image = dataset[100]["decoded_image"]
        instruction = (
            f"{dataset[100]['question']}, reason between {REASONING_START} and {REASONING_END} "
            f"and answer between {SOLUTION_START} and {SOLUTION_END}"
        )
        note = f"""{row["k"]}""" + f"{row['k']}"
        ''',
    )
    assert changes == [(3, MESSAGE)]


@pytest.mark.parametrize(
    "source",
    [
        'q = f"{row[\'k\']}" + f"""{row["k"]}"""',  # a cell that parses here
        'q = f"{row["it\'s"]}"',  # both quotes in the inner string
        'q = f"{"\\n".join(lines)}"',  # a backslash inside {...}
        'q = f"{x  # the value\n}"',  # a comment inside {...}
        'q = f"{f"{f"{x}"}"}"',  # nested deeper than two quote characters allow
    ],
)
def test_a_cell_that_parses_or_needs_more_than_quotes_is_left_alone(source):
    assert_unchanged(RespellFstrings, f"{source}\n")


@pytest.mark.parametrize(
    "source, line, message",
    [
        ('q = f"{row["k"]}"\nw = f"{row["it\'s"]}"\n', 2, "unterminated string literal"),
        ('q = f"{"\\n".join(lines)}"\n', 1, "unexpected character after line continuation character"),
        ('q = f"{x  # the value\n}"\n', 1, "unterminated string literal"),
        ('q = f"{f"{f"{f"{x}"}"}"}"\n', 1, "f-string: expecting '}'"),
    ],
)
def test_what_cannot_be_respelled_is_the_syntax_error_it_was_with_what_to_do(source, line, message):
    with pytest.raises(NotebookError) as error:
        check_syntax(LOCATION, source)
    assert (error.value.line, error.value.exit_status) == (line, 2)
    assert str(error.value).startswith(f"notebooks/02_train.ipynb, cell 4, line {line}: syntax error: {message}")
    assert f"export and run the script with Python 3.12 or newer, or spell the line for {RUNNING}" in error.value.hint
    assert "a backslash, a comment or both quotes there, nor f-strings nested deeper" in error.value.hint


def test_export_of_a_colab_f_string_cell_writes_a_script_that_compiles(tmp_path, monkeypatch, capsys):
    # Gemma3_(4B)-Vision-GRPO in unslothai/notebooks, cell 33, as Colab's Python 3.12 runs it
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notebooks").mkdir()
    cell = new_code_cell(
        'dataset = [{"question": "How tall?"}]\n'
        "instruction = (\n"
        '    f"{dataset[0]["question"]}, provide your reasoning "\n'
        '    f"and then your final answer"\n'
        ")\n"
        "print(instruction)"
    )
    nbformat.write(new_notebook(cells=[cell]), tmp_path / "notebooks" / "01_nb.ipynb")
    assert pipeline.main(["export"]) == 0
    script = (tmp_path / "generated" / "train.py").read_text()
    compile(script, "train.py", "exec")
    assert "    f\"{dataset[0]['question']}, provide your reasoning \"\n" in script
    assert f"notebooks/01_nb.ipynb, cell 1, line 3: [respell-fstrings] {MESSAGE}" in capsys.readouterr().out
