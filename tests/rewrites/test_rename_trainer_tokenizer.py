import ast
import importlib.util
from pathlib import Path

import pytest
from rewrite_case import LOCATION, assert_rewrites, assert_unchanged, run

from nbddp.errors import NotebookError
from nbddp.export.rewrites.rename_trainer_tokenizer import RenameTrainerTokenizer


def test_sft_trainer_tokenizer_becomes_processing_class():
    changes = assert_rewrites(
        RenameTrainerTokenizer,
        """\
        trainer = SFTTrainer(
            model = model,
            tokenizer = tokenizer,  # the chat template lives here
            train_dataset = dataset,
        )
        """,
        """\
        trainer = SFTTrainer(
            model = model,
            processing_class = tokenizer,  # the chat template lives here
            train_dataset = dataset,
        )
        """,
    )
    assert changes == [(3, "tokenizer= -> processing_class= (TRL >= 0.12 and Transformers 5 removed tokenizer=)")]


@pytest.mark.parametrize("trainer", ["Trainer", "transformers.Trainer", "trl.DPOTrainer", "GRPOTrainer",
                                     "UnslothTrainer"])
def test_other_trainers_too(trainer):
    assert_rewrites(
        RenameTrainerTokenizer,
        f"t = {trainer}(model, tokenizer=tok)\n",
        f"t = {trainer}(model, processing_class=tok)\n",
    )


def test_nested_trainer_is_found():
    code, changes = run(RenameTrainerTokenizer, "def make():\n    return SFTTrainer(model=m, tokenizer=t)\n")
    assert code == "def make():\n    return SFTTrainer(model=m, processing_class=t)\n"
    assert [line for line, _ in changes] == [2]


def test_other_calls_and_current_code_are_left_alone():
    assert_unchanged(
        RenameTrainerTokenizer,
        """\
        trainer = SFTTrainer(model=model, processing_class=tokenizer)
        model = FastLanguageModel.get_peft_model(model, tokenizer=tokenizer)
        text = apply_chat_template(messages, tokenizer=tokenizer)
        """,
    )


def test_both_names_is_an_error_at_the_line():
    with pytest.raises(NotebookError) as raised:
        run(RenameTrainerTokenizer, "t = SFTTrainer(\n    tokenizer=a,\n    processing_class=b,\n)\n")
    assert (raised.value.notebook, raised.value.cell, raised.value.line) == (LOCATION.notebook, LOCATION.cell, 2)


@pytest.mark.parametrize("module, trainer", [("sft_trainer", "SFTTrainer"), ("dpo_trainer", "DPOTrainer")])
def test_the_installed_trl_trainers_take_processing_class_and_not_tokenizer(module, trainer):
    # Read the source rather than import trl, which would import torch.
    spec = importlib.util.find_spec("trl")
    source = (Path(spec.origin).parent / "trainer" / f"{module}.py").read_text()
    init = next(
        node
        for cls in ast.walk(ast.parse(source))
        if isinstance(cls, ast.ClassDef) and cls.name == trainer
        for node in cls.body
        if isinstance(node, ast.FunctionDef) and node.name == "__init__"
    )
    parameters = [arg.arg for arg in init.args.args + init.args.kwonlyargs]
    assert "processing_class" in parameters and "tokenizer" not in parameters
