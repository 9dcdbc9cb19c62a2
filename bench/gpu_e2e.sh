#!/bin/bash
# One device call: the product's own commands on the GPUs, as a user runs them (no bench harness).
#   bash bench/gpu_e2e.sh      (repository root, $OUT set; a machine with 2 or more GPUs, carry .gpu-site)
# 1. python pipeline.py run: export check, smoke run through papermill on one GPU, torchrun on every GPU,
#    summary and loss plot (the embedded tiny model and data, Unsloth backend);
# 2. python pipeline.py regress --suite regress_gpu.yaml --update-baseline: the notebook, 2-process DDP and
#    1-vs-2-process loss parity cases with Unsloth; records regress_gpu_baseline.json (parity is checked anyway);
# 3. a notebook written for Unsloth, not for nbddp (tests/fixtures/unsloth_style: no max_steps/output_dir
#    parameters of the smoke's, a `!command` and a %%writefile cell): export, then pipeline.py run --script.
# Results: $OUT/log (this script's output), $OUT/runs.tgz (runs/ of both commands, without saved weights),
# $OUT/regress_gpu_baseline.json.
set -o pipefail
source bench/gpu_site.sh
{
  nvidia-smi --query-gpu=index,name,memory.total --format=csv
  echo "== pipeline.py run"; time python3 pipeline.py run; echo "run exit status $?"
  echo "== pipeline.py regress --suite regress_gpu.yaml"
  time python3 pipeline.py regress --suite regress_gpu.yaml --update-baseline; echo "regress exit status $?"
  echo "== the Unsloth-style notebook: export, then pipeline.py run --script"
  python3 pipeline.py export --notebooks tests/fixtures/unsloth_style --out /tmp/unsloth_style \
    && time python3 pipeline.py run --script /tmp/unsloth_style/train.py; echo "unsloth-style run exit status $?"
  cat lora_model/NOTES.txt lora_model/TRAINING.md
} 2>&1 | tee "$OUT/log"
tar czf "$OUT/runs.tgz" --exclude='*.safetensors' --exclude='*.bin' --exclude='*.pt' runs
cp regress_gpu_baseline.json "$OUT/" 2>/dev/null
exit 0
