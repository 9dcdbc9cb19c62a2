"""Unsloth's API on Transformers+PEFT: what `from unsloth import ...` gets where Unsloth cannot run (no CUDA GPU, or
`--backend hf`, or `--strategy fsdp`). `nbddp.runtime.backend.activate("hf")` installs it under Unsloth's names; the
notebooks run unchanged, with Unsloth 2026.10.9's signatures and, where the fallback can compute them, its results.

Each module stands in for the Unsloth module it is named after (or the part of one named in its docstring):

    models.py           `unsloth` itself: FastLanguageModel, FastModel, FastVisionModel, the per-family loaders
                        (unsloth/models/loader.py, llama.py, vision.py); installed as the module `unsloth`
    chat_templates.py   `unsloth.chat_templates`: get_chat_template, standardize_sharegpt, train_on_responses_only
    sharegpt.py         the dataset helpers unsloth/chat_templates.py also holds: to_sharegpt, construct_chat_template,
                        the dataset-level apply_chat_template (chat_templates.py exports them)
    chat_markers.py     the response and instruction markers of train_on_responses_only (unsloth_zoo/dataset_utils.py)
    trainer.py          `unsloth.trainer`: UnslothTrainer, UnslothTrainingArguments
    vision_collator.py  UnslothVisionDataCollator (unsloth_zoo/vision_utils.py)
    save.py             `unsloth.save`: save_pretrained_merged, push_to_hub_merged, save_pretrained_torchao, GGUF refused
    qat.py              qat_scheme= (unsloth/models/_utils.py, `_prepare_model_for_qat`)
    dataprep.py         `unsloth.dataprep`: every name says what to do instead
    rl_environments.py  execute_with_time_limit and its siblings, unsloth_zoo/rl_environments.py's own code
    zoo_files.py        an installed unsloth_zoo's files, loaded without its __init__ (which needs Unsloth)
    trl_compat.py       what importing Unsloth does to TRL (unsloth/trainer.py `_patch_trl_trainer`,
                        unsloth/import_fixes.py): Unsloth-era trainer arguments moved into the config
    rl_config_compat.py the config keywords Transformers 5 and TRL 1.x renamed or removed
                        (unsloth/models/rl_config_compat.py)
    bitsandbytes_compat.py  what importing Unsloth does to bitsandbytes' optimizers on a GPU: no device sync
                        after each parameter's update (unsloth/import_fixes.py)
    fsdp.py             nbddp's own, no Unsloth module's: how a model loads and merges when `--strategy fsdp` shards
                        it (Unsloth's kernels do not shard, so FSDP runs here alone), as the runtime's
                        `trainer.fsdp.choose` tells it

trl_compat and rl_config_compat are here, not in the runtime: they do to TRL what importing Unsloth does, so the
fallback alone needs them (the runtime calls `trl_compat.refuse_moved_names` on either backend: Unsloth leaves those
names out of `trl` too). unsloth_chat_templates.json is Unsloth's table of chat templates, written by
tools/extract_chat_templates.py.

The fallback imports torch, and transformers, peft and trl inside its functions (the real Unsloth, imported
instead, must come before them); never libcst, jupytext, papermill, nbddp.orchestration or nbddp.runtime: the
runtime activates it, never the other way (tests/test_rooms.py). What it shares with the runtime is nbddp's own,
beside the rooms: the patch table (`nbddp.patches`), `nbddp.rank` and the values of `use_gradient_checkpointing`
(`nbddp.gradient_checkpointing_modes`); the model-name check (`nbddp.model_names`) it shares with the notebooks.
"""
