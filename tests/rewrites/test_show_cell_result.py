import pytest
from rewrite_case import assert_rewrites, assert_unchanged, run

from nbddp.export.rewrites.show_cell_result import ShowCellResult

SHOWN = "is shown once unless None, as Jupyter shows a cell's last value"


def test_the_last_expression_is_shown_once():
    changes = assert_rewrites(
        ShowCellResult,
        """\
        outputs = model.generate(**inputs, max_new_tokens = 64, use_cache = True)
        tokenizer.batch_decode(outputs)  # the answer
        """,
        """\
        outputs = model.generate(**inputs, max_new_tokens = 64, use_cache = True)
        ddp.show(tokenizer.batch_decode(outputs))  # the answer
        """,
    )
    assert changes == [(2, f"tokenizer.batch_decode(outputs) {SHOWN}")]


def test_a_bare_tuple_is_shown_as_one_value():
    assert_rewrites(ShowCellResult, "ok, info\n", "ddp.show((ok, info))\n")
    assert_rewrites(ShowCellResult, "(ok, info)\n", "ddp.show((ok, info))\n")


def test_only_the_last_statement_and_only_at_the_top_level():
    assert_rewrites(ShowCellResult, "dataset[0]\nx = 1; dataset[5]\n", "dataset[0]\nx = 1; ddp.show(dataset[5])\n")
    assert_unchanged(ShowCellResult, "for row in rows:\n    row\n")
    assert_unchanged(ShowCellResult, "if True:\n    dataset\n")
    assert_unchanged(ShowCellResult, "stats = trainer.train()\n")
    assert_unchanged(ShowCellResult, "")


def test_a_collective_call_stays_on_every_rank_inside_show():
    assert_rewrites(ShowCellResult, "trainer.evaluate()\n", "ddp.show(trainer.evaluate())\n")


@pytest.mark.parametrize("cell", [
    "dataset[0];\n",  # Jupyter shows nothing after a semicolon
    "print(dataset[0])\n",
    "display(dataset[0])\n",
    "plt.show()\n",
    'model.save_pretrained("lora_model")\n',
    'model.push_to_hub_merged("me/model", tokenizer)\n',
    "ddp.barrier()\n",  # put last by guard-rank0-side-effects: a second export must change nothing
])
def test_what_jupyter_does_not_show_or_prints_by_itself_is_left_alone(cell):
    assert_unchanged(ShowCellResult, cell)


def test_a_long_expression_is_named_by_its_first_line():
    code, changes = run(ShowCellResult, "tokenizer.apply_chat_template(\n    messages,\n    tokenize = False,\n)\n")
    assert code.startswith("ddp.show(tokenizer.apply_chat_template(")
    assert changes == [(1, f"tokenizer.apply_chat_template(... {SHOWN}")]


def test_a_tracker_call_ending_the_cell_is_left_to_the_main_process_guard():
    # guard-rank0-side-effects then runs it on the main process only; inside ddp.show(...) rank 1 would call it too.
    assert_unchanged(ShowCellResult, 'wandb.log({"loss": loss})\n')
    assert_unchanged(ShowCellResult, 'run = wandb.init(project="p")\nrun.finish()\n')
    assert_rewrites(ShowCellResult, "run = make_run()\nrun.summary\n", "run = make_run()\nddp.show(run.summary)\n")
