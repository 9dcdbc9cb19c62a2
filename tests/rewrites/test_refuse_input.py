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
