import pytest
from rewrite_case import LOCATION, assert_unchanged

from nbddp.errors import NotebookError
from nbddp.export.rewrites import apply
from nbddp.export.rewrites.refuse_input import RefuseInput


@pytest.mark.parametrize("source, line", [
    ('name = input("Your Hugging Face user name: ")\n', 1),
    ("import os\nif not os.environ.get('HF_TOKEN'):\n    os.environ['HF_TOKEN'] = input()\n", 3),
    ("%%time\nanswer = input('continue? ')\n", 2),  # counted on the cell's lines, magic included
])
def test_input_stops_the_export_at_its_notebook_cell_and_line(source, line):
    with pytest.raises(NotebookError) as refused:
        apply(source, LOCATION)
    assert refused.value.exit_status == 2
    assert str(refused.value) == (
        f"notebooks/02_train.ipynb, cell 4, line {line}: input() waits for an answer typed at the terminal; under "
        "torchrun no process reads one, so every rank would wait forever\n"
        "  hint: make the answer a parameter (in a cell tagged parameters: `answer = \"...\"`, then `--answer VALUE` "
        "on the script), or tag the cell notebook-only to leave it out of the script"
    )


def test_other_inputs_pass():
    assert_unchanged(
        RefuseInput,
        """\
        inputs = tokenizer(["hi"], return_tensors="pt")
        input_ids = inputs.input_ids
        text = tokenizer.input(x)
        model.get_input_embeddings()
        """,
    )


@pytest.mark.parametrize("source, message", [
    ("import builtins\nrepo = builtins.input('repo: ')\n", "builtins.input() waits for an answer typed at the terminal"),
    ("x = __builtins__.input()\n", "__builtins__.input() waits for an answer typed at the terminal"),
    ("import sys\nline = sys.stdin.readline()\n", "sys.stdin.readline() waits for standard input, the terminal's"),
    ("import sys\ndata = sys.stdin.read()\n", "sys.stdin.read() waits for standard input"),
    ("from sys import stdin\nrows = stdin.readlines()\n", "stdin.readlines() waits for standard input"),
    ("import sys\nraw = sys.stdin.buffer.read(10)\n", "sys.stdin.buffer.read() waits for standard input"),
    ("import sys\nx = sys.__stdin__.readline()\n", "sys.__stdin__.readline() waits for standard input"),
    ("import sys\nfor line in sys.stdin:\n    print(line)\n", "`for ... in sys.stdin` waits for standard input"),
    ("from getpass import getpass\ntoken = getpass('HF token: ')\n", "getpass() waits for a secret typed at the terminal"),
    ("import getpass\ntoken = getpass.getpass()\n", "getpass.getpass() waits for a secret typed at the terminal"),
])
def test_every_way_to_wait_for_standard_input_stops_the_export(source, message):
    line = 1 if source.startswith("x = __builtins__") else 2
    with pytest.raises(NotebookError) as refused:
        apply(source, LOCATION)
    assert str(refused.value).startswith(f"notebooks/02_train.ipynb, cell 4, line {line}: {message}")
    assert "every rank would wait forever\n  hint: " in str(refused.value)
    assert ("environment variable" in str(refused.value)) == ("getpass" in message)


def test_other_reads_and_streams_pass():
    assert_unchanged(
        RefuseInput,
        """\
        import sys
        sys.stdout.write("x")
        text = open("data.txt").read()
        lines = sys.stdin.isatty()
        for line in open("data.txt"):
            pass
        passwords = config.getpass
        """,
    )
