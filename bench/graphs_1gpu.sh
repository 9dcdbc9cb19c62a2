#!/bin/bash
# One device call (carry .gpu-site): is the run setting `cuda_graphs` right, and what does it give the 8B notebook?
#   BENCH_COMMIT=<commit> bash bench/graphs_1gpu.sh [DEADLINE_S]        (repository root, $OUT set; default 520)
# 1. python -m bench.graphed_layers --layers 8: the lever under the model's own forward (its `runtime` stage fails
#    unless every micro batch replayed), beside the shared pool of two buckets and the eager yardstick.
# 2. Only if 1's `runtime` stage passed: the layout pair on the 8B Alpaca notebook, `auto` against `auto` with the
#    setting on, 25 steps each (bench/layout_1gpu.sh).
# Results: $OUT/graphed_layers_8.json and .log; $OUT/layout/ (layout_1gpu.json, log); $OUT/layout_trials.tgz (the
# trial folders, one file: a folder that deep does not come back from the device); $OUT/log (this script's output).
set -o pipefail
started=$(date +%s)
deadline=${1:-520}
: "${OUT:?set OUT to the results folder}"
source bench/gpu_site.sh
{
  nvidia-smi --query-gpu=index,name,memory.total --format=csv
  timeout 240 python3 -m bench.graphed_layers --layers 8 --out "$OUT/graphed_layers_8.json" \
    > "$OUT/graphed_layers_8.log" 2>&1
  echo "graphed_layers exit status $? after $(($(date +%s) - started))s"
  if python3 -c 'import json, sys; sys.exit(0 if json.load(open(sys.argv[1])).get("runtime") else 1)' \
      "$OUT/graphed_layers_8.json" 2>/dev/null; then
    mkdir -p "$OUT/layout"
    OUT="$OUT/layout" LAYOUT_ROUNDS=1 LAYOUT_A_FLAGS="--batch_layout auto" LAYOUT_B_ENV="NBDDP_CUDA_GRAPHS=1" \
      LAYOUT_MAX_STEPS=25 LAYOUT_FIRST_TRIAL_S=105 bash bench/layout_1gpu.sh $((deadline - ($(date +%s) - started))) \
      alpaca_8b > /dev/null 2>&1
    (cd "$OUT/layout" && tar czf ../layout_trials.tgz trials && rm -rf trials)
    grep "\[layout\]" "$OUT/layout/log" | tail -4
  else
    echo "the lever's own check did not pass: no layout pair (graphed_layers_8.json's errors, or its .log)"
  fi
} 2>&1 | tee "$OUT/log"
