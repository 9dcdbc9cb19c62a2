"""--strategy fsdp (nbddp/runtime/trainer/fsdp.py; loading and saving: nbddp/fallback/fsdp.py): the choice, the
training arguments it sets, and the adapter it gathers from shards and saves once.

Transformers' Trainer runs FSDP only on GPUs (accelerate), so its FSDP training is tested on the GPU host
(bench/fsdp_gpu.sh). Here, on 2 gloo processes, torch's FSDP2 shards a tiny PEFT model by hand, as accelerate
would, and nbddp's end-of-training gather and the main process's `save_pretrained` run on it.
"""
import json
import logging
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace
from unittest import mock

import pytest

from nbddp.errors import UsageError
from nbddp.fallback import fsdp as fallback_fsdp
from nbddp.runtime.trainer import fsdp


@pytest.fixture
def strategy_restored():
    yield
    sharding("ddp")
    fsdp._said.update(noted=False, optimizers_said=set())


def sharding(strategy="fsdp", layers=(), quantized=False):
    """This process under `strategy`, as setup's `fsdp.choose` puts it, with a loaded model of those decoder layers
    (4-bit: bitsandbytes' quantizer on it), as the fallback's from_pretrained remembers it."""
    fsdp.choose(strategy, "hf", on_gpu=True)
    fallback_fsdp.remember_model(SimpleNamespace(_no_split_modules=list(layers),
                                                 **({"hf_quantizer": object()} if quantized else {})))


def test_ddp_keeps_the_backend_and_fsdp_takes_the_fallback(strategy_restored):
    assert fsdp.choose("ddp", "unsloth", on_gpu=True) == ("ddp", "unsloth") and not fallback_fsdp.active()
    assert fsdp.choose("fsdp", "auto", on_gpu=True) == ("fsdp", "hf") and fallback_fsdp.active()


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
    sharding(layers=["LlamaDecoderLayer"])
    kwargs = fsdp.training_kwargs({"learning_rate": 2e-4, "gradient_checkpointing": True})
    assert kwargs["fsdp"] in (True, "full_shard auto_wrap") and kwargs["learning_rate"] == 2e-4
    assert kwargs["fsdp_config"] == {"version": 2, "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                                     "state_dict_type": "FULL_STATE_DICT",
                                     "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]}
    assert kwargs["gradient_checkpointing_kwargs"] == {"use_reentrant": False}
    assert fsdp.training_kwargs({"fsdp": "shard_grad_op"})["fsdp"] == "shard_grad_op"


@pytest.mark.parametrize("quantized, version", [(False, 2), (True, 1)])
def test_this_transformers_shards_as_the_option_string_says_without_deprecation(strategy_restored, monkeypatch,
                                                                                 caplog, quantized, version):
    """Transformers 5 deprecates `fsdp="full_shard auto_wrap"` (gone in 5.20) for `fsdp=True`; 4.56.2 takes only
    the string. Whichever this one takes, accelerate is handed what the string gives."""
    import torch.distributed as dist
    from transformers import TrainingArguments

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    sharding(layers=["LlamaDecoderLayer"], quantized=quantized)
    kwargs = fsdp.training_kwargs({"output_dir": "out", "use_cpu": True, "report_to": []})
    assert kwargs["fsdp_config"]["version"] == version
    string_form = {**kwargs, "fsdp": "full_shard auto_wrap", "fsdp_config": dict(kwargs["fsdp_config"])}
    transformers_log = logging.getLogger("transformers")  # which does not propagate to caplog's root handler
    monkeypatch.setattr(transformers_log, "handlers", [caplog.handler])
    with mock.patch.dict(os.environ):  # 4.x sets accelerate's ACCELERATE_USE_FSDP, FSDP_*: every later Trainer's
        chosen = TrainingArguments(**kwargs)
        warned = [r for r in caplog.records if "Passing `fsdp` as a" in r.getMessage()]
        given = TrainingArguments(**string_form)
    assert not warned
    if not hasattr(chosen, "fsdp_plugin_args"):  # 4.x: the string itself, read into those variables
        assert kwargs["fsdp"] == "full_shard auto_wrap"
        return
    assert chosen.fsdp_plugin_args == given.fsdp_plugin_args


def test_the_bitsandbytes_optimizers_are_transformers_own():
    from nbddp.runtime.trainer.optimizers import BITSANDBYTES_OPTIMIZERS

    transformers_optimizers = pytest.importorskip("transformers.trainer_optimizer")  # Transformers 5's home
    assert BITSANDBYTES_OPTIMIZERS == {o.value for o in transformers_optimizers._BITSANDBYTES_OPTIMIZERS}


def test_a_quantized_optimizer_becomes_torchs_of_the_same_update(strategy_restored, monkeypatch, caplog):
    import torch.distributed as dist
    from transformers.training_args import OptimizerNames

    from nbddp.runtime.trainer.optimizers import QUANTIZED_TORCH_UPDATE

    assert set(QUANTIZED_TORCH_UPDATE.values()) - {None} <= {o.value for o in OptimizerNames}
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda: 0)
    sharding(layers=["LlamaDecoderLayer"])
    assert fsdp.training_kwargs({"optim": "adamw_8bit"})["optim"] == "adamw_torch"
    assert fsdp.training_kwargs({"optim": OptimizerNames.ADAMW_8BIT})["optim"] == "adamw_torch"
    assert fsdp.training_kwargs({"optim": "rmsprop_bnb_8bit"})["optim"] == "rmsprop"
    assert fsdp.training_kwargs({"optim": "adamw_torch_fused"})["optim"] == "adamw_torch_fused"
    assert "optim" not in fsdp.training_kwargs({})  # the config's default, unquantized
    said = caplog.text
    assert said.count("optim='adamw_8bit' -> 'adamw_torch': FSDP can neither shard nor save") == 1
    with pytest.raises(UsageError, match=r"--strategy fsdp with optim='paged_lion_8bit': a bitsandbytes optimizer"
                                         r".*use optim='adamw_torch' with --strategy fsdp, or --strategy ddp"):
        fsdp.training_kwargs({"optim": "paged_lion_8bit"})


def test_a_smoke_run_outside_torchrun_trains_as_written(strategy_restored, monkeypatch):
    import torch.distributed as dist

    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    sharding(layers=["LlamaDecoderLayer"])
    assert fsdp.training_kwargs({"learning_rate": 2e-4}) == {"learning_rate": 2e-4}


def test_an_8bit_model_is_refused_saying_why(strategy_restored):
    with pytest.raises(UsageError, match=r"--strategy fsdp with load_in_8bit=True \(unsloth/x\): .*4-bit ones "
                                         r"\(QLoRA, under FSDP1\).*or --strategy ddp"):
        fallback_fsdp.refuse_8bit("unsloth/x")


def test_a_4bit_model_is_sharded_by_fsdp1_with_flat_parameters(strategy_restored, monkeypatch):
    import torch.distributed as dist

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    sharding()
    fallback_fsdp.remember_model(SimpleNamespace(_no_split_modules=["LlamaDecoderLayer"]))
    assert fsdp.training_kwargs({})["fsdp_config"]["version"] == 2
    fallback_fsdp.remember_model(SimpleNamespace(_no_split_modules=["LlamaDecoderLayer"],
                                                 hf_quantizer=object()))  # bnb's
    assert fsdp.training_kwargs({})["fsdp_config"] == {
        "version": 1, "auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "state_dict_type": "FULL_STATE_DICT",
        "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"], "use_orig_params": False,
        "cpu_ram_efficient_loading": False}


def _checkpoint(folder, quantization=None):
    """A model folder as AutoConfig reads it: the tiny Llama's config, saved already quantized when given."""
    from pathlib import Path

    folder.mkdir(parents=True)
    config = json.loads((Path(__file__).parents[2] / "models" / "tiny-llama" / "config.json").read_text())
    if quantization is not None:
        config["quantization_config"] = {"quant_method": "bitsandbytes", **quantization}
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


PREQUANTIZED = {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_quant_storage": "uint8"}


def test_a_checkpoint_saved_in_4_bits_is_loaded_from_its_base(tmp_path, capsys, monkeypatch):
    import torch

    base = _checkpoint(tmp_path / "tiny")
    packed = _checkpoint(tmp_path / "tiny-bnb-4bit", PREQUANTIZED)
    assert fallback_fsdp.shardable_checkpoint(packed, False, torch.bfloat16) == (base, True)
    assert f"loading {base} and quantizing it as it loads" in capsys.readouterr().out
    assert fallback_fsdp.shardable_checkpoint(base, True,
                                              torch.bfloat16) == (base, True)  # quantized as it loads anyway
    monkeypatch.setattr(fallback_fsdp, "is_main_process", lambda: False)  # said by the main process alone
    assert fallback_fsdp.shardable_checkpoint(packed, True, torch.bfloat16) == (base, True)
    assert capsys.readouterr().out == ""
    stored_alike = _checkpoint(tmp_path / "alike-bnb-4bit", {**PREQUANTIZED, "bnb_4bit_quant_storage": "bfloat16"})
    assert fallback_fsdp.shardable_checkpoint(stored_alike, False, torch.bfloat16) == (stored_alike, True)


@pytest.mark.parametrize("name, quantization, message", [
    ("orphan-bnb-4bit", PREQUANTIZED, r"'[^']*orphan', the checkpoint its name names as its base, cannot be loaded"),
    ("packed", PREQUANTIZED, r"packed in uint8, .* its name names no base checkpoint .*or use --strategy ddp"),
    ("eight", {"load_in_8bit": True}, r"load_in_8bit=True .*not bitsandbytes' 8-bit weights"),
])
def test_a_quantized_checkpoint_fsdp_cannot_shard_is_refused(tmp_path, name, quantization, message):
    import torch

    with pytest.raises(UsageError, match=message):
        fallback_fsdp.shardable_checkpoint(_checkpoint(tmp_path / name, quantization), True, torch.bfloat16)


def test_full_finetuning_is_refused_as_it_loads(tiny_llama_dir, model_cache, strategy_restored):
    """The notebook's save of a fully finetuned model runs on the main process alone, and FSDP shards the whole
    model: nothing could gather it there."""
    from nbddp.fallback.models import FastLanguageModel
    from nbddp.examples.tiny_model import ensure_weights

    sharding()
    with pytest.raises(UsageError, match=r"--strategy fsdp with full_finetuning=True .* Train LoRA .* --strategy ddp"):
        FastLanguageModel.from_pretrained(ensure_weights(str(tiny_llama_dir)), max_seq_length=32,
                                          load_in_4bit=False, full_finetuning=True)


@pytest.mark.parametrize("init, stored_quantized, message", [
    ("pissa", False, r"init_lora_weights='pissa', which rewrote the base weights .* no longer holds them; save the "
                     r"adapter \(save_method=\"lora\"\)"),
    (True, True, r"is stored quantized, and the merge loads the base checkpoint again in 16 bits"),
])
def test_a_merge_the_checkpoint_cannot_give_is_refused(tiny_llama_dir, model_cache, tmp_path, strategy_restored,
                                                        init, stored_quantized, message):
    import torch

    from nbddp.fallback.models import FastLanguageModel
    from nbddp.examples.tiny_model import ensure_weights

    model, _ = FastLanguageModel.from_pretrained(ensure_weights(str(tiny_llama_dir)), max_seq_length=32,
                                                 load_in_4bit=False)
    peft_model = FastLanguageModel.get_peft_model(model, r=4, lora_alpha=8, random_state=3407)
    peft_model.peft_config["default"].init_lora_weights = init
    if stored_quantized:
        peft_model.get_base_model().name_or_path = _checkpoint(tmp_path / "stored-bnb-4bit", PREQUANTIZED)
    peft_model.nbddp_gathered = {"a": torch.zeros(1)}  # as at the end of training
    with pytest.raises(UsageError, match=message):
        fallback_fsdp.merged_in_one_process(peft_model, torch.bfloat16)


def test_a_4bit_model_under_fsdp_keeps_its_dtypes_for_flattening(tiny_llama_dir, model_cache, strategy_restored,
                                                                  monkeypatch):
    """prepare_model_for_kbit_training casts the norms to float32, and FSDP1 flattens a layer's frozen weights into
    one tensor of one dtype ("Must flatten tensors with uniform dtype", on one H200): under FSDP it is skipped, as
    TRL does for sharded QLoRA."""
    import peft

    from nbddp.fallback.models import FastLanguageModel
    from nbddp.examples.tiny_model import ensure_weights

    def cast(model, **kwargs):
        raise AssertionError("prepare_model_for_kbit_training under FSDP")

    monkeypatch.setattr(peft, "prepare_model_for_kbit_training", cast)
    sharding()
    model, _ = FastLanguageModel.from_pretrained(ensure_weights(str(tiny_llama_dir)), max_seq_length=32,
                                                 load_in_4bit=False)
    model.hf_quantizer = object()  # as a bitsandbytes model has (bitsandbytes itself needs CUDA)
    FastLanguageModel.get_peft_model(model, r=4, lora_alpha=8, random_state=3407)
    sharding("ddp")
    with pytest.raises(AssertionError, match="under FSDP"):
        FastLanguageModel.get_peft_model(model, r=4, lora_alpha=8, random_state=3407)


def test_the_training_arguments_take_them(strategy_restored, monkeypatch):
    """The keywords are ones this Transformers' TrainingArguments accepts and turns into accelerate's plugin."""
    import os

    import torch.distributed as dist
    from transformers import TrainingArguments

    # Transformers 4.x tells accelerate through os.environ (ACCELERATE_USE_FSDP, FSDP_*): later trainers in this
    # process, and the processes tests start, would then look for a GPU
    monkeypatch.setattr(os, "environ", dict(os.environ))

    monkeypatch.setattr(dist, "is_initialized", lambda: True)  # under torchrun

    sharding(layers=["LlamaDecoderLayer"])
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


GENERATING_WORKER = textwrap.dedent('''
    import json, sys
    from types import SimpleNamespace
    import torch, torch.distributed as dist
    from peft.utils.other import fsdp_auto_wrap_policy
    from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision
    from transformers import TrainerState
    from nbddp.fallback.models import FastLanguageModel
    from nbddp.runtime.trainer import fsdp

    fsdp.install()
    dist.init_process_group("gloo")
    model, _ = FastLanguageModel.from_pretrained(sys.argv[1], max_seq_length=32, load_in_4bit=False)
    model = FastLanguageModel.get_peft_model(model, r=4, lora_alpha=8, random_state=3407)
    # as accelerate shards QLoRA for a bf16 run: FSDP1, LoRA in units of their own, float32 weights cast in forward
    bf16 = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16, buffer_dtype=torch.bfloat16)
    model = FullyShardedDataParallel(model, auto_wrap_policy=fsdp_auto_wrap_policy(model), use_orig_params=False,
                                     device_id=torch.device("cpu"), mixed_precision=bf16)
    prompt = torch.tensor([[1, 3, 4, 5, 6, 3, 7]])
    with torch.autocast("cpu", dtype=torch.bfloat16):  # as Trainer trains in bf16
        model(input_ids=prompt, labels=prompt).loss.backward()
    fsdp.gather_adapter_class()().on_train_end(SimpleNamespace(world_size=1, bf16=True, fp16=False),
                                               TrainerState(), None, model=model)
    tokens = fsdp.peft_model_of(model).generate(input_ids=prompt, max_new_tokens=3, do_sample=False)
    json.dump(tokens.tolist(), open(sys.argv[2], "w"))
    dist.destroy_process_group()
''')


@pytest.mark.e2e
def test_generation_after_sharded_training_on_one_gpu_runs_as_training_did(tiny_llama_dir, model_cache, tmp_path):
    """A notebook's inference cell after QLoRA under FSDP1 on one GPU: PEFT casts the input to the float32 FSDP1
    keeps a LoRA unit's weights in between forwards, and the unit computes in bf16 ("expected mat1 and mat2 to have
    the same dtype", one H200). Trainer's forwards ran under autocast, and so does generate."""
    from nbddp.examples.tiny_model import ensure_weights

    worker, out = tmp_path / "worker.py", tmp_path / "tokens.json"
    worker.write_text(GENERATING_WORKER)
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1",
                             str(worker), ensure_weights(str(tiny_llama_dir)), str(out)], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    tokens = json.loads(out.read_text())
    assert len(tokens) == 1 and tokens[0][:7] == [1, 3, 4, 5, 6, 3, 7] and len(tokens[0]) == 10


WORKER = textwrap.dedent('''
    import json, os, sys
    import torch, torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from nbddp.fallback.models import FastLanguageModel
    from nbddp.runtime.trainer import fsdp

    model_path, out = sys.argv[1], sys.argv[2]
    fsdp.install()
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
    from transformers import TrainerState
    state = TrainerState(is_world_process_zero=rank == 0)
    from types import SimpleNamespace
    arguments = SimpleNamespace(world_size=dist.get_world_size(), bf16=False, fp16=False)  # float32, as trained here
    fsdp.gather_adapter_class()().on_train_end(arguments, state, None, model=model)
    restored = None
    if sys.argv[3] == "fsdp1":  # a Trainer checkpoint and its resume, as accelerate's save_/load_fsdp_model do them
        import peft
        from torch.distributed.fsdp import FullStateDictConfig, FullyShardedDataParallel, StateDictType
        with FullyShardedDataParallel.state_dict_type(model, StateDictType.FULL_STATE_DICT, FullStateDictConfig()):
            trained = {k: v.clone() for k, v in model.state_dict().items() if "lora_" in k}
            checkpoint = peft.get_peft_model_state_dict(model, adapter_name=model.active_adapter)
        with torch.no_grad():
            for parameter in model.parameters():
                if parameter.requires_grad:
                    parameter.zero_()
        with FullyShardedDataParallel.state_dict_type(model, StateDictType.FULL_STATE_DICT, FullStateDictConfig()):
            peft.set_peft_model_state_dict(model, checkpoint, adapter_name=model.active_adapter)
            now = model.state_dict()
        restored = {"checkpoint_keys": len(checkpoint), "trained": len(trained),
                    "equal": sum(torch.equal(now[k], v) for k, v in trained.items())}
    if rank == 0:
        fsdp.peft_model_of(model).save_pretrained(out)
        if sys.argv[3] == "fsdp1":  # FSDP1 shards QLoRA: as a 4-bit model has it (bitsandbytes itself needs CUDA)
            fsdp.peft_model_of(model).get_base_model().hf_quantizer = object()
        fsdp.peft_model_of(model).save_pretrained_merged(os.path.join(out, "merged"), save_method="merged_16bit")
        with torch.no_grad():
            full = {name: tensor for name, tensor in fsdp.peft_model_of(model).nbddp_gathered.items()}
        json.dump({"keys": sorted(full), "sums": {k: float(v.double().sum()) for k, v in full.items()},
                   "restored": restored}, open(os.path.join(out, "gathered.json"), "w"))
    dist.barrier()
    dist.destroy_process_group()
    from nbddp.runtime.ddp_core import exit_without_finalization
    exit_without_finalization()  # gloo's workers can abort a rank during interpreter finalization (its docstring)
''')


@pytest.mark.e2e
@pytest.mark.parametrize("version, processes", [("fsdp2", 2), ("fsdp1", 1)])
def test_the_main_process_saves_the_whole_adapter_gathered_from_the_shards(tiny_llama_dir, model_cache, tmp_path,
                                                                          strategy_restored, version, processes):
    """FSDP2 on 2 processes; FSDP1 (a notebook's own fsdp_config) on 1, as on CPU this torch's FSDP1 fails its
    own full state dict with 2 (unflatten: "storage of size 0"). FSDP1's wrapper modules put `_fsdp_wrapped_module.`
    in the names PEFT picks an adapter's weights by: it saved none of them, on one H200 and here."""
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from nbddp.fallback.models import FastLanguageModel
    from nbddp.examples.tiny_model import ensure_weights

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
    if version == "fsdp1":  # its checkpoint holds every LoRA weight, and loading it puts each back
        trained = gathered["restored"]["trained"]
        assert trained == len(saved) and gathered["restored"] == {"checkpoint_keys": trained, "trained": trained,
                                                                  "equal": trained}
    reloaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_path), out)  # plain PEFT
    assert sum(1 for name, _ in reloaded.named_parameters() if "lora_" in name) == len(saved)
    # the merged save, which the main process made alone from the checkpoint: the adapter it saved, merged by plain
    # PEFT into the base loaded in 16 bits
    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16)
    expected = PeftModel.from_pretrained(base, out).merge_and_unload().state_dict()
    assert {tensor.dtype for tensor in load_file(out / "merged" / "model.safetensors").values()} == {torch.bfloat16}
    merged = AutoModelForCausalLM.from_pretrained(out / "merged", dtype=torch.bfloat16).state_dict()
    assert merged.keys() == expected.keys() and all(torch.equal(merged[k], v) for k, v in expected.items())
    untouched = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16).state_dict()
    assert not torch.equal(merged["model.layers.0.self_attn.q_proj.weight"],
                           untouched["model.layers.0.self_attn.q_proj.weight"])
