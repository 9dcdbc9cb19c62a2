"""The keyword arguments that Unsloth lets `trl.SFTTrainer` take, for the hf backend.

Notebooks from Unsloth's era build their trainer like this:

    trainer = SFTTrainer(
        model=model, tokenizer=tokenizer, train_dataset=dataset,
        dataset_text_field="text", max_seq_length=2048, dataset_num_proc=2, packing=False,
        args=TrainingArguments(per_device_train_batch_size=2, max_steps=60, ...),
    )

Since TRL 0.13 (ours is 1.14), `SFTTrainer` takes none of `dataset_text_field`, `max_seq_length`, `packing` or
`dataset_num_proc`: they are `SFTConfig` fields, and `max_seq_length` is now `max_length`; `tokenizer` is now
`processing_class`. Importing Unsloth patches every TRL trainer to move such arguments into its config
(unsloth/trainer.py, `_patch_trl_trainer` and `_backwards_compatible_trainer`), so these notebooks run there. On the
hf backend nothing imports Unsloth, so `patch_sft_trainer(SFTTrainer, SFTConfig)` makes the same move.
Unsloth's own `SFTConfig` also takes `max_seq_length=` (its compiled `UnslothSFTConfig`), which TRL's refuses;
`patch_sft_config(SFTConfig)` lets it set `max_length` there too.

The notebook's `args` are kept as they are: the config is built from `args.to_dict()`, as TRL itself converts a
plain `TrainingArguments`, so a value the author left unset keeps its `TrainingArguments` default (learning rate
5e-5, no gradient checkpointing, logging every 500 steps, bf16 off) rather than taking `SFTConfig`'s.
"""
import functools
import inspect


def patch_sft_trainer(trainer_class, config_class) -> None:
    """Let `trainer_class.__init__` (`trl.SFTTrainer`) take Unsloth's keyword arguments; patching twice is once."""
    original = trainer_class.__init__
    if getattr(original, "nbddp_takes_unsloth_arguments", False):
        return
    trainer_parameters = set(inspect.signature(original).parameters)

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        if "tokenizer" in kwargs:
            kwargs["processing_class"] = kwargs.pop("tokenizer")
        config_arguments = {name: kwargs.pop(name) for name in list(kwargs) if name not in trainer_parameters}
        training_args = kwargs.get("args")
        if config_arguments and training_args is not None:
            kwargs["args"] = config_from(config_class, training_args, config_arguments)
        else:  # nothing to move, or no config to move it into: TRL's own TypeError names the argument
            kwargs.update(config_arguments)
        original(self, *args, **kwargs)

    __init__.nbddp_takes_unsloth_arguments = True
    trainer_class.__init__ = __init__


def config_from(config_class, training_args, config_arguments: dict):
    """A `config_class` holding every value of `training_args`, plus `config_arguments` (Unsloth's names)."""
    values = training_args.to_dict()
    # to_dict masks every `*_token` field ("<HUB_TOKEN>"; SFTConfig's eos_token and pad_token too); TRL restores
    # hub_token the same way when it converts TrainingArguments itself.
    values.update({name: getattr(training_args, name) for name in values if name.endswith("_token")})
    config_arguments = dict(config_arguments)
    if "max_seq_length" in config_arguments:  # TRL renamed it; Unsloth sets max_length from it
        config_arguments["max_length"] = config_arguments.pop("max_seq_length")
    config = config_class(**{**values, **config_arguments})
    if hasattr(training_args, "nbddp_batch_plan"):  # ddp.training_args's layout (batch_plan) goes with it
        config.nbddp_batch_plan = training_args.nbddp_batch_plan
    return config


def patch_sft_config(config_class) -> None:
    """Let `config_class(max_seq_length=N)` (`trl.SFTConfig`) mean `max_length=N`, as Unsloth's SFTConfig takes it;
    a `max_length` given too wins. The value stays readable as `config.max_seq_length`. Patching twice is once."""
    original = config_class.__init__
    if getattr(original, "nbddp_takes_max_seq_length", False):
        return

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        max_seq_length = kwargs.pop("max_seq_length", None)
        if max_seq_length is not None:
            kwargs.setdefault("max_length", max_seq_length)
        original(self, *args, **kwargs)
        self.max_seq_length = max_seq_length

    __init__.nbddp_takes_max_seq_length = True
    config_class.__init__ = __init__
