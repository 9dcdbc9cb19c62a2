"""The hf backend's `unsloth.trainer`: `UnslothTrainer`, `UnslothTrainingArguments`, `UnslothVisionDataCollator`.

    from unsloth import UnslothTrainer, UnslothTrainingArguments
    trainer = UnslothTrainer(
        model=model, tokenizer=tokenizer, train_dataset=dataset, dataset_text_field="text",
        args=UnslothTrainingArguments(learning_rate=5e-5, embedding_learning_rate=1e-5, ...),
    )

As in Unsloth (unsloth/trainer.py), `UnslothTrainingArguments` is TRL's `SFTConfig` plus `embedding_learning_rate`,
and `UnslothTrainer` is TRL's `SFTTrainer` whose optimizer trains the embeddings (`embed_tokens` and `lm_head`,
which get_peft_model puts in `modules_to_save` when they are listed in `target_modules`, or the model's own
embeddings under full finetuning) at that rate and everything else at `learning_rate`. The rate is no dataclass
field: it lasts because trl_compat sets Unsloth's SFTTrainer arguments (`dataset_text_field=`, ...) on the config
the notebook built rather than rebuilding it. Not carried over: Q-GaLore, LoRA+ (`loraplus_lr_ratio`) and Unsloth's
own gradient-accumulation loop.
"""
import torch
from trl import SFTConfig, SFTTrainer

from nbddp.fallback.vision_collator import UnslothVisionDataCollator

__all__ = ["UnslothTrainer", "UnslothTrainingArguments", "UnslothVisionDataCollator"]


class UnslothTrainingArguments(SFTConfig):
    """SFTConfig with `embedding_learning_rate` (None: the embeddings train at `learning_rate`)."""

    def __init__(self, embedding_learning_rate: float | None = None, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.embedding_learning_rate = embedding_learning_rate


class UnslothTrainer(SFTTrainer):
    """SFTTrainer that trains the embeddings at `args.embedding_learning_rate`, when set."""

    def create_optimizer(self, model=None):
        embedding_learning_rate = getattr(self.args, "embedding_learning_rate", None)
        if embedding_learning_rate is None or self.optimizer is not None:
            # Transformers 4's create_optimizer takes no model; 5's takes one
            return super().create_optimizer() if model is None else super().create_optimizer(model)
        model = self.model if model is None else model
        optimizer_class, optimizer_kwargs = self.get_optimizer_cls_and_kwargs(self.args, model)
        embeddings = _embedding_weight_ids(model)
        decay = set(self.get_decay_parameter_names(model))
        groups = []
        for embedding, learning_rate in ((False, optimizer_kwargs["lr"]), (True, embedding_learning_rate)):
            for decays in (True, False):
                parameters = [
                    parameter for name, parameter in model.named_parameters() if parameter.requires_grad
                    and (".modules_to_save." in name or id(parameter) in embeddings) == embedding
                    and (name in decay) == decays
                ]
                if parameters:  # no empty groups, as in Unsloth (Adafactor's schedule reads each group's first)
                    weight_decay = self.args.weight_decay if decays else 0.0
                    groups.append({"params": parameters, "lr": learning_rate, "weight_decay": weight_decay})
        self.optimizer = optimizer_class(groups, **optimizer_kwargs)
        return self.optimizer


def _embedding_weight_ids(model) -> set[int]:
    """The input and output embedding weights (full finetuning has no modules_to_save copies to go by)."""
    modules = (model.get_input_embeddings(), model.get_output_embeddings())
    return {id(module.weight) for module in modules if isinstance(getattr(module, "weight", None), torch.Tensor)}
