#!/bin/bash
# One device call (carry .gpu-site): the run settings `cuda_graphs` and `one_launch_optimizer` in the 8B notebook
# against the notebook as written, profiled: the targets (training time, GPU busy, launches, losses).
#   BENCH_COMMIT=<commit> bash bench/graphs_1gpu.sh [DEADLINE_S]        (repository root, $OUT set; default 540)
# 1. python -m bench.graphed_layers --layers 8: the graphs under the model's own forward (its `runtime` stage fails
#    unless every micro batch replayed; `padded_max_rel_diff` tells the graphs' share of its difference from eager
#    from the padding's), beside the shared pool of two buckets and the eager yardstick.
# 2. Only if 1's `runtime` stage passed: the layout pair on the 8B Alpaca notebook (bench/layout_1gpu.sh), its 60
#    steps, A as written against B `--batch_layout auto` with both settings on, steps 41-43 profiled. B's log says
#    how many micro batches replayed and how many tensors updated in one launch (`graphs_lines`).
# bitsandbytes' step in one launch against per tensor, bit for bit: python -m bench.bnb_step_syncs (call 16 of
# 2026-12-08, bench/results/bnb_one_launch_1xh100.json).
# Results: $OUT/graphed_layers_8.json and .log; $OUT/layout/ (layout_1gpu.json, log); $OUT/layout_trials.tgz (the
# trial folders with the profiles' summaries, one file: a folder that deep does not come back from the device);
# $OUT/log (this script's output).
set -o pipefail
started=$(date +%s)
deadline=${1:-540}
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
    OUT="$OUT/layout" LAYOUT_ROUNDS=1 LAYOUT_PROFILE_STEPS=41-43 \
      LAYOUT_B_ENV="NBDDP_CUDA_GRAPHS=1 NBDDP_ONE_LAUNCH_OPTIMIZER=1" \
      bash bench/layout_1gpu.sh $((deadline - ($(date +%s) - started))) alpaca_8b > /dev/null 2>&1
    (cd "$OUT/layout" && tar czf ../layout_trials.tgz trials && rm -rf trials)
    grep "\[layout\]" "$OUT/layout/log" | tail -4
  else
    echo "cuda_graphs did not pass its own check: no layout pair (graphed_layers_8.json's errors, or its .log)"
  fi
} 2>&1 | tee "$OUT/log"
