#!/bin/bash
# One device call (carry .gpu-site): are the run settings `cuda_graphs` and `one_launch_optimizer` right, and what
# do they give the 8B notebook?
#   BENCH_COMMIT=<commit> bash bench/graphs_1gpu.sh [DEADLINE_S]        (repository root, $OUT set; default 520)
# 1. python -m bench.bnb_step_syncs: bitsandbytes' 8-bit AdamW on the 8B's 448 LoRA tensors, as shipped, without
#    its syncs, and in one launch (`one_launch_optimizer`); the setting passes when all three end bit for bit equal
#    and every tensor was in the one launch.
# 2. python -m bench.graphed_layers --layers 8: the lever under the model's own forward (its `runtime` stage fails
#    unless every micro batch replayed), beside the shared pool of two buckets and the eager yardstick.
# 3. With the settings that passed 1 and 2: the layout pair on the 8B Alpaca notebook, `auto` against `auto` with
#    them on, 25 steps each (bench/layout_1gpu.sh); the step split tells the optimizer's share from the layers'.
# Results: $OUT/bnb_one_launch.json and .log; $OUT/graphed_layers_8.json and .log; $OUT/layout/ (layout_1gpu.json,
# log); $OUT/layout_trials.tgz (the trial folders, one file: a folder that deep does not come back from the
# device); $OUT/log (this script's output).
set -o pipefail
started=$(date +%s)
deadline=${1:-520}
: "${OUT:?set OUT to the results folder}"
source bench/gpu_site.sh
passed() {  # passed FILE PYTHON-EXPRESSION-OF-d: whether the JSON file's record d satisfies it
  python3 -c "import json, sys; d = json.load(open(sys.argv[1])); sys.exit(0 if ($2) else 1)" "$1" 2>/dev/null
}
{
  nvidia-smi --query-gpu=index,name,memory.total --format=csv
  settings=""
  timeout 90 python3 -m bench.bnb_step_syncs --rounds 3 --steps 20 --out "$OUT/bnb_one_launch.json" \
    > "$OUT/bnb_one_launch.log" 2>&1
  echo "bnb_step_syncs exit status $? after $(($(date +%s) - started))s"
  if passed "$OUT/bnb_one_launch.json" 'd["same_result"] and all(r["one_launch"]["flat_tensors"] == d["tensors"] for r in d["rounds"])'; then
    settings="NBDDP_ONE_LAUNCH_OPTIMIZER=1"
  else
    echo "one_launch_optimizer did not pass (bnb_one_launch.json's same_result, or its .log)"
  fi
  timeout 240 python3 -m bench.graphed_layers --layers 8 --out "$OUT/graphed_layers_8.json" \
    > "$OUT/graphed_layers_8.log" 2>&1
  echo "graphed_layers exit status $? after $(($(date +%s) - started))s"
  if passed "$OUT/graphed_layers_8.json" 'd.get("runtime")'; then
    settings="$settings NBDDP_CUDA_GRAPHS=1"
  else
    echo "cuda_graphs did not pass (graphed_layers_8.json's errors, or its .log)"
  fi
  if [ -n "$settings" ]; then
    echo "the layout pair: auto against auto with$settings"
    mkdir -p "$OUT/layout"
    OUT="$OUT/layout" LAYOUT_ROUNDS=1 LAYOUT_A_FLAGS="--batch_layout auto" LAYOUT_B_ENV="${settings# }" \
      LAYOUT_MAX_STEPS=25 LAYOUT_FIRST_TRIAL_S=105 bash bench/layout_1gpu.sh $((deadline - ($(date +%s) - started))) \
      alpaca_8b > /dev/null 2>&1
    (cd "$OUT/layout" && tar czf ../layout_trials.tgz trials && rm -rf trials)
    grep "\[layout\]" "$OUT/layout/log" | tail -4
  fi
} 2>&1 | tee "$OUT/log"
