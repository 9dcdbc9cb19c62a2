"""Unsloth-era `SFTTrainer(...)`, `DPOTrainer(...)`, ... arguments on the hf backend
(nbddp/fallback/trl_compat.py)."""
import os
import sys

import pytest
import torch
from transformers import TrainingArguments
from trl import DPOConfig, GRPOConfig, SFTConfig, SFTTrainer

from nbddp import patches
from nbddp.errors import UsageError
from nbddp.runtime import backend as backends
from nbddp.runtime.inputs import training_overrides
from nbddp.runtime.context import DistributedContext
from nbddp.fallback.trl_compat import config_from, patch_sft_config, patch_trainer


class RecordingTrainer:
    """Stands in for SFTTrainer: the same named parameters, and it keeps what it was given."""

    def __init__(self, model, args=None, train_dataset=None, processing_class=None):
        self.given = {"model": model, "args": args, "train_dataset": train_dataset, "processing_class": processing_class}


@pytest.fixture
def trainer_class():
    cls = type("PatchedTrainer", (RecordingTrainer,), {})
    patch_trainer(cls, SFTConfig)
    return cls


def training_args(tmp_path, **values):
    return TrainingArguments(output_dir=str(tmp_path / "outputs"), report_to="none", **values)


def test_unsloth_arguments_move_into_an_sft_config(trainer_class, tmp_path):
    trainer = trainer_class(
        model="m", tokenizer="tok", train_dataset="ds",
        dataset_text_field="body", max_seq_length=64, dataset_num_proc=1, packing=False,
        args=training_args(tmp_path, max_steps=2, learning_rate=2e-4),
    )
    args = trainer.given["args"]
    assert isinstance(args, SFTConfig)
    assert (args.dataset_text_field, args.max_length, args.dataset_num_proc, args.packing) == ("body", 64, 1, False)
    assert (args.max_steps, args.learning_rate) == (2, 2e-4)
    assert trainer.given["processing_class"] == "tok" and trainer.given["train_dataset"] == "ds"


def test_values_the_author_left_unset_keep_their_training_arguments_defaults(tmp_path):
    # SFTConfig's own defaults differ: learning_rate 2e-5, gradient checkpointing on, logging every 10
    # steps, and bf16 on unless fp16 is.
    config = config_from(SFTConfig, training_args(tmp_path, max_steps=2, hub_token="secret"), {"max_seq_length": 64})
    defaults = TrainingArguments(output_dir=str(tmp_path))
    assert config.learning_rate == defaults.learning_rate == 5e-5
    assert config.gradient_checkpointing is defaults.gradient_checkpointing is False
    assert config.logging_steps == defaults.logging_steps == 500
    assert config.bf16 is False and config.fp16 is False
    assert config.hub_token == "secret"  # to_dict masks it as "<HUB_TOKEN>"
    if not torch.cuda.is_available():  # SFTConfig's own default (bf16 on) would not even build on a CPU
        with pytest.raises(ValueError, match="bf16"):
            SFTConfig(output_dir=str(tmp_path))


def test_an_sft_config_keeps_its_token_fields(tmp_path):
    config = config_from(SFTConfig, SFTConfig(output_dir=str(tmp_path), bf16=False, eos_token="</s>"), {"packing": True})
    assert config.eos_token == "</s>" and config.packing is True


def test_nothing_to_move_passes_the_arguments_through(trainer_class, tmp_path):
    args = training_args(tmp_path)
    trainer = trainer_class(model="m", processing_class="tok", args=args)
    assert trainer.given["args"] is args and trainer.given["processing_class"] == "tok"


def test_a_misspelt_argument_is_still_an_error_naming_it(trainer_class, tmp_path):
    with pytest.raises(TypeError, match="dataset_txt_field"):
        trainer_class(model="m", dataset_txt_field="text", args=training_args(tmp_path))
    with pytest.raises(TypeError, match="dataset_txt_field"):
        trainer_class(model="m", dataset_txt_field="text")
    with pytest.raises(TypeError, match="dataset_txt_field"):  # set on a config of the trainer's own class
        trainer_class(model="m", dataset_txt_field="text", args=SFTConfig(output_dir=str(tmp_path), bf16=False))


def test_a_config_setting_without_args_says_where_it_goes(trainer_class):
    # Unsloth moves it only into a config passed as args=; without one TRL would fail with a TypeError.
    with pytest.raises(UsageError, match=r"PatchedTrainer\(dataset_text_field=\.\.\.\): `dataset_text_field` is a setting "
                                         r"of SFTConfig.*args=SFTConfig\(dataset_text_field=\.\.\., \.\.\.\)"):
        trainer_class(model="m", dataset_text_field="text")


class RecordingDPOTrainer:
    """Stands in for DPOTrainer: its named parameters (none of them `beta`), and it keeps what it was given."""

    def __init__(self, model, ref_model=None, args=None, train_dataset=None, processing_class=None):
        self.given = {"model": model, "args": args, "train_dataset": train_dataset, "processing_class": processing_class}


@pytest.fixture
def dpo_trainer_class():
    cls = type("DPOTrainer", (RecordingDPOTrainer,), {})
    patch_trainer(cls, DPOConfig)
    return cls


def test_a_trainer_keeps_its_own_config_and_gets_the_values_set_on_it(dpo_trainer_class, tmp_path):
    # Zephyr_(7B)-DPO: DPOTrainer(beta=0.1, max_length=1024, tokenizer=tokenizer, args=DPOConfig(...)).
    args = DPOConfig(output_dir=str(tmp_path), bf16=False, report_to="none", learning_rate=5e-6)
    trainer = dpo_trainer_class(model="m", ref_model=None, tokenizer="tok", beta=0.3, max_length=64, args=args)
    assert trainer.given["args"] is args  # the notebook's own config, as Unsloth keeps it
    assert (args.beta, args.max_length, args.learning_rate) == (0.3, 64, 5e-6)
    assert trainer.given["processing_class"] == "tok"


def test_a_grpo_config_is_not_built_again(tmp_path):
    # GRPOConfig derives its generation batch in __post_init__ and then refuses both set: built again from
    # to_dict() it fails, so the moved values go onto the notebook's config.
    cls = type("GRPOTrainer", (RecordingTrainer,), {})
    patch_trainer(cls, GRPOConfig)
    args = GRPOConfig(output_dir=str(tmp_path), bf16=False, report_to="none", per_device_train_batch_size=2,
                      num_generations=2)
    with pytest.raises(ValueError, match="generation_batch_size"):
        GRPOConfig(**args.to_dict())
    trainer = cls(model="m", args=args, temperature=0.5)
    assert trainer.given["args"] is args and args.temperature == 0.5


def test_a_dpo_setting_without_args_is_a_usage_error(dpo_trainer_class):
    with pytest.raises(UsageError, match=r"DPOTrainer\(beta=\.\.\.\).*args=DPOConfig\(beta=\.\.\., \.\.\.\)"):
        dpo_trainer_class(model="m", ref_model=None, beta=0.1)


def test_patching_twice_wraps_once(trainer_class):
    patched = trainer_class.__init__
    patch_trainer(trainer_class, SFTConfig)
    assert trainer_class.__init__ is patched


@pytest.fixture
def hf_backend_active(monkeypatch, backend_patches_undone_after):
    """`backends.activate("hf")` as `setup` runs it; the real SFTTrainer and SFTConfig are restored afterwards."""
    monkeypatch.delitem(sys.modules, "unsloth", raising=False)
    monkeypatch.delitem(sys.modules, "unsloth.chat_templates", raising=False)
    backends.activate("hf")


def test_only_the_hf_backend_patches_trl(monkeypatch, backend_patches_undone_after):
    from transformers import Trainer

    monkeypatch.setattr(Trainer, "compute_loss", Trainer.compute_loss)
    monkeypatch.setitem(sys.modules, "unsloth", type(sys)("unsloth"))  # a stand-in for the real Unsloth
    backends.activate("unsloth")
    assert not patches.is_patched(SFTTrainer.__init__, "trl-unsloth-arguments")
    assert not patches.is_patched(SFTConfig.__init__, "sft-max-seq-length")
    backends.activate("hf")
    assert patches.is_patched(SFTTrainer.__init__, "trl-unsloth-arguments")
    assert patches.is_patched(SFTConfig.__init__, "sft-max-seq-length")


@pytest.fixture
def config_class():
    cls = type("PatchedConfig", (SFTConfig,), {})
    patch_sft_config(cls)
    return cls


def test_an_sft_config_takes_unsloths_max_seq_length(config_class, tmp_path):
    with pytest.raises(TypeError, match="max_seq_length"):  # TRL's own SFTConfig refuses it
        SFTConfig(output_dir=str(tmp_path), max_seq_length=512)
    config = config_class(output_dir=str(tmp_path), max_seq_length=512, report_to="none", bf16=False)
    assert (config.max_length, config.max_seq_length) == (512, 512)
    both = config_class(output_dir=str(tmp_path), max_seq_length=512, max_length=128, report_to="none", bf16=False)
    assert both.max_length == 128  # the TRL name, written out, wins
    assert config_class(output_dir=str(tmp_path), report_to="none", bf16=False).max_length == SFTConfig.max_length


def test_patching_the_config_twice_wraps_once(config_class):
    patched = config_class.__init__
    patch_sft_config(config_class)
    assert config_class.__init__ is patched


@pytest.fixture
def environ_kept(monkeypatch):
    """os.environ itself back after the test: datasets' `map` with num_proc (SFTTrainer's dataset_num_proc) leaves a
    copy of it in its place, and what bound the original earlier (training_overrides.schema_path's default) would no
    longer see a later test's environment."""
    monkeypatch.setattr(os, "environ", os.environ)


@pytest.mark.parametrize("tokenizer_keyword", ["processing_class", "tokenizer"])  # as export writes it, as Unsloth's notebooks did
def test_unsloth_style_trainer_trains_on_cpu(hf_backend_active, environ_kept, tiny_model_path, tmp_path,
                                             tokenizer_keyword):
    from datasets import Dataset
    from trl import SFTTrainer
    from unsloth import FastLanguageModel, is_bfloat16_supported

    ddp = DistributedContext()  # one CPU process
    model, tokenizer = FastLanguageModel.from_pretrained(tiny_model_path, max_seq_length=64, load_in_4bit=False)
    model = FastLanguageModel.get_peft_model(model, r=4, lora_alpha=8, random_state=3407)
    dataset = Dataset.from_dict({"text": ["the cat sat on the mat", "a dog ran far away"] * 4})
    trainer = SFTTrainer(
        model=model,
        **{tokenizer_keyword: tokenizer},
        train_dataset=dataset,
        dataset_text_field="text",
        max_seq_length=64,
        dataset_num_proc=1,
        packing=False,
        args=TrainingArguments(
            per_device_train_batch_size=2,
            warmup_steps=1,
            max_steps=2,
            learning_rate=2e-4,
            fp16=ddp.gpu_only(not is_bfloat16_supported()),  # as export rewrites the notebook's flags
            bf16=ddp.gpu_only(is_bfloat16_supported()),
            logging_steps=1,
            optim=ddp.optimizer("adamw_8bit"),
            seed=3407,
            output_dir=str(tmp_path / "outputs"),
            report_to="none",
        ),
    )
    assert isinstance(trainer.args, SFTConfig) and trainer.args.max_length == 64
    assert trainer.processing_class is tokenizer
    # nothing on the way turned mixed precision on: float32 on a CPU
    assert trainer.args.bf16 is False and trainer.args.fp16 is False
    assert trainer.accelerator.mixed_precision == "no"
    stats = trainer.train()
    assert trainer.state.global_step == 2 and torch.isfinite(torch.tensor(stats.training_loss))


def test_the_trainers_the_notebooks_use_are_patched(hf_backend_active):
    from trl import DPOTrainer, GRPOTrainer

    for trainer_class, config_class in ((SFTTrainer, SFTConfig), (GRPOTrainer, GRPOConfig), (DPOTrainer, DPOConfig)):
        assert patches.is_patched(trainer_class.__init__, "trl-unsloth-arguments")
        assert patches.is_patched(config_class.__init__, "trl-config-old-keywords")


def test_orpo_is_patched_where_trl_has_it_and_a_usage_error_where_it_moved(hf_backend_active):
    import trl

    if "ORPOTrainer" in dir(trl):  # TRL 0.x, the notebooks' trl==0.22.2
        from trl import ORPOConfig, ORPOTrainer
    else:  # TRL 1.x: Llama3_(8B)-ORPO's `from trl import ORPOConfig, ORPOTrainer` would be an ImportError
        with pytest.raises(UsageError, match=r"`from trl import ORPOConfig`: TRL 1\.x moved ORPOConfig to "
                                             r"trl\.experimental\.orpo .*`from trl\.experimental\.orpo import "
                                             r"ORPOConfig, ORPOTrainer`.*trl==0\.22\.2"):
            from trl import ORPOConfig  # noqa: F401
        from trl.experimental.orpo import ORPOConfig, ORPOTrainer
    assert patches.is_patched(ORPOTrainer.__init__, "trl-unsloth-arguments")
    assert patches.is_patched(ORPOConfig.__init__, "trl-config-old-keywords")
    # what probes for the names (--set's list of configs) still finds the configs there are
    assert ORPOConfig in training_overrides.config_classes()
    from trl import SFTConfig as still_there  # the other names load as before

    assert still_there is SFTConfig


def test_an_unsloth_style_dpo_trainer_trains_on_cpu(hf_backend_active, tiny_model_path, tmp_path):
    # Zephyr_(7B)-DPO's trainer: beta, max_length and tokenizer on DPOTrainer, warmup_ratio in DPOConfig.
    from datasets import Dataset
    from trl import DPOTrainer
    from unsloth import FastLanguageModel

    model, tokenizer = FastLanguageModel.from_pretrained(tiny_model_path, max_seq_length=32, load_in_4bit=False)
    model = FastLanguageModel.get_peft_model(model, r=4, lora_alpha=8, use_gradient_checkpointing=False)
    rows = Dataset.from_dict({"prompt": ["the cat", "a dog"] * 2, "chosen": [" sat on the mat", " ran far"] * 2,
                              "rejected": [" ran far away", " sat"] * 2})
    trainer = DPOTrainer(
        model=model, ref_model=None, tokenizer=tokenizer, train_dataset=rows, beta=0.2, max_length=32,
        args=DPOConfig(per_device_train_batch_size=2, warmup_ratio=0.5, max_steps=2, learning_rate=1e-4,
                       logging_steps=1, bf16=False, use_cpu=True, output_dir=str(tmp_path), report_to="none"),
    )
    assert (trainer.args.beta, trainer.args.max_length, trainer.args.get_warmup_steps(2)) == (0.2, 32, 1)
    assert trainer.processing_class is tokenizer
    stats = trainer.train()
    assert trainer.state.global_step == 2 and torch.isfinite(torch.tensor(stats.training_loss))


def test_a_list_of_rows_is_taken_as_a_dataset(trainer_class, tmp_path):
    """The vision notebooks pass `[convert_to_conversation(row) for row in dataset]`; TRL 1.x wants a Dataset."""
    from datasets import Dataset
    from PIL import Image

    rows = [{"messages": [{"role": "user", "content": [{"type": "image", "image": Image.new("RGB", (4, 4))}]}]}] * 3
    trainer = trainer_class(model=None, args=training_args(tmp_path), train_dataset=rows)
    dataset = trainer.given["train_dataset"]
    assert isinstance(dataset, Dataset) and len(dataset) == 3
    image = dataset[0]["messages"][0]["content"][0]["image"]  # nested: Arrow's {"bytes", "path"}, PNG bytes
    assert Image.open(__import__("io").BytesIO(image["bytes"])).size == (4, 4)


def test_a_text_column_named_by_dataset_text_field_wins_over_the_chats_beside_it():
    """As Unsloth's sft_prepare_dataset: the notebook's formatted text trains, not its ShareGPT turns (which TRL
    would render with the chat template, refusing the "human"/"gpt" roles)."""
    from types import SimpleNamespace

    from datasets import Dataset

    from nbddp.fallback.trl_compat import text_over_chats

    turns = [{"from": "human", "value": "hi?"}, {"from": "gpt", "value": "hello."}]
    dataset = Dataset.from_list([{"conversations": turns, "text": "### hi? ### hello."}])
    assert text_over_chats(dataset, {"dataset_text_field": "text"}).column_names == ["text"]
    assert text_over_chats(dataset, {"args": SimpleNamespace(dataset_text_field="text")}).column_names == ["text"]
    kept = [{"dataset_text_field": "body"}, {"dataset_text_field": "text", "formatting_func": len},
            {"args": SimpleNamespace(dataset_text_field="text", assistant_only_loss=True)}]
    for kwargs in kept:
        assert text_over_chats(dataset, kwargs).column_names == ["conversations", "text"], kwargs


def test_trls_cached_availability_tuples_become_booleans(backend_patches_undone_after):
    """TRL 0.22 under Transformers 5 caches `(False, None)` for an absent vLLM, which is true: the GRPO trainer
    then imports vLLM. The flags become what they say; undo puts them back."""
    import types

    from nbddp.fallback.trl_compat import coerce_availability_flags

    import_utils = types.ModuleType("trl.import_utils")
    import_utils._vllm_available, import_utils._requests_available = (False, None), (True, None)
    import_utils._deepspeed_available, import_utils.is_vllm_available = False, lambda: import_utils._vllm_available
    coerce_availability_flags(import_utils)
    assert (import_utils.is_vllm_available(), import_utils._requests_available) == (False, True)
    assert import_utils._deepspeed_available is False
    patches.undo()
    assert import_utils._vllm_available == (False, None)


def test_transformers_5_gets_back_the_vision_mapping_name_trl_0_22_imports(backend_patches_undone_after):
    import types

    from nbddp.fallback.trl_compat import alias_vision_mapping

    modeling_auto = types.ModuleType("transformers.models.auto.modeling_auto")
    renamed = modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES = {"llava": "LlavaForConditionalGeneration"}
    alias_vision_mapping(modeling_auto)
    assert modeling_auto.MODEL_FOR_VISION_2_SEQ_MAPPING_NAMES is renamed
    patches.undo()
    assert not hasattr(modeling_auto, "MODEL_FOR_VISION_2_SEQ_MAPPING_NAMES")
