"""Merge the results files that several device calls wrote for one experiment into one file.

    python -m bench.merge --out bench/results/scaling_8b_device_tokens.json call3/scaling_8b_device_tokens.json \
        call4/scaling_8b_device_tokens.json

A device call rarely fits every planned round, so an experiment's rounds can come from several calls
(machine starts). Trials keep their own call's measurements (MFU against that call's matmul rate);
their rounds are renumbered after the previous call's, each trial records which call it came from,
`environment` becomes the list `calls`, and the summary (per-round ratios, medians) is computed
afresh over all rounds. Files whose workloads differ are refused: they are not rounds of one run.
"""
import argparse
import json
from pathlib import Path

from bench import experiments as plan
from bench.harness import summarize_experiment, write_json

WORKLOAD = ("shape", "seq_len", "micro_batch_per_gpu", "gradient_accumulation_steps", "steps", "warmup_steps",
            "lora_r", "concurrent", "flops_per_token")


def merge(results):
    """One results dict from several of the same experiment, in call order."""
    first = results[0]
    name = first["experiment"]
    for other in results[1:]:
        if other["experiment"] != name:
            raise ValueError(f"cannot merge {other['experiment']!r} into {name!r}")
        changed = [key for key in WORKLOAD if other["setup"].get(key) != first["setup"].get(key)]
        if changed:
            raise ValueError(f"{name}: the calls ran different workloads ({', '.join(changed)} differ)")
    trials, calls, offset = [], [], 0
    for result in results:
        first_call = len(calls)  # an input may itself be merged: its trials number its own calls from 0
        calls.extend(result.get("calls") or [result["environment"]])
        rounds = [trial["round"] for trial in result["trials"]]
        for trial in result["trials"]:
            trials.append({**trial, "round": trial["round"] + offset, "call": first_call + trial.get("call", 0)})
        offset += max(rounds) + 1 if rounds else 0
    merged = {key: value for key, value in first.items() if key not in ("environment", "trials", "summary")}
    merged["description"] = results[-1]["description"]  # the plan's latest wording
    merged.update({"calls": calls, "trials": trials,
                   "summary": summarize_experiment(plan.EXPERIMENTS[name], trials)})
    return merged


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="merged results file (may be one of the inputs)")
    parser.add_argument("inputs", nargs="+", type=Path, help="results files of one experiment, in call order")
    args = parser.parse_args()
    merged = merge([json.loads(path.read_text()) for path in args.inputs])
    write_json(args.out, merged)
    print(f"{args.out}: {len(merged['trials'])} trials over {len(merged['calls'])} calls")


if __name__ == "__main__":
    main()
