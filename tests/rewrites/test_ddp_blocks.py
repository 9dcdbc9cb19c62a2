import libcst as cst
import pytest

from nbddp.export.rewrites.ddp_blocks import is_collective, main_process_first_block, rank0_block


def test_main_process_first_block_wraps_the_cell_and_keeps_its_comments():
    module = cst.parse_module("# data\nds = load('x')\n\nds = ds.map(f)  # text\n")
    assert main_process_first_block(module).code == (
        "# data\nwith ddp.main_process_first():\n    ds = load('x')\n\n    ds = ds.map(f)  # text\n"
    )


def test_blocks_keep_a_two_space_indent_and_leave_blank_lines_blank():
    module = cst.parse_module("if x:\n  y = 1\n\n  z = 2\n")
    assert rank0_block(module).code == "if ddp.is_main_process:\n  if x:\n    y = 1\n\n    z = 2\nddp.barrier()\n"


@pytest.mark.parametrize(
    "call, collective",
    [
        ("trainer.train()", True),
        ("self.trainer.evaluate()", True),
        ("dpo_trainer.save_model('x')", True),
        ("ddp.barrier()", True),
        ("ddp.main_process_first()", True),
        ("model.train()", False),
        ("model.save_pretrained('x')", False),
        ("train()", False),
    ],
)
def test_collective_calls(call, collective):
    assert is_collective(cst.parse_expression(call)) is collective
