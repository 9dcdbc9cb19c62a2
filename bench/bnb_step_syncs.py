"""bitsandbytes' 8-bit AdamW step on Llama-3.1 8B's LoRA tensors (r 16 on the 7 projections of 32 layers: 448
tensors), as bitsandbytes runs it (a device sync after each tensor), under the fallback's patch (`no_syncs`: none)
and with the run setting `one_launch_optimizer` besides (`one_launch`: one update launch over flat copies from the
second step), on one GPU. Unsloth, not imported here, skips the same syncs itself: `no_syncs` is what the
Transformers+PEFT fallback gains, `one_launch` what either gains from the setting.

    python -m bench.bnb_step_syncs --out $OUT/bnb_step_syncs.json [--rounds 3 --steps 30]

Per variant and round: fresh fp32 tensors and seeded gradients (the same in every variant), `--warmup` steps, then
`--steps` timed steps, each `optimizer.step()` then `torch.cuda.synchronize()`: `host_ms` is what step() itself
took on the host (what the next step's work waits for in training), `drained_ms` the step until the GPU finished
it. Variants rotate their order from round to round. `same_result`: every tensor and optimizer state equal bit for
bit between the variants after the steps. Needs CUDA and bitsandbytes (the GPU image's).
"""
import argparse
import importlib.metadata
import json
import platform
import statistics
import time

import torch

from nbddp import patches
from nbddp.fallback import bitsandbytes_compat
from nbddp.runtime.trainer import one_launch_optimizer

VARIANTS = ("bitsandbytes", "no_syncs", "one_launch")

RANK, HIDDEN, KV, INTERMEDIATE, LAYERS = 16, 4096, 1024, 14336, 32
# (in, out) of each projection that carries LoRA in Unsloth's notebooks
PROJECTIONS = {"q": (HIDDEN, HIDDEN), "k": (HIDDEN, KV), "v": (HIDDEN, KV), "o": (HIDDEN, HIDDEN),
               "gate": (HIDDEN, INTERMEDIATE), "up": (HIDDEN, INTERMEDIATE), "down": (INTERMEDIATE, HIDDEN)}


def lora_shapes():
    return [shape for _ in range(LAYERS) for d_in, d_out in PROJECTIONS.values()
            for shape in ((RANK, d_in), (d_out, RANK))]


def trial(variant: str, warmup: int, steps: int) -> dict:
    import bitsandbytes as bnb

    patches.undo()
    if variant != "bitsandbytes":
        bitsandbytes_compat.patch_optimizer_step()
    if variant == "one_launch":
        one_launch_optimizer.Hooks(bnb.optim.optimizer.Optimizer2State,
                                   bnb.functional.optimizer_update_8bit_blockwise).register()
    generator = torch.Generator(device="cuda").manual_seed(3407)
    params = [torch.nn.Parameter(torch.randn(shape, device="cuda", generator=generator) * 0.02)
              for shape in lora_shapes()]
    grads = [torch.randn(p.shape, device="cuda", generator=generator) * 1e-3 for p in params]
    optimizer = bnb.optim.AdamW8bit(params, lr=2e-4, weight_decay=0.01)
    host_ms, drained_ms = [], []
    for step in range(warmup + steps):
        for p, g in zip(params, grads):
            p.grad = g * (1 + step % 3)
        torch.cuda.synchronize()
        start = time.perf_counter()
        optimizer.step()
        issued = time.perf_counter()
        torch.cuda.synchronize()
        drained = time.perf_counter()
        if step >= warmup:
            host_ms.append((issued - start) * 1e3)
            drained_ms.append((drained - start) * 1e3)
    patches.undo()
    flat = getattr(optimizer, "nbddp_flat", {})
    return {"variant": variant, "host_ms": statistics.median(host_ms), "drained_ms": statistics.median(drained_ms),
            "flat_tensors": sum(len(f.params) for f in flat.values() if isinstance(f, one_launch_optimizer.Flat)),
            "tensors": [p.detach().clone() for p in params]
            + [optimizer.state[p][name].clone() for p in params for name in one_launch_optimizer.STATES]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    rounds, same = [], True
    for round_ in range(args.rounds):
        order = VARIANTS[round_ % 3:] + VARIANTS[:round_ % 3]
        results = {result["variant"]: result for result in (trial(v, args.warmup, args.steps) for v in order)}
        same &= all(torch.equal(a, b) for variant in VARIANTS[1:]
                    for a, b in zip(results["bitsandbytes"]["tensors"], results[variant]["tensors"]))
        rounds.append({variant: {key: value for key, value in result.items() if key.endswith("_ms")
                                 or key == "flat_tensors"} for variant, result in results.items()})
        print(f"round {round_ + 1}: {json.dumps(rounds[-1])}", flush=True)
    summary = {
        "what": __doc__.split("\n\n")[0], "tensors": len(lora_shapes()),
        "elements": sum(a * b for a, b in lora_shapes()), "rounds": rounds, "same_result": same,
        "median": {variant: {key: statistics.median(r[variant][key] for r in rounds)
                             for key in ("host_ms", "drained_ms")} for variant in VARIANTS},
        "device": torch.cuda.get_device_name(), "python": platform.python_version(),
        "versions": {name: importlib.metadata.version(name) for name in ("torch", "bitsandbytes")},
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    with open(args.out, "w") as out:
        json.dump(summary, out, indent=1)
    print(json.dumps({key: summary[key] for key in ("median", "same_result", "device")}))


if __name__ == "__main__":
    main()
