#!/bin/bash
# One device call: unpack the GPU site packages, record the machine, run the bench harness.
#   bash bench/gpu_call.sh DEADLINE_S EXPERIMENT[,EXPERIMENT...]      (repository root, $OUT set)
# Results: $OUT/<experiment>.json, $OUT/logs.tgz, $OUT/log (this script's output), and $OUT/<first>_warmup.json
# from the short untimed trial that opens the call (bench.harness.warm_up_experiment; not a result).
# The host gets no .git: set BENCH_COMMIT to the commit of the tree you sent, for the results files.
set -o pipefail
deadline=${1:?deadline in seconds}
experiments=${2:?comma-separated experiments}
source bench/gpu_site.sh
{
  nvidia-smi --query-gpu=index,name,memory.total,clocks.sm,temperature.gpu,utilization.gpu --format=csv
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())'
  python3 -m bench.harness --out "$OUT" --experiments "$experiments" --deadline-s "$deadline" --work /tmp/bench
} 2>&1 | tee "$OUT/log"
