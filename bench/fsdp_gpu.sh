#!/bin/bash
# One device call: --strategy fsdp on the GPU host, world size 1 (the kind lent so far), the embedded job.
#   bash bench/fsdp_gpu.sh        (repository root, $OUT set, carry .gpu-site/site.tgz; RUNS="fsdp_bf16": some)
# 1. pipeline (pipeline.py run --strategy fsdp): smoke run, then torchrun, Transformers+PEFT under FSDP2 (bf16 LoRA);
# 2. fsdp_bf16, ddp_bf16: the same steps under FSDP and DDP on one backend (--backend hf), losses and tokens/s;
# 3. fsdp_qlora: QLoRA (load_in_4bit) under --strategy fsdp: refused, exit status 2 (trainer/fsdp.py says why);
# 4. each run's saved adapter reloaded with plain PEFT: the FSDP run's logits against the DDP run's;
# 5. fsdp_resume: 10 steps under FSDP with a checkpoint every 5 (fsdp_resume_full), then a second run given only
#    its checkpoint-5 as a run stopped after step 5 leaves it (marked complete), with --resume true
#    (fsdp_resume_resumed): its steps 6-10 against the uninterrupted run's;
# 6. auto_fits: --strategy auto (the default) on the tiny model: rank 0's line says ddp, and why.
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
{
  nvidia-smi --query-gpu=index,name,memory.total --format=csv
  mkdir -p /tmp/fsdp
  for name in ${RUNS:-pipeline fsdp_bf16 ddp_bf16 fsdp_qlora fsdp_resume auto_fits}; do  # RUNS: some of them
    case $name in
      pipeline) echo "== pipeline.py run --strategy fsdp"
        time timeout 300 python3 pipeline.py run --strategy fsdp -p max_steps $steps
        echo "pipeline run exit status $?" ;;
      fsdp_bf16) run fsdp_bf16 --strategy fsdp ;;
      ddp_bf16) run ddp_bf16 --strategy ddp --backend hf ;;
      fsdp_qlora) run fsdp_qlora --strategy fsdp --load_in_4bit true ;;
      fsdp_resume) rm -rf /tmp/fsdp/fsdp_resume_*  # a warm machine's earlier call
        run fsdp_resume_full --strategy fsdp --max_steps 10 --save_steps 5
        ls -A /tmp/fsdp/fsdp_resume_full/checkpoint-5
        mkdir -p /tmp/fsdp/fsdp_resume_resumed
        cp -r /tmp/fsdp/fsdp_resume_full/checkpoint-5 /tmp/fsdp/fsdp_resume_resumed/
        run fsdp_resume_resumed --strategy fsdp --max_steps 10 --save_steps 5 --resume true
        grep "resuming from" /tmp/fsdp/fsdp_resume_resumed.log ;;
      auto_fits) run auto_fits --max_steps 2; grep -- "--strategy auto" /tmp/fsdp/auto_fits.log ;;
    esac
  done
  python3 - <<'EOF'
import json, os, torch
from peft import PeftModel
from transformers import AutoModelForCausalLM
from nbddp.runtime.backends.tiny_model import ensure_weights
out = {}
for name in ("fsdp_bf16", "ddp_bf16", "fsdp_resume_full", "fsdp_resume_resumed"):
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
for fsdp_run, ddp_run in (("fsdp_bf16", "ddp_bf16"),):
    try:
        a, b = adapter_logits(fsdp_run), adapter_logits(ddp_run)
        out[fsdp_run]["adapter_vs_ddp"] = {"max_abs_logit_diff": float((a - b).abs().max()),
                                           "logit_scale": float(b.abs().max())}
    except Exception as error:  # reported, not hidden
        out[fsdp_run]["adapter_vs_ddp"] = repr(error)[:300]
full, resumed = (dict(zip(out[n]["steps"], out[n]["losses"])) for n in ("fsdp_resume_full", "fsdp_resume_resumed"))
out["resume_vs_uninterrupted"] = {"steps": sorted(resumed), "max_abs_loss_diff": max(
    (abs(loss - full[step]) for step, loss in resumed.items() if step in full), default=None)}
auto = [line for line in open("/tmp/fsdp/auto_fits.log") if "--strategy auto" in line] \
    if os.path.exists("/tmp/fsdp/auto_fits.log") else []
out["auto_fits"] = auto[0].strip() if auto else None
print(json.dumps(out, indent=1))
json.dump(out, open(os.environ["OUT"] + "/fsdp_gpu.json", "w"), indent=1)
EOF
  tail -30 /tmp/fsdp/fsdp_bf16.log
} 2>&1 | tee "$OUT/log"
exit 0
