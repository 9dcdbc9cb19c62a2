import pytest
import torch

from nbddp.errors import UsageError
from nbddp.fallback import models
from nbddp.fallback.models import FastLanguageModel, FastModel, is_bfloat16_supported


def load(path, **options):
    return FastLanguageModel.from_pretrained(path, max_seq_length=32, load_in_4bit=False, **options)


def lora(model, random_state=3407):
    return FastLanguageModel.get_peft_model(
        model,
        r=4,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        lora_alpha=8,
        lora_dropout=0,
        bias="none",
        use_gradient_checkpointing="unsloth",
        random_state=random_state,
        use_rslora=False,
        loftq_config=None,
    )


def lora_weights(model):
    return {name: parameter.detach().clone() for name, parameter in model.named_parameters() if "lora_" in name}


def test_loads_in_float32_on_cpu_with_a_training_tokenizer(tiny_model_path):
    model, tokenizer = load(tiny_model_path)
    assert model.dtype == torch.float32 and model.device.type == "cpu"
    assert tokenizer.pad_token == tokenizer.eos_token == "</s>"
    assert tokenizer.padding_side == "right"
    assert tokenizer.model_max_length == 32 and model.max_seq_length == 32


def test_unsloth_only_options_are_accepted(tiny_model_path):
    model, _ = load(tiny_model_path, dtype=None, fast_inference=False, gpu_memory_utilization=0.5, random_state=1)
    assert model.config.num_hidden_layers == 2


def test_4bit_without_cuda_warns_and_loads_full_precision(tiny_model_path, capsys):
    model, _ = FastLanguageModel.from_pretrained(tiny_model_path, max_seq_length=32)  # Unsloth's default: 4-bit
    assert "load_in_4bit needs CUDA and bitsandbytes; loading in full precision" in capsys.readouterr().err
    assert model.dtype == torch.float32 and getattr(model, "hf_quantizer", None) is None


def test_only_lora_parameters_train(tiny_model_path):
    model = lora(load(tiny_model_path)[0])
    trainable = [name for name, parameter in model.named_parameters() if parameter.requires_grad]
    assert trainable and all("lora_A" in name or "lora_B" in name for name in trainable)
    # 2 layers x 7 projections x (A, B)
    assert len(trainable) == 2 * 7 * 2
    assert model.base_model.model.model.gradient_checkpointing


def test_random_state_fixes_the_lora_init(tiny_model_path):
    first = lora_weights(lora(load(tiny_model_path)[0], random_state=3407))
    torch.rand(100)  # whatever the caller did with the random state in between
    second = lora_weights(lora(load(tiny_model_path)[0], random_state=3407))
    other = lora_weights(lora(load(tiny_model_path)[0], random_state=7))
    assert first.keys() == second.keys()
    assert all(first[name].equal(second[name]) for name in first)
    assert any(not first[name].equal(other[name]) for name in first if "lora_A" in name)


def test_lora_model_trains(tiny_model_path):
    model, tokenizer = load(tiny_model_path)
    model = lora(model)
    batch = tokenizer(["the cat sat on the mat", "a dog ran"], padding=True, return_tensors="pt")
    loss = model(**batch, labels=batch["input_ids"]).loss
    loss.backward()
    grads = [p.grad for name, p in model.named_parameters() if "lora_B" in name]
    assert torch.isfinite(loss) and any(g is not None and g.abs().sum() > 0 for g in grads)


def test_inference_and_training_modes_flip_padding(tiny_model_path):
    model, tokenizer = load(tiny_model_path)
    model = lora(model)
    FastLanguageModel.for_inference(model)
    assert not model.training and tokenizer.padding_side == "left"
    FastLanguageModel.for_training(model)
    assert model.training and tokenizer.padding_side == "right"


@pytest.mark.parametrize("cuda, bf16, expected", [(False, True, False), (True, False, False), (True, True, True)])
def test_bfloat16_needs_a_gpu_that_has_it(monkeypatch, cuda, bf16, expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: bf16)
    assert is_bfloat16_supported() is expected


def trainable(model):
    """The names of the modules whose parameters train, without PEFT's prefixes and adapter suffixes."""
    names = {name.removeprefix("base_model.model.") for name, p in model.named_parameters() if p.requires_grad}
    return {name.split(".lora_")[0].split(".modules_to_save.")[0] for name in names}


def test_embeddings_in_target_modules_train_as_whole_matrices(tiny_model_path):
    model = FastLanguageModel.get_peft_model(
        load(tiny_model_path)[0], r=4, target_modules=["q_proj", "embed_tokens", "lm_head"], random_state=3407)
    assert trainable(model) == {"model.embed_tokens", "lm_head", "model.layers.0.self_attn.q_proj",
                                "model.layers.1.self_attn.q_proj"}
    assert not [name for name in dict(model.named_parameters()) if "lora_embedding" in name]


def test_save_lora_writes_the_adapter(tiny_model_path, tmp_path):
    model = lora(load(tiny_model_path)[0])
    model.save_lora(str(tmp_path / "adapter"))
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()


@pytest.mark.parametrize("method", ["fast_generate", "load_lora"])
def test_vllm_methods_of_fast_inference_say_what_to_do(tiny_model_path, method):
    model = lora(load(tiny_model_path, fast_inference=True)[0])
    with pytest.raises(UsageError, match=rf"model\.{method} is Unsloth's vLLM engine .* model\.generate\("):
        getattr(model, method)("grpo_saved_lora")


def test_fast_model_loads_a_text_model_with_its_tokenizer(tiny_model_path):
    model, tokenizer = FastModel.from_pretrained(tiny_model_path, max_seq_length=32, load_in_4bit=False)
    assert type(model).__name__ == "LlamaForCausalLM" and type(tokenizer).__name__ != "LlavaProcessor"
    assert tokenizer.padding_side == "right" and model.max_seq_length == 32
    model = FastModel.get_peft_model(model, r=4, lora_alpha=4)  # target_modules=None: Unsloth's regex
    projections = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                   "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
    assert trainable(model) == {f"model.layers.{i}.{name}" for i in range(2) for name in projections}  # not lm_head
    FastModel.for_inference(model)
    assert tokenizer.padding_side == "left"


def test_fast_model_flags_pick_the_modules_on_a_text_model(tiny_model_path):
    model = FastModel.get_peft_model(load(tiny_model_path)[0], r=4, finetune_mlp_modules=False)
    assert trainable(model) == {f"model.layers.{i}.self_attn.{leaf}_proj" for i in range(2) for leaf in "qkvo"}


@pytest.mark.parametrize("flags, says", [
    ({"finetune_vision_layers": False, "finetune_language_layers": False}, "no layer is left to train"),
    ({"finetune_attention_modules": False, "finetune_mlp_modules": False}, "no module is left to train"),
])
def test_fast_model_with_nothing_to_train_says_so(tiny_model_path, flags, says):
    with pytest.raises(UsageError, match=says):
        FastModel.get_peft_model(load(tiny_model_path)[0], r=4, **flags)


def test_fast_model_target_modules_it_does_not_have(tiny_model_path):
    with pytest.raises(UsageError, match=r"no linear layer of LlamaForCausalLM matches target_modules \['qkv'\]"):
        FastModel.get_peft_model(load(tiny_model_path)[0], target_modules=["qkv"], finetune_mlp_modules=False)


def test_unsloths_other_names():
    assert models.is_bf16_supported is is_bfloat16_supported
    assert models.PatchDPOTrainer() is None
    assert issubclass(models.FastVisionModel, FastModel)
    assert models.train_on_responses_only is models.chat_templates.train_on_responses_only


def test_the_per_family_loaders_are_fast_language_model_with_unsloths_positional_order(tiny_model_path):
    """unsloth.FastQwen2Model & co. (the Tool_Calling notebook): FastLlamaModel's from_pretrained, whose fifth
    argument is `token`; max_seq_length=None is the model's context length."""
    from nbddp.fallback.models import FastLlamaModel, FastMistralModel, FastQwen2Model, FastTextModel

    assert FastQwen2Model is FastMistralModel is FastLlamaModel and issubclass(FastLlamaModel, FastLanguageModel)
    assert FastTextModel is FastModel
    model, tokenizer = FastQwen2Model.from_pretrained(tiny_model_path, None, None, False, None)
    assert model.max_seq_length == tokenizer.model_max_length == model.config.max_position_embeddings
    model = FastQwen2Model.get_peft_model(model, r=4, target_modules=["q_proj", "v_proj"])
    assert any("lora_" in name for name, _ in model.named_parameters())


def test_a_classifier_loads_through_auto_model(tiny_model_path):
    """bert_classification: FastModel with auto_model=AutoModelForSequenceClassification, which cannot generate."""
    from transformers import AutoModelForSequenceClassification

    model, _ = FastModel.from_pretrained(tiny_model_path, auto_model=AutoModelForSequenceClassification,
                                         num_labels=6, full_finetuning=True, load_in_4bit=False)
    assert type(model).__name__.endswith("ForSequenceClassification") and model.config.num_labels == 6


def test_a_diffusion_model_is_refused_with_what_to_do(tmp_path):
    """Unsloth's FastModel routes DiffusionGemma to FastDiffusionModel, which the fallback lacks."""
    (tmp_path / "config.json").write_text('{"model_type": "diffusion_gemma", "canvas_length": 256}')
    with pytest.raises(UsageError, match=r"text-diffusion model \(diffusion_gemma\).*--backend unsloth"):
        FastModel.from_pretrained(str(tmp_path))


def test_a_name_the_fallback_lacks_is_named_with_the_fix():
    with pytest.raises(UsageError, match=r"unsloth\.FastDecisionModel is Unsloth's; .*\(--backend unsloth\)"):
        from nbddp.fallback.models import FastDecisionModel  # noqa: F401
    with pytest.raises(UsageError, match=r"FastSentenceTransformer .* sentence_transformers"):
        from nbddp.fallback.models import FastSentenceTransformer  # noqa: F401
    assert not hasattr(models, "__path__")  # what the import system asks stays an AttributeError


def test_generate_takes_a_batch_encoding_as_input_ids(tiny_model_path):
    """Transformers 5's apply_chat_template(return_tensors="pt") is a BatchEncoding; notebooks pass it as input_ids."""
    model, tokenizer = load(tiny_model_path)
    model = lora(model)
    FastLanguageModel.for_inference(model)
    encoding = tokenizer(["moon river cat"], return_tensors="pt")
    torch.manual_seed(0)
    unpacked = model.generate(input_ids=encoding, max_new_tokens=3, do_sample=False)
    torch.manual_seed(0)
    plain = model.generate(input_ids=encoding["input_ids"], attention_mask=encoding["attention_mask"],
                           max_new_tokens=3, do_sample=False)
    assert torch.equal(unpacked, plain)
