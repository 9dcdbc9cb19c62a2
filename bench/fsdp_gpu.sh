#!/bin/bash
# One device call: --strategy fsdp on the GPU host, world size 1 (the kind lent so far), the embedded job.
#   bash bench/fsdp_gpu.sh        (repository root, $OUT set, carry .gpu-site/site.tgz; RUNS="fsdp_bf16": some)
# 1. pipeline (pipeline.py run --strategy fsdp): smoke run, then torchrun, Transformers+PEFT under FSDP2 (bf16 LoRA);
# 2. fsdp_bf16, ddp_bf16: the same steps under FSDP and DDP on one backend (--backend hf), losses and tokens/s;
# 3. fsdp_qlora, ddp_qlora: QLoRA (load_in_4bit) under --strategy fsdp (FSDP1) and ddp, losses and tokens/s;
# 4. each run's saved adapter reloaded with plain PEFT: the FSDP run's logits against the DDP run's;
# 5. fsdp_resume, fsdp_qlora_resume: 10 steps under FSDP (bf16, QLoRA) with a checkpoint every 5 (<name>_full),
#    then a second run given only its checkpoint-5 as a run stopped after step 5 leaves it (marked complete), with
#    --resume true (<name>_resumed): its steps 6-10 against the uninterrupted run's;
# 5b. fsdp_qlora_prequantized: the tiny Llama saved in 4 bits (uint8 storage, as unsloth/*-bnb-4bit are) beside its
#    base: --strategy fsdp loads the base instead and quantizes it as it loads
#    (nbddp.fallback.fsdp.shardable_checkpoint);
# 6. auto_fits: --strategy auto (the default) on the tiny model: rank 0's line says ddp, and why.
# 7. fsdp_merged_qlora, fsdp_merged_bf16: the Unsloth-style fixture notebook (tests/fixtures/unsloth_style) with its
#    `save_pretrained_merged(..., "merged_16bit")` line switched on (and load_in_4bit = False for bf16), exported and
#    trained under --strategy fsdp: its merged save (nbddp.fallback.fsdp.merged_in_one_process) against plain PEFT
#    merging the adapter the notebook saved into the 16-bit base, and against the base.
# Results: $OUT/log and $OUT/fsdp_gpu.json (per run: exit status, losses, tokens/s, peak memory).
set -o pipefail
source bench/gpu_site.sh
export PYTHONPATH=$PWD:$PYTHONPATH  # nbddp, for torchrun of the script (pipeline.py sets it itself)
steps=30
run() {  # name, then the script's flags
  local name=$1; shift
  echo "== $name: $*"
  timeout 240 python3 -m torch.distributed.run --standalone --nproc_per_node 1 generated/train.py \
    --max_steps $steps --output_dir /tmp/fsdp/$name "$@" > /tmp/fsdp/$name.log 2>&1
  echo "exit status $?"; grep -E "nbddp: (backend|SFTConfig|error)|Error|error:" /tmp/fsdp/$name.log | head -8
}
resume() {  # name, then flags: 10 steps with a checkpoint every 5, then a run given only checkpoint-5, resumed
  local name=$1; shift
  rm -rf /tmp/fsdp/${name}_*  # a warm machine's earlier call
  run ${name}_full --strategy fsdp --max_steps 10 --save_steps 5 "$@"
  ls -A /tmp/fsdp/${name}_full/checkpoint-5
  mkdir -p /tmp/fsdp/${name}_resumed
  cp -r /tmp/fsdp/${name}_full/checkpoint-5 /tmp/fsdp/${name}_resumed/
  run ${name}_resumed --strategy fsdp --max_steps 10 --save_steps 5 --resume true "$@"
  grep "resuming from" /tmp/fsdp/${name}_resumed.log
}
merged() {  # name, then sed expressions for the fixture: export it, train 10 steps under --strategy fsdp
  local name=$1 work=/tmp/fsdp/$1 repo=$PWD; shift
  rm -rf $work; mkdir -p $work/nb
  sed -e 's/^if False: \(model.save_pretrained_merged("model", tokenizer, save_method = "merged_16bit",)\)/\1/' "$@" \
    tests/fixtures/unsloth_style/01_finetune.py > $work/nb/01_finetune.py
  grep -n -e "^model.save_pretrained_merged" -e "^load_in_4bit" $work/nb/01_finetune.py
  (cd $work/nb && python3 -m jupytext -q --to ipynb 01_finetune.py) && python3 pipeline.py export --notebooks $work/nb \
    --out $work/out | tail -3 || return
  echo "== $name: $work/out/train.py --strategy fsdp"
  (cd $work && time timeout 240 python3 -m torch.distributed.run --standalone --nproc_per_node 1 out/train.py \
    --strategy fsdp --max_steps 10 --model_name $repo/models/tiny-llama --data_path $repo/data/tiny_instructions.jsonl \
    > $work.log 2>&1; echo "exit status $?")
  grep -E "nbddp: (backend|--strategy|error)|Error|error:" $work.log | head -8; ls $work/nb/model $work/nb/lora_model
}
prequantize() {  # folder: the tiny Llama saved already quantized (as unsloth/*-bnb-4bit are), beside its base
  python3 - "$1" <<'EOF'
import shutil, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig
from nbddp.examples.tiny_model import ensure_weights
base = ensure_weights("models/tiny-llama")
shutil.copytree(base, f"{sys.argv[1]}/tiny-llama", dirs_exist_ok=True)
config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                            bnb_4bit_compute_dtype=torch.bfloat16)
model = AutoModelForCausalLM.from_pretrained(base, quantization_config=config, device_map={"": 0})
model.save_pretrained(f"{sys.argv[1]}/tiny-llama-bnb-4bit")
AutoTokenizer.from_pretrained(base).save_pretrained(f"{sys.argv[1]}/tiny-llama-bnb-4bit")
print("saved in 4 bits:", model.config.quantization_config.bnb_4bit_quant_storage)
EOF
}
{
  nvidia-smi --query-gpu=index,name,memory.total --format=csv
  mkdir -p /tmp/fsdp
  for name in ${RUNS:-pipeline fsdp_bf16 ddp_bf16 fsdp_qlora ddp_qlora fsdp_resume fsdp_qlora_resume fsdp_qlora_prequantized auto_fits fsdp_merged_qlora fsdp_merged_bf16}; do  # RUNS: some of them
    case $name in
      pipeline) echo "== pipeline.py run --strategy fsdp"
        time timeout 300 python3 pipeline.py run --strategy fsdp -p max_steps $steps
        echo "pipeline run exit status $?" ;;
      fsdp_bf16) run fsdp_bf16 --strategy fsdp ;;
      ddp_bf16) run ddp_bf16 --strategy ddp --backend hf ;;
      fsdp_qlora) run fsdp_qlora --strategy fsdp --load_in_4bit true ;;
      ddp_qlora) run ddp_qlora --strategy ddp --backend hf --load_in_4bit true ;;
      fsdp_resume) resume fsdp_resume ;;
      fsdp_qlora_resume) resume fsdp_qlora_resume --load_in_4bit true ;;
      fsdp_qlora_prequantized) prequantize /tmp/fsdp/models
        run fsdp_qlora_prequantized --strategy fsdp --load_in_4bit true --model_name /tmp/fsdp/models/tiny-llama-bnb-4bit
        grep "quantizing it as it loads" /tmp/fsdp/fsdp_qlora_prequantized.log ;;
      auto_fits) run auto_fits --max_steps 2; grep -- "--strategy auto" /tmp/fsdp/auto_fits.log ;;
      fsdp_merged_qlora) merged fsdp_merged_qlora ;;
      fsdp_merged_bf16) merged fsdp_merged_bf16 -e 's/^load_in_4bit = True/load_in_4bit = False/' ;;
    esac
  done
  python3 - <<'EOF'
import json, os, torch
from peft import PeftModel
from transformers import AutoModelForCausalLM
from nbddp.examples.tiny_model import ensure_weights
out = {}
runs = ("fsdp_bf16", "ddp_bf16", "fsdp_qlora", "ddp_qlora", "fsdp_qlora_prequantized", "fsdp_resume_full",
        "fsdp_resume_resumed", "fsdp_qlora_resume_full", "fsdp_qlora_resume_resumed")
for name in runs:
    path = f"/tmp/fsdp/{name}/metrics.jsonl"
    rows = [json.loads(line) for line in open(path)] if os.path.exists(path) else []
    steps = [r for r in rows if "loss" in r and r.get("event") is None]
    out[name] = {"losses": [round(r["loss"], 5) for r in steps], "steps": [r["step"] for r in steps],
                 "tokens_per_s": [round(r["tokens_per_s"]) for r in steps if r.get("tokens_per_s")][-5:],
                 "peak_mem_gib": max((r.get("peak_mem_gib") or 0 for r in steps), default=None)}
base = ensure_weights("models/tiny-llama")
ids = torch.tensor([[2, 5, 9, 14, 20, 3, 7, 11]])
def adapter_logits(name):  # the notebook's save, {output_dir}/lora_adapter, reloaded with plain PEFT
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), f"/tmp/fsdp/{name}/lora_adapter")
    with torch.no_grad():
        return model.eval()(input_ids=ids).logits
for fsdp_run, ddp_run in (("fsdp_bf16", "ddp_bf16"), ("fsdp_qlora", "ddp_qlora"),
                          ("fsdp_qlora_prequantized", "ddp_qlora")):
    try:
        a, b = adapter_logits(fsdp_run), adapter_logits(ddp_run)
        out[fsdp_run]["adapter_vs_ddp"] = {"max_abs_logit_diff": float((a - b).abs().max()),
                                           "logit_scale": float(b.abs().max())}
    except Exception as error:  # reported, not hidden
        out[fsdp_run]["adapter_vs_ddp"] = repr(error)[:300]
for name in ("fsdp_resume", "fsdp_qlora_resume"):
    full, resumed = (dict(zip(out[f"{name}_{n}"]["steps"], out[f"{name}_{n}"]["losses"])) for n in ("full", "resumed"))
    out[f"{name}_vs_uninterrupted"] = {"steps": sorted(resumed), "max_abs_loss_diff": max(
        (abs(loss - full[step]) for step, loss in resumed.items() if step in full), default=None)}
auto = [line for line in open("/tmp/fsdp/auto_fits.log") if "--strategy auto" in line] \
    if os.path.exists("/tmp/fsdp/auto_fits.log") else []
out["auto_fits"] = auto[0].strip() if auto else None
for name in ("fsdp_merged_qlora", "fsdp_merged_bf16"):  # the merged save against PEFT's merge of the saved adapter
    folder = f"/tmp/fsdp/{name}/nb"
    if not os.path.isdir(f"{folder}/model"):
        continue
    try:
        merged = AutoModelForCausalLM.from_pretrained(f"{folder}/model", dtype=torch.bfloat16)
        plain = AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16)
        untouched = {key: value.clone() for key, value in plain.state_dict().items()}
        expected = PeftModel.from_pretrained(plain, f"{folder}/lora_model").merge_and_unload()
        ours, theirs = merged.state_dict(), expected.state_dict()
        with torch.no_grad():
            a, b = merged.eval()(input_ids=ids).logits, expected.eval()(input_ids=ids).logits
        out[name] = {"dtypes": sorted({str(v.dtype) for v in ours.values()}), "same_keys": ours.keys() == theirs.keys(),
                     "weights_bit_equal_to_peft_merge": all(torch.equal(ours[k], theirs[k]) for k in theirs),
                     "weights_changed_from_base": sum(not torch.equal(ours[k], untouched[k]) for k in untouched),
                     "max_abs_logit_diff_vs_peft_merge": float((a - b).abs().max()),
                     "logit_scale": float(b.abs().max())}
    except Exception as error:  # reported, not hidden
        out[name] = repr(error)[:300]
print(json.dumps(out, indent=1))
json.dump(out, open(os.environ["OUT"] + "/fsdp_gpu.json", "w"), indent=1)
EOF
  tail -30 /tmp/fsdp/fsdp_bf16.log
} 2>&1 | tee "$OUT/log"
exit 0
