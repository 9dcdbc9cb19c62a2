"""--strategy fsdp (nbddp/runtime/trainer/fsdp.py): the choice, the training arguments it sets, and the adapter it
gathers from shards and saves once.

Transformers' Trainer runs FSDP only on GPUs (accelerate), so its FSDP training is tested on the GPU host
(bench/fsdp_gpu.sh). Here, on 2 gloo processes, torch's FSDP2 shards a tiny PEFT model by hand, as accelerate
would, and nbddp's end-of-training gather and the main process's `save_pretrained` run on it.
"""
import json
import subprocess
import sys
import textwrap

import pytest

from nbddp.errors import UsageError
from nbddp.runtime.trainer import fsdp


@pytest.fixture
def strategy_restored():
    yield
    fsdp._chosen.update(strategy="ddp", layers=(), noted=False)


def test_ddp_keeps_the_backend_and_fsdp_takes_the_fallback(strategy_restored):
    assert fsdp.choose("ddp", "unsloth", on_gpu=True) == ("ddp", "unsloth") and not fsdp.active()
    assert fsdp.choose("fsdp", "auto", on_gpu=True) == ("fsdp", "hf") and fsdp.active()


@pytest.mark.parametrize("requested, backend, on_gpu, message", [
    ("zero3", "auto", True, r"--strategy 'zero3': expected one of ddp, fsdp"),
    ("fsdp", "auto", False, r"--strategy fsdp needs CUDA GPUs: accelerate .* runs FSDP only on GPUs"),
    ("fsdp", "unsloth", True, r"Unsloth's kernels do not shard \(unslothai/unsloth#2767\)"),
])
def test_what_cannot_run_is_refused_saying_why(strategy_restored, requested, backend, on_gpu, message):
    with pytest.raises(UsageError, match=message):
        fsdp.choose(requested, backend, on_gpu)


def test_fsdp2_each_decoder_layer_and_the_notebooks_own_settings_win(strategy_restored, monkeypatch):
    import torch.distributed as dist

    monkeypatch.setattr(dist, "is_initialized", lambda: True)  # under torchrun
    fsdp._chosen.update(strategy="fsdp", layers=("LlamaDecoderLayer",))
    kwargs = fsdp.training_kwargs({"learning_rate": 2e-4, "gradient_checkpointing": True})
    assert kwargs["fsdp"] == "full_shard auto_wrap" and kwargs["learning_rate"] == 2e-4
    assert kwargs["fsdp_config"] == {"version": 2, "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                                     "state_dict_type": "FULL_STATE_DICT",
                                     "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]}
    assert kwargs["gradient_checkpointing_kwargs"] == {"use_reentrant": False}
    assert fsdp.training_kwargs({"fsdp": "shard_grad_op"})["fsdp"] == "shard_grad_op"


def test_a_smoke_run_outside_torchrun_trains_as_written(strategy_restored, monkeypatch):
    import torch.distributed as dist

    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    fsdp._chosen.update(strategy="fsdp", layers=("LlamaDecoderLayer",))
    assert fsdp.training_kwargs({"learning_rate": 2e-4}) == {"learning_rate": 2e-4}


def test_a_quantized_model_is_refused_saying_why(strategy_restored):
    with pytest.raises(UsageError, match=r"--strategy fsdp with load_in_4bit=True \(unsloth/x-bnb-4bit\): .*"
                                         r"bitsandbytes#1945.*use --strategy ddp"):
        fsdp.refuse_quantized("unsloth/x-bnb-4bit", 4)


def test_the_training_arguments_take_them(strategy_restored, monkeypatch):
    """The keywords are ones this Transformers' TrainingArguments accepts and turns into accelerate's plugin."""
    import os

    import torch.distributed as dist
    from transformers import TrainingArguments

    # Transformers 4.x tells accelerate through os.environ (ACCELERATE_USE_FSDP, FSDP_*): later trainers in this
    # process, and the processes tests start, would then look for a GPU
    monkeypatch.setattr(os, "environ", dict(os.environ))

    monkeypatch.setattr(dist, "is_initialized", lambda: True)  # under torchrun

    fsdp._chosen.update(strategy="fsdp", layers=("LlamaDecoderLayer",))
    arguments = TrainingArguments(output_dir="unused", report_to="none", use_cpu=True,
                                  **fsdp.training_kwargs({"gradient_checkpointing": True}))
    assert arguments.fsdp and arguments.fsdp_config["transformer_layer_cls_to_wrap"] == ["LlamaDecoderLayer"]


def test_generation_after_sharded_training_says_why_instead_of_waiting():
    class Model:
        def generate(self, **kwargs):
            return "tokens"

    model = Model()
    fsdp.refuse_lone_generation(model)
    with pytest.raises(UsageError, match=r"model\.generate\(\) after training under --strategy fsdp on several GPUs"):
        model.generate(max_new_tokens=8)


WORKER = textwrap.dedent('''
    import json, os, sys
    import torch, torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from nbddp.runtime.backends.hf_backend import FastLanguageModel
    from nbddp.runtime.trainer import fsdp

    model_path, out = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model, _ = FastLanguageModel.from_pretrained(model_path, max_seq_length=32, load_in_4bit=False)
    model = FastLanguageModel.get_peft_model(model, r=4, lora_alpha=8, random_state=3407)
    batch = torch.tensor([[1, 3, 4, 5, 6, 3, 7], [1, 8, 9, 10, 11, 12, 2]])
    if sys.argv[3] == "fsdp1":  # as accelerate wraps a PEFT model: the trainable modules in units of their own
        from peft.utils.other import fsdp_auto_wrap_policy
        from torch.distributed.fsdp import FullyShardedDataParallel
        model = FullyShardedDataParallel(model, auto_wrap_policy=fsdp_auto_wrap_policy(model), use_orig_params=False,
                                         device_id=torch.device("cpu"))
    else:
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for layer in model.base_model.model.model.layers:  # as accelerate's TRANSFORMER_BASED_WRAP does
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
    model(input_ids=batch, labels=batch).loss.backward()
    optimizer.step()
    fsdp.install()
    from transformers import TrainerState
    state = TrainerState(is_world_process_zero=rank == 0)
    from types import SimpleNamespace
    fsdp.gather_adapter_class()().on_train_end(SimpleNamespace(world_size=dist.get_world_size()), state, None,
                                               model=model)
    if rank == 0:
        fsdp.peft_model_of(model).save_pretrained(out)
        with torch.no_grad():
            full = {name: tensor for name, tensor in fsdp.peft_model_of(model).nbddp_gathered.items()}
        json.dump({"keys": sorted(full), "sums": {k: float(v.double().sum()) for k, v in full.items()}},
                  open(os.path.join(out, "gathered.json"), "w"))
    dist.barrier()
    dist.destroy_process_group()
''')


@pytest.mark.parametrize("version, processes", [("fsdp2", 2), ("fsdp1", 1)])
def test_the_main_process_saves_the_whole_adapter_gathered_from_the_shards(tiny_llama_dir, model_cache, tmp_path,
                                                                          strategy_restored, version, processes):
    """FSDP2 on 2 processes; FSDP1 (a notebook's own fsdp_config) on 1, as on CPU this torch's FSDP1 fails its
    own full state dict with 2 (unflatten: "storage of size 0"). FSDP1's wrapper modules put `_fsdp_wrapped_module.`
    in the names PEFT picks an adapter's weights by: it saved none of them, on one H200 and here."""
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from nbddp.runtime.backends.hf_backend import FastLanguageModel
    from nbddp.runtime.backends.tiny_model import ensure_weights

    model_path = ensure_weights(str(tiny_llama_dir))
    worker, out = tmp_path / "worker.py", tmp_path / "adapter"
    worker.write_text(WORKER)
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                             str(processes), str(worker), model_path, str(out), version], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    gathered = json.loads((out / "gathered.json").read_text())
    saved = load_file(out / "adapter_model.safetensors")
    assert saved and all(".lora_" in key for key in saved)
    # the whole of each weight, each rank's half put back (what the ranks trained, not rank 0's shard): the shapes
    # of the same adapter never sharded
    model, _ = FastLanguageModel.from_pretrained(model_path, max_seq_length=32, load_in_4bit=False)
    unsharded = FastLanguageModel.get_peft_model(model, r=4, lora_alpha=8, random_state=3407)
    shapes = {name.replace(".default", ""): tuple(p.shape) for name, p in unsharded.named_parameters()
              if p.requires_grad}
    assert {key: tuple(tensor.shape) for key, tensor in saved.items()} == shapes
    for key, total in gathered["sums"].items():
        assert float(saved[key.replace(".default", "")].double().sum()) == pytest.approx(total)
    reloaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_path), out)  # plain PEFT
    assert sum(1 for name, _ in reloaded.named_parameters() if "lora_" in name) == len(saved)
