"""`--batch_layout auto`: the choice, the layout a trainer then trains with, the probe's fallback."""
import pytest
import torch

from nbddp.fallback import models as hf_backend
from nbddp.runtime.memory import fuller_batch
from nbddp.runtime.context import DistributedContext
from nbddp.runtime.memory.fuller_batch import SATURATED_TOKENS, Candidate, choose


def test_the_fullest_micro_batch_that_fits_then_the_cheapest_checkpointing():
    candidates = [Candidate(b, mode, gib) for b, mode, gib in [
        (2, "off", 10), (2, "unsloth", 6), (4, "off", 18), (4, "unsloth", 7), (8, "off", 34), (8, "unsloth", 9)]]
    assert choose(candidates, budget_gib=40, seq_len=512) == candidates[4]  # 8, off
    assert choose(candidates, budget_gib=20, seq_len=512) == candidates[5]  # 8, recompute
    assert choose(candidates, budget_gib=5, seq_len=512) is None


def test_past_a_saturated_micro_batch_cheaper_recompute_wins():
    seq_len = SATURATED_TOKENS // 4  # micro batch 4 is already saturated
    candidates = [Candidate(4, "off", 30), Candidate(16, "unsloth", 30), Candidate(16, "off", 90)]
    assert choose(candidates, budget_gib=40, seq_len=seq_len) == candidates[0]


@pytest.fixture
def patched_train(monkeypatch):
    from transformers import Trainer

    monkeypatch.setattr(Trainer, "train", Trainer.train)  # restored after the test
    fuller_batch.patch_trainer(Trainer)
    fuller_batch.patch_trainer(Trainer)  # twice is once
    return Trainer


def tiny_trainer(trainer_class, model_path, output_dir, layout, accumulation=2):
    """A Trainer on the tiny Llama with LoRA, 2 rows x 2 accumulation as the notebook writes it, built through
    `ddp.training_args` as generated code builds it."""
    from datasets import Dataset
    from transformers import TrainingArguments

    model = hf_backend.FastLanguageModel.from_pretrained(model_path, max_seq_length=64, load_in_4bit=False)[0]
    model = hf_backend.FastLanguageModel.get_peft_model(model, r=4, lora_alpha=8, use_gradient_checkpointing=False,
                                                        random_state=0)
    ddp = DistributedContext(batch_layout=layout)
    args = ddp.training_args(TrainingArguments)(
        output_dir=str(output_dir), max_steps=3, use_cpu=True, report_to="none", logging_steps=1, seed=0,
        per_device_train_batch_size=2, gradient_accumulation_steps=accumulation, learning_rate=1e-2)
    rows = [{"input_ids": ids, "labels": ids} for ids in ([1, 3 + i % 7, 4, 5 + i % 5, 2] for i in range(24))]
    return trainer_class(model=model, args=args, train_dataset=Dataset.from_list(rows))


def losses(trainer):
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def test_auto_trains_the_same_steps_in_one_fuller_micro_batch(patched_train, tiny_model_path, tmp_path, capsys):
    notebook = tiny_trainer(patched_train, tiny_model_path, tmp_path / "notebook", "notebook")
    notebook.train()
    auto = tiny_trainer(patched_train, tiny_model_path, tmp_path / "auto", "auto")
    auto.train()
    assert (auto.args.per_device_train_batch_size, auto.args.gradient_accumulation_steps) == (4, 1)
    assert (notebook.args.per_device_train_batch_size, notebook.args.gradient_accumulation_steps) == (2, 2)
    assert len(losses(auto)) == 3 and len(set(losses(auto))) == 3
    torch.testing.assert_close(losses(auto), losses(notebook), rtol=1e-5, atol=0)
    out = capsys.readouterr().out
    assert "nbddp: --batch_layout auto: micro batch 4 with gradient checkpointing off (was 2, off)" in out
    assert "global batch 4 rows = 4 per device x 1 accumulation x 1 process (the notebook: 2 x 2 x 1" in out


def grad_norms(trainer):
    return [entry["grad_norm"] for entry in trainer.state.log_history if "grad_norm" in entry]


def test_a_given_micro_batch_keeps_accumulating_and_the_gradients_their_size(patched_train, tiny_model_path,
                                                                           tmp_path):
    """2 x 4 as 4 x 2: the trainer divides by its own accumulation; accelerate's stays 1 (else every gradient would
    be halved: grad_norm 0.318 instead of 0.637 seen in review)."""
    notebook = tiny_trainer(patched_train, tiny_model_path, tmp_path / "notebook", "notebook", accumulation=4)
    notebook.train()
    given = tiny_trainer(patched_train, tiny_model_path, tmp_path / "given", "4", accumulation=4)
    given.train()
    assert (given.args.per_device_train_batch_size, given.args.gradient_accumulation_steps) == (4, 2)
    assert given.accelerator.gradient_accumulation_steps == 1
    torch.testing.assert_close(grad_norms(given), grad_norms(notebook), rtol=1e-4, atol=0)
    torch.testing.assert_close(losses(given), losses(notebook), rtol=1e-5, atol=0)


def test_an_out_of_memory_probe_keeps_the_notebooks_layout(patched_train, tiny_model_path, tmp_path, capsys,
                                                         monkeypatch):
    trainer = tiny_trainer(patched_train, tiny_model_path, tmp_path, "auto")
    forward = type(trainer.model).forward
    calls = []

    def out_of_memory_once(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory (planted)")
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(type(trainer.model), "forward", out_of_memory_once)
    trainer.train()
    assert (trainer.args.per_device_train_batch_size, trainer.args.gradient_accumulation_steps) == (2, 2)
    assert len(losses(trainer)) == 3  # trained all the same
    out = capsys.readouterr().out
    assert "micro batch 4 with checkpointing off ran out of memory on the probe step; the notebook's layout" in out


def test_a_probe_that_fails_otherwise_raises(patched_train, tiny_model_path, tmp_path, monkeypatch):
    trainer = tiny_trainer(patched_train, tiny_model_path, tmp_path, "auto")

    def broken(self, *args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered (planted)")

    monkeypatch.setattr(type(trainer.model), "forward", broken)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        trainer.train()


def test_other_layouts_and_grpo_are_left_as_planned(patched_train, tiny_model_path, tmp_path, capsys):
    trainer = tiny_trainer(patched_train, tiny_model_path, tmp_path, "auto")
    trainer.args.num_generations = 4  # as GRPOConfig has it
    trainer.train()
    assert (trainer.args.per_device_train_batch_size, trainer.args.gradient_accumulation_steps) == (2, 2)
    assert "GRPO's generation batch is laid out from the micro batch" in capsys.readouterr().out


def unsloth_like_trainer(trainer_class, model_path, output_dir, monkeypatch):
    """A trainer whose model was set up as Unsloth's `get_peft_model(use_gradient_checkpointing="unsloth")` leaves
    it: the mode recorded on the model, every layer's flag set to that string (not True), and the recorded mode
    applied to every layer again later by `for_training`, as Unsloth's trainers do when train() starts and after a
    generate(). Returns (trainer, the count of checkpoint function calls)."""
    import transformers.modeling_utils
    from datasets import Dataset
    from transformers import TrainingArguments

    calls = []
    checkpoint = transformers.modeling_utils.checkpoint  # what gradient_checkpointing_enable() gives the layers
    monkeypatch.setattr(transformers.modeling_utils, "checkpoint",
                        lambda *args, **kwargs: calls.append(1) or checkpoint(*args, **kwargs))
    model = hf_backend.FastLanguageModel.from_pretrained(model_path, max_seq_length=64, load_in_4bit=False)[0]
    model = hf_backend.FastLanguageModel.get_peft_model(model, r=4, lora_alpha=8, use_gradient_checkpointing="unsloth",
                                                        random_state=0)
    model._unsloth_gradient_checkpointing = "unsloth"

    def for_training():
        for module in model.modules():
            if hasattr(module, "gradient_checkpointing"):
                module.gradient_checkpointing = model._unsloth_gradient_checkpointing

    class UnslothLikeTrainer(trainer_class):
        def training_step(self, *args, **kwargs):
            for_training()
            return super().training_step(*args, **kwargs)

    for_training()
    args = DistributedContext(batch_layout="auto").training_args(TrainingArguments)(
        output_dir=str(output_dir), max_steps=2, use_cpu=True, report_to="none", logging_steps=1, seed=0,
        per_device_train_batch_size=2, gradient_accumulation_steps=2, gradient_checkpointing=True)
    rows = [{"input_ids": ids, "labels": ids} for ids in ([1, 3 + i % 7, 4, 5 + i % 5, 2] for i in range(16))]
    return UnslothLikeTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows)), calls


def test_checkpointing_off_is_off_under_unsloths_recorded_mode(patched_train, tiny_model_path, tmp_path, capsys,
                                                               monkeypatch):
    """Seen on an H100 before: "checkpointing off (was 2, unsloth)" printed while every layer still went through
    Unsloth's offloading checkpoint function, 32 calls a step, because its flags hold "unsloth" and its trainers
    re-apply the mode recorded at get_peft_model."""
    trainer, calls = unsloth_like_trainer(patched_train, tiny_model_path, tmp_path, monkeypatch)
    trainer.model.train()
    trainer.model(input_ids=torch.tensor([[1, 3, 4, 2]]), labels=torch.tensor([[1, 3, 4, 2]])).loss.backward()
    assert calls, "the stand-in must checkpoint before the layout switches it off"
    calls.clear()
    trainer.train()
    assert "micro batch 4 with gradient checkpointing off (was 2, true)" in capsys.readouterr().out
    assert calls == []
    assert trainer.model._unsloth_gradient_checkpointing is False


def test_a_failed_probe_gives_unsloth_its_mode_back(patched_train, tiny_model_path, tmp_path, monkeypatch):
    trainer, calls = unsloth_like_trainer(patched_train, tiny_model_path, tmp_path, monkeypatch)
    forward = type(trainer.model).forward
    failed = []

    def out_of_memory_once(self, *args, **kwargs):
        if not failed:
            failed.append(1)
            raise torch.OutOfMemoryError("CUDA out of memory (planted)")
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(type(trainer.model), "forward", out_of_memory_once)
    trainer.train()
    assert trainer.model._unsloth_gradient_checkpointing == "unsloth"
    assert calls  # the notebook's layout, with its recompute


def test_a_step_that_adds_far_less_than_the_estimate_says_the_mode_is_not_in_force():
    from nbddp.runtime.memory.gradient_checkpointing_check import mode_not_in_force

    assert mode_not_in_force("off", "the probe step", used_gib=20.0, activations_gib=27.0) is None
    warning = mode_not_in_force("off", "the probe step at micro batch 8", used_gib=2.1, activations_gib=27.0)
    assert warning.startswith("the probe step at micro batch 8 added 2.1 GiB, under 50% of the 27.0 GiB of "
                              "activations estimated with gradient checkpointing off: the layers still recompute")
