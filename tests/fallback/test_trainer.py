"""`unsloth.trainer`'s UnslothTrainer and UnslothTrainingArguments on the hf backend
(nbddp/fallback/trainer.py)."""
import sys

import pytest
from datasets import Dataset

from nbddp.runtime import backend as backends
from nbddp.fallback import trainer as hf_trainer
from nbddp.fallback.models import FastLanguageModel


@pytest.fixture
def hf_backend_active(monkeypatch, backend_patches_undone_after):
    for name in ("unsloth", "unsloth.chat_templates", "unsloth.trainer"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    backends.activate("hf")


def cpt_trainer(model, tokenizer, tmp_path, **args):
    """As Unsloth's continued-pretraining notebooks build it: Unsloth's SFTTrainer arguments beside `args`."""
    from unsloth import UnslothTrainer, UnslothTrainingArguments

    return UnslothTrainer(
        model=model,
        tokenizer=tokenizer,
        train_dataset=Dataset.from_dict({"text": ["the cat sat on the mat", "a dog ran far away"]}),
        dataset_text_field="text",
        max_seq_length=32,
        args=UnslothTrainingArguments(
            per_device_train_batch_size=2, max_steps=1, learning_rate=5e-5, weight_decay=0.01,
            output_dir=str(tmp_path / "outputs"), report_to="none", bf16=False, **args),
    )


def learning_rates(trainer):
    """{parameter name: its learning rate} in the trainer's optimizer."""
    names = {id(parameter): name for name, parameter in trainer.model.named_parameters()}
    return {names[id(p)]: group["lr"] for group in trainer.create_optimizer().param_groups for p in group["params"]}


def test_the_embeddings_train_at_their_own_rate(hf_backend_active, tiny_model_path, tmp_path):
    model, tokenizer = FastLanguageModel.from_pretrained(tiny_model_path, max_seq_length=32, load_in_4bit=False)
    model = FastLanguageModel.get_peft_model(model, r=4, target_modules=["q_proj", "v_proj", "embed_tokens", "lm_head"])
    rates = learning_rates(cpt_trainer(model, tokenizer, tmp_path, embedding_learning_rate=1e-5))
    embeddings = {name for name in rates if ".modules_to_save." in name}
    assert {name.split(".modules_to_save.")[0].rsplit(".", 1)[-1] for name in embeddings} == {"embed_tokens", "lm_head"}
    assert {rates[name] for name in embeddings} == {1e-5}
    assert {rate for name, rate in rates.items() if name not in embeddings} == {5e-5}
    assert any("lora_A" in name for name in rates)


def test_full_finetuning_finds_the_embeddings_by_identity(hf_backend_active, tiny_model_path, tmp_path):
    model, tokenizer = FastLanguageModel.from_pretrained(tiny_model_path, max_seq_length=32, load_in_4bit=False)
    rates = learning_rates(cpt_trainer(model, tokenizer, tmp_path, embedding_learning_rate=1e-5))
    assert rates["model.embed_tokens.weight"] == rates["lm_head.weight"] == 1e-5
    assert rates["model.layers.0.self_attn.q_proj.weight"] == 5e-5


def test_without_an_embedding_rate_it_is_sfttrainers_optimizer(hf_backend_active, tiny_model_path, tmp_path):
    model, tokenizer = FastLanguageModel.from_pretrained(tiny_model_path, max_seq_length=32, load_in_4bit=False)
    model = FastLanguageModel.get_peft_model(model, r=4, target_modules=["q_proj", "embed_tokens"])
    trainer = cpt_trainer(model, tokenizer, tmp_path)
    assert set(learning_rates(trainer).values()) == {5e-5}
    assert trainer.args.max_length == 32  # Unsloth's max_seq_length reached the config


def test_unsloth_exports_the_trainer_names(hf_backend_active):
    import unsloth
    from unsloth.trainer import UnslothVisionDataCollator

    assert unsloth.UnslothTrainer is hf_trainer.UnslothTrainer
    assert unsloth.trainer is hf_trainer
    assert UnslothVisionDataCollator is unsloth.UnslothVisionDataCollator
