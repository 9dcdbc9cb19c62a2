"""The keyword arguments that Unsloth lets TRL's trainers take, for the hf backend.

Notebooks from Unsloth's era build their trainer like this:

    trainer = SFTTrainer(
        model=model, tokenizer=tokenizer, train_dataset=dataset,
        dataset_text_field="text", max_seq_length=2048, dataset_num_proc=2, packing=False,
        args=TrainingArguments(per_device_train_batch_size=2, max_steps=60, ...),
    )
    dpo_trainer = DPOTrainer(model=model, ref_model=None, tokenizer=tokenizer, beta=0.1, max_length=1024,
                             args=DPOConfig(...), train_dataset=...)

Since TRL 0.13, the trainers take none of `dataset_text_field`, `max_seq_length`, `beta`, ...: they are fields of
the trainer's config (`max_seq_length` is now `max_length`), and `tokenizer` is now `processing_class`. Importing
Unsloth patches every TRL trainer to move such arguments into its config (unsloth/trainer.py,
`_patch_trl_trainer` and `_backwards_compatible_trainer`), so these notebooks run there. On the hf backend nothing
imports Unsloth, so `patch_trl()` makes the same move for the trainers the notebooks use (SFT, GRPO, DPO, ORPO),
takes a list of rows as a dataset, and lets their configs take the keywords Transformers 5 and TRL 1.x renamed (`rl_config_compat`). Unsloth's own
`SFTConfig` also takes `max_seq_length=` (its compiled `UnslothSFTConfig`), which TRL's refuses; `patch_sft_config`
lets it set `max_length` there too.

An SFT dataset that has the `dataset_text_field` column the author named and also a chat column ("messages",
"conversations"), a notebook's formatted text beside the turns it came from, trains on the text, as Unsloth's
`sft_prepare_dataset` (unsloth_zoo/dataset_utils.py) decides; TRL would render the chats with the chat template
(and fail on ShareGPT's "human"/"gpt" roles). The chat columns are dropped from the trainer's copy of the dataset.

A plain `TrainingArguments` is converted as TRL itself converts one, from `args.to_dict()`, so a value the author
left unset keeps its `TrainingArguments` default (learning rate 5e-5, no gradient checkpointing, logging every 500
steps, bf16 off) rather than taking the config's. The trainer's own config is kept, with the moved values set on
it, as Unsloth does: building it again would run its checks again (GRPOConfig refuses the generation batch it
derived itself).
"""
import dataclasses
import functools
import importlib
import inspect
import warnings

from nbddp import patches
from nbddp.errors import UsageError
from nbddp.fallback import rl_config_compat

# (module, trainer, config) of the trainers Unsloth's notebooks build; those not importable here are skipped.
TRAINERS = (
    ("trl", "SFTTrainer", "SFTConfig"),
    ("trl", "GRPOTrainer", "GRPOConfig"),
    ("trl", "DPOTrainer", "DPOConfig"),
    ("trl", "ORPOTrainer", "ORPOConfig"),  # TRL 0.x
    ("trl.experimental.orpo", "ORPOTrainer", "ORPOConfig"),  # TRL 1.x
)
MOVED_TO_EXPERIMENTAL = {"ORPOConfig": "trl.experimental.orpo", "ORPOTrainer": "trl.experimental.orpo"}


def patch_trl() -> None:
    """Patch the trainers and configs of TRAINERS (see the module's docstring), and make `from trl import
    ORPOTrainer` a UsageError saying where TRL 1.x moved it. Patching twice is once."""
    import trl

    coerce_availability_flags(_import("trl.import_utils"))
    alias_vision_mapping(_import("transformers.models.auto.modeling_auto"))
    for module_name, trainer_name, config_name in TRAINERS:
        module = _import(module_name)
        if module is None or trainer_name not in dir(module):
            continue
        config_class = getattr(module, config_name)
        patch_trainer(getattr(module, trainer_name), config_class)
        rl_config_compat.patch_config(config_class)
    patch_sft_config(trl.SFTConfig)
    refuse_moved_names(trl)


def coerce_availability_flags(import_utils) -> None:
    """Make the `_<package>_available` flags TRL cached in `import_utils` (trl.import_utils) booleans. TRL 0.x caches
    Transformers' `_is_package_available(package)`, which Transformers 5 returns as `(exists, None)`: true also
    without the package, so TRL 0.22's GRPO trainer imports vLLM, which is not there. Importing Unsloth makes them
    booleans too (unsloth/import_fixes.py, `_coerce_trl_available_checks`)."""
    for name, value in list(vars(import_utils).items()) if import_utils is not None else []:
        if name.startswith("_") and name.endswith("_available") and isinstance(value, tuple):
            patches.set_attribute("trl-availability-flags", import_utils, name, bool(value and value[0]))


def alias_vision_mapping(modeling_auto) -> None:
    """Give `modeling_auto` (transformers.models.auto.modeling_auto) back MODEL_FOR_VISION_2_SEQ_MAPPING_NAMES, which
    TRL 0.22's DPO trainer imports and Transformers 5 renamed MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES, as
    importing Unsloth does (unsloth_zoo/temporary_patches/misc.py, `patch_trl_vision_model_mapping`)."""
    renamed = getattr(modeling_auto, "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES", None)
    if renamed is not None and not hasattr(modeling_auto, "MODEL_FOR_VISION_2_SEQ_MAPPING_NAMES"):
        patches.set_attribute("trl-vision-mapping-name", modeling_auto, "MODEL_FOR_VISION_2_SEQ_MAPPING_NAMES", renamed)


def patch_trainer(trainer_class, config_class) -> None:
    """Let `trainer_class.__init__` (a TRL trainer) take Unsloth's keyword arguments, moving those it does not name
    into its `args`, a `config_class`; patching twice is once."""
    def make(original):
        trainer_parameters = set(inspect.signature(original).parameters)

        @functools.wraps(original)
        def __init__(self, *args, **kwargs):
            if "tokenizer" in kwargs and "processing_class" in trainer_parameters:
                kwargs["processing_class"] = kwargs.pop("tokenizer")
            for name in ("train_dataset", "eval_dataset"):
                if isinstance(kwargs.get(name), (list, tuple)):  # the vision notebooks' rows: TRL 1.x wants a Dataset
                    kwargs[name] = datasets_from_rows(kwargs[name])
                if config_class.__name__ == "SFTConfig" and kwargs.get(name) is not None:
                    kwargs[name] = text_over_chats(kwargs[name], kwargs)
            config_arguments = {name: kwargs.pop(name) for name in list(kwargs) if name not in trainer_parameters}
            training_args = kwargs.get("args")
            if config_arguments and training_args is not None:
                kwargs["args"] = with_config_arguments(config_class, training_args, config_arguments)
            elif config_arguments:
                _refuse_without_config(trainer_class, config_class, config_arguments)
                kwargs.update(config_arguments)  # none of them a config's: TRL's own TypeError names them
            original(self, *args, **kwargs)

        return __init__

    patches.wrap("trl-unsloth-arguments", trainer_class, "__init__", make)


CHAT_COLUMNS = ("messages", "conversations")


def text_over_chats(dataset, kwargs):
    """`dataset` without its chat columns when it also has the text column `dataset_text_field` names (a trainer
    keyword or its config's; no formatting_func, no assistant_only_loss): see the module's docstring."""
    args = kwargs.get("args")
    field = kwargs.get("dataset_text_field", getattr(args, "dataset_text_field", None))
    columns = getattr(dataset, "column_names", None)
    if (not field or not isinstance(columns, list) or field not in columns or kwargs.get("formatting_func")
            or getattr(args, "assistant_only_loss", False)):
        return dataset
    chats = [column for column in CHAT_COLUMNS if column in columns]
    return dataset.remove_columns(chats) if chats else dataset


def datasets_from_rows(rows):
    """A `datasets.Dataset` of `rows` (dicts), as Unsloth lets SFTTrainer and GRPOTrainer take a list
    (unsloth/models/rl.py, `_allow_list_train_dataset`) where TRL 1.10+ refuses one. PIL images inside messages
    are stored as Arrow's {"bytes", "path"}, which the fallback's vision collator decodes (vision_collator)."""
    from datasets import Dataset

    return Dataset.from_list(list(rows))


def with_config_arguments(config_class, training_args, config_arguments: dict):
    """`training_args` with `config_arguments` (Unsloth's names) set: on it when it is a `config_class` already, else
    on a `config_class` built from it (`config_from`)."""
    if not isinstance(training_args, config_class):
        return config_from(config_class, training_args, config_arguments)
    arguments = rl_config_compat.forward(config_class, _trl_names(config_class, config_arguments))
    fields = {field.name for field in dataclasses.fields(config_class)}
    for name, value in arguments.items():
        if name not in fields:  # what building the config with it would say
            raise TypeError(f"{config_class.__name__}.__init__() got an unexpected keyword argument {name!r}")
        setattr(training_args, name, value)
    return training_args


def config_from(config_class, training_args, config_arguments: dict):
    """A `config_class` holding every value of `training_args`, plus `config_arguments` (Unsloth's names)."""
    values = training_args.to_dict()
    # to_dict masks every `*_token` field ("<HUB_TOKEN>"; SFTConfig's eos_token and pad_token too); TRL restores
    # hub_token the same way when it converts TrainingArguments itself.
    values.update({name: getattr(training_args, name) for name in values if name.endswith("_token")})
    config = config_class(**{**values, **_trl_names(config_class, config_arguments)})
    if hasattr(training_args, "nbddp_batch_plan"):  # ddp.training_args's layout (batch_plan) goes with it
        config.nbddp_batch_plan = training_args.nbddp_batch_plan
    return config


def patch_sft_config(config_class) -> None:
    """Let `config_class(max_seq_length=N)` (`trl.SFTConfig`) mean `max_length=N`, as Unsloth's SFTConfig takes it;
    a `max_length` given too wins. The value stays readable as `config.max_seq_length`. Patching twice is once."""
    def make(original):
        @functools.wraps(original)
        def __init__(self, *args, **kwargs):
            max_seq_length = kwargs.pop("max_seq_length", None)
            if max_seq_length is not None:
                kwargs.setdefault("max_length", max_seq_length)
            original(self, *args, **kwargs)
            self.max_seq_length = max_seq_length

        return __init__

    patches.wrap("sft-max-seq-length", config_class, "__init__", make)


class MovedName(UsageError, ImportError):
    """`from trl import X` for an X that TRL 1.x moved. An ImportError too, which is what a probe for the name
    expects (training_overrides'): a `getattr(trl, X, None)` gets it rather than None."""


def refuse_moved_names(trl) -> None:
    """Make `from trl import X`, for an X of MOVED_TO_EXPERIMENTAL that this TRL no longer has, a MovedName error
    that says where it is. Unsloth leaves these names out of `trl` too (it patches trl.experimental's classes where
    they are), so such a notebook fails under Unsloth with an ImportError that does not."""
    moved = {name: module for name, module in MOVED_TO_EXPERIMENTAL.items() if name not in dir(trl)}
    if not moved or patches.is_patched(vars(trl).get("__getattr__"), "trl-moved-names"):
        return
    lazy_getattr = getattr(type(trl), "__getattr__", None)  # TRL's lazy module loads its names on first use

    def __getattr__(name):
        if name in moved:
            names = ", ".join(sorted(other for other, module in moved.items() if module == moved[name]))
            raise MovedName(
                f"`from trl import {name}`: TRL 1.x moved {name} to {moved[name]} (trl {trl.__version__} is installed), "
                f"and Unsloth does not put it back. Import it from there (`from {moved[name]} import {names}`), or "
                f"run the notebook on the stack it was written for (transformers==4.56.2, trl==0.22.2: "
                f"requirements-notebooks.txt).")
        if lazy_getattr is None:
            raise AttributeError(f"module 'trl' has no attribute {name!r}")
        return lazy_getattr(trl, name)

    # A module's own __getattr__ (PEP 562) is asked before its class's.
    patches.wrap("trl-moved-names", trl, "__getattr__", lambda _lazy: __getattr__)


def _refuse_without_config(trainer_class, config_class, config_arguments) -> None:
    """UsageError for the first of `config_arguments` that is a setting of `config_class` (by its name, or by the
    name it had): with no `args=` there is no config to move it into, and Unsloth passes it on to fail in TRL."""
    trainer, config = trainer_class.__name__, config_class.__name__
    for key in config_arguments:
        name = key if key in _unsloth_only(config_class) else rl_config_compat.current_name(config_class, key)
        if name is not None:
            raise UsageError(
                f"{trainer}({key}=...): `{key}` is a setting of {config}, not an argument of {trainer}, and this "
                f"{trainer} has no `args=` to move it into (Unsloth moves it only into a config you pass). Pass it in "
                f"the config: {trainer}(..., args={config}({name}=..., ...)).")


def _trl_names(config_class, config_arguments: dict) -> dict:
    """`config_arguments` with `max_seq_length` as TRL names it, `max_length` (Unsloth sets one from the other)."""
    arguments = dict(config_arguments)
    if "max_seq_length" in _unsloth_only(config_class) and "max_seq_length" in arguments:
        arguments["max_length"] = arguments.pop("max_seq_length")
    return arguments


def _unsloth_only(config_class) -> set:
    """Keywords Unsloth's compiled `config_class` adds: `max_seq_length`, where TRL's has only `max_length`."""
    fields = {field.name for field in dataclasses.fields(config_class)}
    return {"max_seq_length"} if "max_length" in fields and "max_seq_length" not in fields else set()


def _import(module_name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # trl.experimental warns on import that its APIs may change
        try:
            return importlib.import_module(module_name)
        except ImportError:
            return None
