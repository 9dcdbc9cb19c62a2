"""The names of Transformers', TRL's, Unsloth's and torch's API that more than one rewrite recognises.

Types are unknown before the script runs, so the rewrites recognise code by the names it uses: a class
(`SFTConfig(...)`), a method on a class (`FastLanguageModel.for_inference(...)`), a variable named for what it
holds (`trainer.train()`). Their one home, so that the rewrites agree on what counts and a library upgrade edits
one list. A name only one rewrite recognises stays in that rewrite, beside the policy it serves.
"""

# Unsloth's model classes: `X.from_pretrained(...)` loads a model, `X.for_inference(model)` readies it to generate.
UNSLOTH_LOADERS = frozenset({"FastLanguageModel", "FastModel", "FastVisionModel"})

# Transformers' training-argument classes.
TRANSFORMERS_ARGUMENTS = frozenset({"TrainingArguments", "Seq2SeqTrainingArguments"})
# TRL's trainer configs (TrainingArguments, bf16 on by default) and Unsloth's UnslothTrainingArguments, an SFTConfig.
TRL_CONFIGS = frozenset({
    "SFTConfig",
    "DPOConfig",
    "GRPOConfig",
    "KTOConfig",
    "RewardConfig",
    "ORPOConfig",
    "CPOConfig",
    "UnslothTrainingArguments",
})
# The calls that build a trainer's arguments.
TRAINING_ARGUMENTS = TRANSFORMERS_ARGUMENTS | TRL_CONFIGS

# Transformers', TRL's and Unsloth's trainer classes, by name (rename-trainer-tokenizer's list; see is_trainer_class).
TRAINERS = frozenset({
    "Trainer",
    "Seq2SeqTrainer",
    "SFTTrainer",
    "DPOTrainer",
    "GRPOTrainer",
    "KTOTrainer",
    "ORPOTrainer",
    "CPOTrainer",
    "RewardTrainer",
    "UnslothTrainer",
})
# Trainer methods every rank must call: they sync gradients, gather metrics or wait for the save on rank 0.
TRAINER_COLLECTIVES = frozenset({"train", "evaluate", "predict", "save_model"})

# torch's device strings for the first GPU ("cuda" is the current device: GPU 0 unless set).
CUDA = ("cuda", "cuda:0")


def is_trainer_class(name: str | None) -> bool:
    """A class name ending in `Trainer`: those of TRAINERS, TRL's others (`GKDTrainer`), an author's `MyTrainer`."""
    return name is not None and name.endswith("Trainer")


def holds_trainer(name: str | None) -> bool:
    """A variable or attribute named for a trainer (`trainer`, `sft_trainer`, `self.trainer`'s `trainer`), unlike
    `model`, whose `.train()` is PyTorch's training mode."""
    return name is not None and "trainer" in name.lower()
