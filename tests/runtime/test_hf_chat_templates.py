"""`unsloth.chat_templates.train_on_responses_only` on the hf backend (nbddp/runtime/hf_chat_templates.py)."""
import sys

import pytest
from trl import SFTConfig, SFTTrainer

from nbddp.runtime import backends
from nbddp.runtime.hf_chat_templates import IGNORE_INDEX, response_labels

X = IGNORE_INDEX
USER, ASSISTANT = [7, 8], [9]  # marker token ids


def test_labels_run_from_each_response_to_the_next_instruction():
    ids = [1, 7, 8, 3, 4, 9, 5, 6, 7, 8, 3, 9, 5, 2]
    assert response_labels(ids, ids, USER, ASSISTANT) == [X, X, X, X, X, X, 5, 6, X, X, X, X, 5, 2]


def test_last_response_only():
    ids = [7, 8, 3, 9, 5, 6, 7, 8, 3, 9, 5, 2]
    assert response_labels(ids, ids, USER, ASSISTANT, last_response_only=True) == [X] * 10 + [5, 2]


def test_labels_already_masked_stay_masked():
    ids = [7, 8, 3, 9, 5, 6]
    assert response_labels(ids, [X, X, X, X, X, 6], USER, ASSISTANT) == [X, X, X, X, X, 6]


def test_a_row_without_a_response_is_all_masked():
    ids = [7, 8, 3, 4, 5]
    assert response_labels(ids, ids, USER, ASSISTANT) == [X] * 5


@pytest.fixture
def hf_backend_active(monkeypatch, backend_patches_undone_after):
    monkeypatch.delitem(sys.modules, "unsloth", raising=False)
    monkeypatch.delitem(sys.modules, "unsloth.chat_templates", raising=False)
    backends.activate("hf")


@pytest.fixture
def trainer(hf_backend_active, tiny_model_path, tmp_path):
    """An SFTTrainer on the tiny Llama; rows read "ran far <question> sat on <answer>", the tiny vocabulary's chat."""
    from datasets import Dataset
    from unsloth import FastLanguageModel

    model, tokenizer = FastLanguageModel.from_pretrained(tiny_model_path, max_seq_length=64, load_in_4bit=False)
    model = FastLanguageModel.get_peft_model(model, r=4, lora_alpha=8)
    rows = [
        "ran far the cat sat on the mat",
        "ran far a cat sat on away ran far a dog sat on the dog",  # two turns
        "ran far the dog",  # no answer to train on
    ]
    return SFTTrainer(
        model=model,
        processing_class=tokenizer,
        train_dataset=Dataset.from_dict({"text": rows * 2}),
        eval_dataset={"held_out": Dataset.from_dict({"text": rows[:1]})},
        args=SFTConfig(output_dir=str(tmp_path / "outputs"), max_steps=1, per_device_train_batch_size=2, bf16=False, report_to="none"),
    )


def answer_labels(row):
    return [label for label in row["labels"] if label != IGNORE_INDEX]


def test_trains_on_the_answers_only(trainer, capsys):
    from unsloth.chat_templates import train_on_responses_only  # as the notebooks import it

    tokenizer = trainer.processing_class
    words = tokenizer.convert_ids_to_tokens
    assert train_on_responses_only(trainer, instruction_part="ran far", response_part="sat on") is trainer
    assert "dropped 2 of 6 rows of train_dataset" in capsys.readouterr().out
    assert words(answer_labels(trainer.train_dataset[0])) == ["the", "mat", "</s>"]
    assert words(answer_labels(trainer.train_dataset[1])) == ["away", "the", "dog", "</s>"]
    assert words(answer_labels(trainer.eval_dataset["held_out"][0])) == ["the", "mat", "</s>"]
    batch = next(iter(trainer.get_train_dataloader()))
    trained_tokens = (batch["labels"] != IGNORE_INDEX).sum(dim=1)
    assert (trained_tokens > 0).all() and (trained_tokens < batch["attention_mask"].sum(dim=1)).all()  # the collator kept them
    trainer.train()
    assert trainer.state.global_step == 1


def test_markers_that_never_occur_are_an_error(trainer):
    from unsloth.chat_templates import train_on_responses_only

    with pytest.raises(ValueError, match="no row of train_dataset contains response_part 'mat far'"):
        train_on_responses_only(trainer, instruction_part="ran far", response_part="mat far")


def test_both_markers_are_needed(trainer):
    from unsloth.chat_templates import train_on_responses_only

    with pytest.raises(ValueError, match="needs both instruction_part and response_part"):
        train_on_responses_only(trainer, response_part="sat on")


def test_return_function_gives_the_batch_function(trainer):
    from unsloth.chat_templates import train_on_responses_only

    add_labels = train_on_responses_only(trainer, instruction_part="ran far", response_part="sat on", return_function=True)
    tokenizer = trainer.processing_class
    ids = tokenizer("ran far the cat sat on the mat", add_special_tokens=False)["input_ids"]
    (labels,) = add_labels({"input_ids": [ids]})["labels"]
    assert tokenizer.convert_ids_to_tokens([label for label in labels if label != IGNORE_INDEX]) == ["the", "mat"]


def test_unsloths_other_chat_template_helpers_are_bad_input_that_says_what_to_do(hf_backend_active):
    from nbddp.errors import UsageError

    with pytest.raises(UsageError, match="unsloth.chat_templates.get_chat_template is Unsloth's; .*tokenizer.chat_template"):
        from unsloth.chat_templates import get_chat_template  # noqa: F401
    with pytest.raises(ImportError, match="cannot import name 'no_such_helper'"):
        from unsloth.chat_templates import no_such_helper  # noqa: F401
