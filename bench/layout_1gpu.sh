#!/bin/bash
# One device call (kind nvidia-h200, carry .gpu-site): real Unsloth notebooks' exported scripts on one H200, as
# written (A) vs `--batch_layout auto` (B), interleaved A B A B (bench/layout_notebook.py says how).
#   BENCH_COMMIT=<commit> bash bench/layout_1gpu.sh [DEADLINE_S [PARTS]]        (repository root, $OUT set)
# DEADLINE_S (default 560) counts from this script's start; PARTS (default alpaca_8b,alpaca_1b,conversational_3b)
# run in that order, each only if its preparation and first pair fit. Needs .gpu-site/site.tgz and the notebooks in
# .gpu-site/notebooks/ (both git-ignored, carried). Results: $OUT/layout_1gpu.json (rewritten after every trial),
# $OUT/trials/<part>/<round>_<variant>/ (metrics.jsonl, trainer_state.json, trial.json, log_excerpt.txt), $OUT/log.
# Profiled, on alpaca-cleaned's row lengths and a 32k tokenizer (the defaults on a GPU), one pair a part:
#   LAYOUT_ROUNDS=1 LAYOUT_PROFILE_STEPS=41-43 bash bench/layout_1gpu.sh 575 alpaca_8b,conversational_3b
# FSDP's price on a real notebook (QLoRA under FSDP1 on the fallback vs Unsloth under DDP):
#   LAYOUT_A_FLAGS="--strategy ddp" LAYOUT_B_FLAGS="--strategy fsdp" LAYOUT_MAX_STEPS=15 LAYOUT_RESUME_CHECK=1 \
#     bash bench/layout_1gpu.sh 560 alpaca_1b_bf16        (alpaca_1b: QLoRA; the resume check: B saves and resumes)
# CPU check here: LAYOUT_TINY=1 PYTHON=.venv/bin/python LAYOUT_MAX_STEPS=5 OUT=/tmp/o bash bench/layout_1gpu.sh 400
set -o pipefail
started=$(date +%s)
deadline=${1:-560}
parts=${2:-alpaca_8b,alpaca_1b,conversational_3b}
: "${OUT:?set OUT to the results folder}"
mkdir -p "$OUT"
if [ -z "${LAYOUT_TINY:-}" ]; then source bench/gpu_site.sh; fi
python=${PYTHON:-python3}
{
  nvidia-smi --query-gpu=index,name,memory.total,clocks.sm,temperature.gpu,utilization.gpu --format=csv 2>/dev/null \
    || echo "no nvidia-smi"
  "$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
    "gpus", torch.cuda.device_count())'
  left=$((deadline - ($(date +%s) - started)))
  "$python" -m bench.layout_notebook run --out "$OUT" --parts "$parts" --deadline-s "$left" \
    --work "${LAYOUT_WORK:-/tmp/layout}" --rounds "${LAYOUT_ROUNDS:-2}" ${LAYOUT_RESUME_CHECK:+--resume-check}
  echo "layout_notebook exit status $?"
} 2>&1 | tee "$OUT/log"
"$python" -m bench.layout_notebook summarize --out "$OUT" >/dev/null 2>&1
du -sh "$OUT" 2>/dev/null
exit 0
