"""Training-config keywords that Transformers 5 and TRL 1.x renamed or removed, for the hf backend.

Most of Unsloth's notebooks were written for transformers 4.56 and trl 0.22 (their install cell pins them):
`GRPOConfig(warmup_ratio=0.1, max_prompt_length=256, ...)`. Unsloth's compiled configs pass their keywords
through unsloth/models/rl_config_compat.py: a keyword the installed config no longer takes, with a documented new
name, is forwarded to that name with a one-line notice; a removed one is dropped with one warning that names it and
gives the library's advice. `forward` does the same for the same keywords (the tables below are Unsloth
2026.10.9's), with the same words, so a notebook runs on the fallback as it runs under Unsloth. A removed keyword
given on the command line (`--set`) is the user's own and is refused instead (`current_name`). Only keywords the
config rejects are looked up, so on the notebooks' own stack nothing changes.
The other way round, a notebook pinning an older TRL may pass a keyword a later TRL added (`TRL_ADDED`); Unsloth
drops any keyword its config does not take, with a notice. `forward` drops it too when its value asks for what the
older TRL always does (`SFTConfig(loss_type="nll")` on TRL 0.22), and refuses any other value.
"""
import dataclasses
import functools
import inspect

from nbddp import patches
from nbddp.errors import UsageError
from nbddp.rank import is_main_process

# Straight renames (rl_config_compat's TRL_CONFIG_RENAMES, then TRANSFORMERS_CONFIG_RENAMES; TRL's are looked up first).
TRL_RENAMES = {
    "use_liger_loss": "use_liger_kernel",
    "vllm_guided_decoding_regex": "vllm_structured_outputs_regex",
    "wandb_log_unique_prompts": "log_unique_prompts",
}
TRANSFORMERS_RENAMES = {
    "warmup_ratio": "warmup_steps",  # transformers 5's warmup_steps takes a ratio as a float below 1
    "push_to_hub_token": "hub_token",
    "per_gpu_train_batch_size": "per_device_train_batch_size",
    "per_gpu_eval_batch_size": "per_device_eval_batch_size",
}

# Removed keywords, and what to do instead (rl_config_compat's TRL_REMOVED_FIELD_ADVICE, then
# TRANSFORMERS_REMOVED_FIELD_ADVICE).
TRL_REMOVED = {
    "max_prompt_length": "filter overlong prompts out of your dataset before training instead",
    "max_completion_length": "use `max_length` to cap total sample length instead",
    "base_model_attribute_name": "the base model is now retrieved via `get_decoder`",
    "force_use_ref_model": "no longer needed, pass `ref_model` and it is used automatically",
    "generate_during_eval": "use a `TrainerCallback` instead",
    "label_pad_token_id": "this value is no longer configurable",
    "model_adapter_name": "only the default adapter is supported now",
    "ref_adapter_name": "the trainer handles the reference adapter itself now",
    "ref_model_init_kwargs": "build the reference model yourself and pass it as `ref_model`",
    "reference_free": "use `CPOTrainer` for a reference-free objective",
    "rpo_alpha": "add 'sft' to `loss_type` and set its weight in `loss_weights` instead",
    "tools": "pass tools through the dataset instead",
    "use_logits_to_keep": "the DPO trainer no longer uses this setting",
    "padding_value": "this value is no longer configurable",
}
TRANSFORMERS_REMOVED = {
    "include_tokens_per_second": 'set `include_num_input_tokens_seen = "all"` instead',
    "no_cuda": "set `use_cpu = True` on the config you construct instead",
    "group_by_length": 'set `train_sampling_strategy = "group_by_length"` instead',
    "include_inputs_for_metrics": 'add "inputs" to the `include_for_metrics` list instead',
    "tpu_metrics_debug": "use `debug` instead",
    "push_to_hub_model_id": "set the full repository name in `hub_model_id` instead",
    "push_to_hub_organization": "set the full repository name in `hub_model_id` instead",
    "jit_mode_eval": "use `torch_compile` instead, torchscript is no longer recommended",
    "torchdynamo": "use `torch_compile_backend` instead",
    "fsdp_min_num_params": "use `fsdp_config` instead",
    "fsdp_transformer_layer_cls_to_wrap": "use `fsdp_config` instead",
    "fp16_backend": "transformers relies on torch.amp now, so this is no longer configurable",
    "half_precision_backend": "transformers relies on torch.amp now, so this is no longer configurable",
    "fp16_opt_level": "the apex backend is gone, torch.amp is used instead",
    "adafactor": 'pass `optim = "adafactor"` instead',
    "save_safetensors": "safetensors is the only checkpoint format now",
    "overwrite_output_dir": "use `resume_from_checkpoint` to control this instead",
    "logging_dir": "set the TENSORBOARD_LOGGING_DIR environment variable instead",
    "tpu_num_cores": "set the TPU_NUM_CORES environment variable instead",
    "ray_scope": "set the RAY_SCOPE environment variable instead",
    "use_mps_device": "mps is used automatically when it is detected",
    "use_legacy_prediction_loop": "only `evaluation_loop` is used now",
    "past_index": "this was only ever used by a few special architectures",
    "mp_parameters": "this was a legacy SageMaker-only argument",
}

# Keywords a later TRL added to a config: (config, keyword) -> (the release that added it, the value that asks for
# what the configs before it always do).
TRL_ADDED = {
    ("SFTConfig", "loss_type"): ("0.23.0", "nll"),  # TRL 0.22's SFTTrainer trains with the nll loss alone
}


def forward(config_class, kwargs: dict) -> dict:
    """`kwargs` for `config_class(...)`, with each keyword the config rejects but has a new name for moved to that
    name, printing Unsloth's notice (rank 0); given with its new name too, the old one is left out, with a notice.
    A keyword the installed library removed is dropped with Unsloth's warning and the library's advice; other
    keywords are left for the config to judge."""
    accepted = accepted_keywords(config_class)
    forwarded = dict(kwargs)
    for key, value in kwargs.items():
        if key in accepted:
            continue
        who, renamed = _rename(key, accepted)
        if renamed is not None:
            del forwarded[key]
            if value is None and _default(config_class, renamed) is not None:
                continue  # a legacy Optional left at None says nothing (per_gpu_*_batch_size)
            if renamed in kwargs:
                _notify(f"Unsloth: `{key}` was renamed to `{renamed}` by {who} and this {config_class.__name__} "
                        f"accepts only the new name. You set both, so `{key}` is ignored and your `{renamed}` is kept.")
                continue
            forwarded[renamed] = value
            _notify(f"Unsloth: {who} renamed `{key}` to `{renamed}`. Forwarding your value to `{renamed}` - "
                    f"update your code when convenient.")
            continue
        if _added_later(config_class, key, value):
            del forwarded[key]
            continue
        who, advice = _removal(key)
        if advice is not None:
            del forwarded[key]
            _notify(f"Unsloth: `{key}` is not supported by the installed {who}'s {config_class.__name__} and will be "
                    f"IGNORED - {advice}.")
    return forwarded


def current_name(config_class, key: str) -> str | None:
    """The keyword `config_class` takes for `key`: `key` itself, or the name TRL or Transformers renamed it to; None
    for neither. UsageError when the installed library removed `key` (the message says what to do instead)."""
    accepted = accepted_keywords(config_class)
    if key in accepted:
        return key
    renamed = _rename(key, accepted)[1]
    if renamed is not None:
        return renamed
    who, advice = _removal(key)
    if advice is not None:
        raise UsageError(_removed_message(config_class.__name__, key, who, advice))
    return None


def patch_config(config_class) -> None:
    """`config_class(...)` (a TRL config) takes the renamed keywords and drops the removed ones, as `forward`
    says; patching twice is once."""
    def make(original):
        @functools.wraps(original)
        def __init__(self, *args, **kwargs):
            original(self, *args, **forward(config_class, kwargs))

        return __init__

    patches.wrap("trl-config-old-keywords", config_class, "__init__", make)


@functools.cache
def accepted_keywords(config_class) -> frozenset:
    """The keywords `config_class.__init__` names (through any wrapper that keeps `__wrapped__`)."""
    parameters = inspect.signature(config_class.__init__).parameters.values()
    return frozenset(p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


def _added_later(config_class, key, value) -> bool:
    """True (after Unsloth's notice) for a keyword a later TRL added, given the value the installed TRL always
    trains with; UsageError for another value; False for a keyword TRL_ADDED does not know."""
    names = [klass.__name__ for klass in config_class.__mro__]
    added = next((TRL_ADDED[name, key] for name in names if (name, key) in TRL_ADDED), None)
    if added is None:
        return False
    import trl

    release, same = added
    if value == same:
        _notify(f"Unsloth: `{key}` is not a valid {config_class.__name__} argument for the installed TRL and will be "
                f"IGNORED (TRL {trl.__version__} has no `{key}`, added in {release}; it trains as {key}={same!r} "
                f"asks).")
        return True
    raise UsageError(f"{config_class.__name__}({key}={value!r}): the installed TRL ({trl.__version__}) has no `{key}` "
                     f"(TRL {release} added it), so it would train as {key}={same!r}, not as the notebook asks. "
                     f"Install trl>={release}, or remove `{key}` from the notebook.")


def _rename(key, accepted):
    for who, renames in (("TRL", TRL_RENAMES), ("transformers", TRANSFORMERS_RENAMES)):
        if renames.get(key) in accepted:
            return who, renames[key]
    return None, None


def _removal(key):
    for who, table in (("TRL", TRL_REMOVED), ("transformers", TRANSFORMERS_REMOVED)):
        if key in table:
            return who, table[key]
    return None, None


def _removed_message(config_name, key, who, advice) -> str:
    import transformers
    import trl

    version = trl.__version__ if who == "TRL" else transformers.__version__
    return (f"{config_name}({key}=...): the installed {who} ({version}) has no `{key}` in {config_name} any more "
            f"(Unsloth would ignore it, training something other than the notebook says): {advice}. Remove `{key}` "
            f"from the notebook, or run it on the stack it was written for (transformers==4.56.2, trl==0.22.2: "
            f"requirements-notebooks.txt).")


def _default(config_class, name):
    field = getattr(config_class, "__dataclass_fields__", {}).get(name)
    if field is None or field.default is dataclasses.MISSING:
        return None
    return field.default


def _notify(message: str) -> None:
    if is_main_process():
        print(message, flush=True)
