import pytest
import torch

from nbddp.runtime.hf_backend import FastLanguageModel, is_bfloat16_supported


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
