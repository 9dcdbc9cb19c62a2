"""Run bench experiments on a CUDA host and write one results JSON per experiment.

    python -m bench.harness --out $OUT --experiments sanity_1b,backends_qlora_8b --deadline-s 480

Prepares the inputs first (random-init model folders, the fixed-length data file, the dense bf16
matmul rate of every GPU), then runs the rounds of all named experiments round-robin (round 1 of
each, then round 2 of each ...), so a deadline leaves every experiment with its first rounds
rather than one with all. Each trial is a fresh `torchrun` of bench/timed_run.py around the
script; a trial that would not finish before the deadline is not started, and one still running
at the deadline is stopped. `<out>/<experiment>.json` is rewritten after every trial; the trial
logs end up in `<out>/logs.tgz`.
"""
import argparse
import dataclasses
import datetime
import importlib.metadata
import json
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from bench import experiments as plan
from nbddp.runtime.reporting.utilization import flops_per_token
from bench.materialize import shape_config
from bench.memory_model import choose_checkpointing
from bench.stats import paired_ratios, summarize
from nbddp.formats import metrics

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = {"generated": "generated/train.py", "reference": "bench/reference_ddp.py"}
PACKAGES = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "bitsandbytes", "unsloth",
            "unsloth_zoo", "triton")
# Never let a bench process use NVLink multicast (it can take the host's shared GPUs down).
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "UNSLOTH_DISABLE_STATISTICS": "1", "PYTHONUNBUFFERED": "1"}
FIRST_TRIAL_GUESS_S = {"llama-1.1b": 90, "llama3-8b": 100}  # before any trial of the shape has run (8B: 59-93 s seen)
MAX_TRIAL_S = {"llama-1.1b": 200, "llama3-8b": 300}  # a trial still running then is hung, not slow
DATA_ROWS = 512  # enough for every planned trial without a second epoch
LOG_TAIL_LINES = 40
RANK_FILE = re.compile(r"rank\d+\.json")


def flag_value(value):
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def script_flags(experiment, variant, model_dir, data_path, output_dir):
    """Flags for both scripts (same names: the notebooks' parameters). Three rows are held out (the
    notebooks' last cell generates from three) and evaluation runs only before step 1, outside the
    timed steps."""
    flags = {
        "model_name": model_dir,
        "data_path": data_path,
        "eval_rows": 3,
        "eval_steps": 100_000,
        "max_seq_length": plan.SEQ_LEN,
        "per_device_train_batch_size": experiment.micro_batch,
        "gradient_accumulation_steps": 1,
        "max_steps": experiment.steps + experiment.profile_steps,
        "lora_r": plan.LORA_R,
        "seed": plan.SEED,
        "output_dir": output_dir,
    }
    settings = dict(variant.settings)
    if variant.script == "reference":
        settings.pop("backend", None)  # the reference is Unsloth by construction
    flags.update(settings)
    return [part for name, value in flags.items() for part in (f"--{name}", flag_value(value))]


def trial_command(variant, flags):
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={variant.gpus}",
            "bench/timed_run.py", SCRIPTS[variant.script], *flags]


def trial_env(experiment, variant, gpus, result_dir):
    env = dict(os.environ)
    env.update(OFFLINE_ENV)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
    env["BENCH_RESULT_DIR"] = str(result_dir)
    env["BENCH_DDP_KWARGS"] = json.dumps(variant.ddp)
    env.update(profile_env(experiment))
    env.update(variant.env)
    env.update(SAFE_ENV)
    return env


def profile_env(experiment):
    """{"BENCH_PROFILE_STEPS": "FIRST-LAST"} for the steps after the timed ones (bench.timed_run); {} without."""
    if not experiment.profile_steps:
        return {}
    return {"BENCH_PROFILE_STEPS": f"{experiment.steps + 1}-{experiment.steps + experiment.profile_steps}"}


def environment(gpu_memory):
    def version(name):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    smi = subprocess.run(["nvidia-smi", "--query-gpu=index,name,driver_version,memory.total,pci.bus_id",
                          "--format=csv,noheader"], capture_output=True, text=True).stdout.strip().splitlines()
    topology = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True).stdout
    return {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": os.environ.get("BENCH_COMMIT"),
        "gpus": smi,
        "gpu_memory_gib": gpu_memory,
        "gpu_topology": topology,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "packages": {name: version(name) for name in PACKAGES},
    }


def too_few_gpus(chosen, available):
    """Which experiments need more GPUs than `available`, as a sentence; empty when all fit."""
    needs = {e.name: max(v.gpus for v in e.variants.values()) for e in chosen}
    short = [f"{name} needs {gpus}" for name, gpus in needs.items() if gpus > available]
    return ", ".join(short)


def gpu_memory_gib():
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout.split()
    return [int(mib) / 1024 for mib in out]


def matmul_rates():
    out = subprocess.run([sys.executable, "-m", "bench.matmul_peak"], capture_output=True, text=True, check=True,
                         cwd=REPO, env={**os.environ, **SAFE_ENV}).stdout
    return json.loads(out.strip().splitlines()[-1])["per_gpu"]


def prepare_inputs(shapes, work):
    models = {}
    for shape in shapes:
        out = work / "models" / shape
        subprocess.run([sys.executable, "-m", "bench.materialize", "--shape", shape, "--out", str(out)],
                       check=True, cwd=REPO, env={**os.environ, **SAFE_ENV, "CUDA_VISIBLE_DEVICES": "0"})
        models[shape] = str(out)
    data = work / "data" / f"fixed_{plan.SEQ_LEN}.jsonl"
    subprocess.run([sys.executable, "-m", "bench.make_data", "--seq-len", str(plan.SEQ_LEN), "--rows", str(DATA_ROWS),
                    "--out", str(data)], check=True, cwd=REPO)
    return models, str(data)


def log_facts(log_text):
    backend = re.search(r"nbddp: backend=(\S+)", log_text)
    data_parallel = re.search(r"Data Parallel GPUs = (\d+)", log_text)
    return {"backend_line": backend.group(0) if backend else None,
            "unsloth_data_parallel_gpus": int(data_parallel.group(1)) if data_parallel else None}


def summarize_trial(trial, experiment, matmul, flops):
    """Steady-state throughput, memory and MFU of one finished trial from its ranks' JSON files."""
    result_dir = Path(trial["dir"])
    log_text = (result_dir / "log.txt").read_text(errors="replace") if (result_dir / "log.txt").exists() else ""
    trial.update(log_facts(log_text))
    ranks = sorted((json.loads(p.read_text()) for p in result_dir.glob("rank*.json") if RANK_FILE.fullmatch(p.name)),
                   key=lambda r: r["rank"])
    if trial["returncode"] != 0 or not ranks:
        trial["status"] = "failed"
        trial["log_tail"] = log_text.splitlines()[-LOG_TAIL_LINES:]
        return trial
    lead = ranks[0]
    timed = lead["step_ms"][:experiment.steps]  # profiled steps, if any, come after
    steady = timed[experiment.warmup_steps:]
    if not steady:
        trial["status"] = "failed"
        trial["log_tail"] = ["fewer steps than warm-up steps"] + log_text.splitlines()[-LOG_TAIL_LINES:]
        return trial
    tokens = lead["tokens_per_step"]
    step = summarize(steady)
    world = lead["world_size"]
    per_gpu = tokens / (step["median"] / 1e3) / world
    rate = statistics.median(matmul[g]["median_flops_per_s"] for g in trial["gpus"])
    trial.update({
        "status": "ok",
        "world_size": world,
        "tokens_per_step": tokens,
        "row_tokens": lead.get("row_tokens"),
        "step_ms": step,
        "tokens_per_s": {"median": tokens / (step["median"] / 1e3),
                         "p10": tokens / (step["p90"] / 1e3), "p90": tokens / (step["p10"] / 1e3)},
        "tokens_per_s_per_gpu": per_gpu,
        "mfu": per_gpu * flops / rate,
        "peak_allocated_gib": [r["peak_allocated_gib"] for r in ranks],
        "peak_reserved_gib": [r["peak_reserved_gib"] for r in ranks],
        "t_train_called_s": lead["t_train_called_s"],
        "t_first_step_s": lead["t_first_step_s"],
        "batch_fetch_ms_median": statistics.median(lead["batch_fetch_ms"]) if lead["batch_fetch_ms"] else None,
        "host_step_ms_median": statistics.median(lead["host_step_ms"][experiment.warmup_steps:]),
        "ddp_module": lead.get("ddp_module"),
        "gpu_processes": lead.get("gpu_processes"),
        "torch_threads": lead["torch_threads"],
        "omp_num_threads_env": lead["omp_num_threads_env"],
        "gradient_checkpointing_arg": lead.get("gradient_checkpointing_arg"),
        "step_ms_all": timed,
    })
    profiles = sorted(result_dir.glob("rank*_profile.json"))
    if profiles:
        trial["profile"] = {p.name.split("_")[0]: profile_figures(json.loads(p.read_text())) for p in profiles}
    return trial


def profile_figures(profile):
    """A rank's profile without its kernel list (that stays in the logs): per-step wall, busy, collective, idle."""
    devices = {device: {k: v for k, v in figures.items() if k != "top_kernels"}
               for device, figures in profile["devices"].items()}
    return {"profiled_steps": profile["profiled_steps"], "wall_ms_per_step": profile["wall_ms_per_step"],
            "devices": devices}


def peak_gib(trial):
    """The largest rank's peak allocated memory (None without CUDA)."""
    peaks = trial["peak_allocated_gib"]
    return None if None in peaks else max(peaks)


def median_or_none(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize_experiment(experiment, trials):
    """Per-variant medians over trials and, per comparison, the ratio within each round and its median."""
    ok = [t for t in trials if t["status"] == "ok"]
    variants = {}
    for label in experiment.variants:
        mine = [t for t in ok if t["label"] == label]
        if mine:
            variants[label] = {
                "trials": len(mine),
                "tokens_per_s_median": statistics.median(t["tokens_per_s"]["median"] for t in mine),
                "tokens_per_s_per_trial": [t["tokens_per_s"]["median"] for t in mine],
                "tokens_per_s_per_gpu_median": statistics.median(t["tokens_per_s_per_gpu"] for t in mine),
                "mfu_median": statistics.median(t["mfu"] for t in mine),
                "peak_allocated_gib_max_rank_median": median_or_none(peak_gib(t) for t in mine),
                "t_first_step_s_median": statistics.median(t["t_first_step_s"] for t in mine),
            }

    def per_round(label, key):
        rounds = sorted({t["round"] for t in ok})
        values = {}
        for r in rounds:
            sample = [key(t) for t in ok if t["label"] == label and t["round"] == r]
            if sample and None not in sample:
                values[r] = statistics.median(sample)
        return values

    comparisons = []
    for numerator, denominator in experiment.comparisons:
        entry = {"numerator": numerator, "denominator": denominator}
        for name, key in (("tokens_per_s", lambda t: t["tokens_per_s"]["median"]),
                          ("tokens_per_s_per_gpu", lambda t: t["tokens_per_s_per_gpu"]),
                          ("peak_allocated_gib", peak_gib)):
            a, b = per_round(numerator, key), per_round(denominator, key)
            shared = sorted(set(a) & set(b))
            entry[name] = paired_ratios([a[r] for r in shared], [b[r] for r in shared])
        comparisons.append(entry)
    return {"variants": variants, "comparisons": comparisons}


def keep_in_logs(info):
    """Logs, rank JSONs, profile summaries and metrics.jsonl go into logs.tgz; saved adapters, checkpoints and
    profiler traces do not (a trace is megabytes per rank: with 8 profiled trials logs.tgz passed the 16 MiB a
    device call returns per file, and the call returned no logs). Traces stay on the host under --work."""
    if info.name.endswith("_trace.json.gz"):
        return None
    if info.isdir() or "/output/" not in info.name or info.name.endswith(metrics.METRICS_FILE):
        return info
    return None


def write_json(path, value):
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(json.dumps(value, indent=1, default=str) + "\n")
    os.replace(tmp, path)


def warm_up_experiment(experiment, steps=12):
    """One short untimed trial to open a call with: the first variant in the round's order that uses the most GPUs.
    The first multi-GPU trial of every device call ran the slowest of its script (five calls, both scripts), which
    biases the first round's ratios; this trial takes that hit instead. Its results file is `<name>_warmup.json`."""
    most = max(experiment.variants[label].gpus for label in experiment.order)
    label = next(label for label in experiment.order if experiment.variants[label].gpus == most)
    return dataclasses.replace(
        experiment, name=f"{experiment.name}_warmup", description=f"warm-up trial before {experiment.name} (untimed)",
        steps=steps, warmup_steps=steps // 3, profile_steps=0, order=(label,), rounds=1, comparisons=())


class Runner:
    """Launches trials (several at once when they use different GPUs) and enforces the deadline."""

    def __init__(self, out, work, deadline, models, data, matmul, env_info, stop_on_failure=False):
        self.out, self.work, self.deadline = out, work, deadline
        self.stop_on_failure = stop_on_failure
        self.models, self.data, self.matmul, self.env_info = models, data, matmul, env_info
        self.durations = {}  # (experiment, label) -> seconds of the last trial
        self.trials = {}  # experiment -> list of trial dicts
        self.choices = {}  # experiment -> checkpointing decision
        self.failures = 0

    def checkpointing_choice(self, experiment):
        """What the memory estimate would choose for this experiment (what `auto` picks in the generated script)."""
        if experiment.name not in self.choices:
            variant = next(iter(experiment.variants.values()))
            self.choices[experiment.name] = choose_checkpointing(
                shape_config(experiment.shape), plan.SEQ_LEN, experiment.micro_batch,
                bool(variant.settings.get("load_in_4bit")), min(self.env_info["gpu_memory_gib"]))
        return self.choices[experiment.name]

    def expected_s(self, experiment, label):
        return self.durations.get((experiment.name, label), FIRST_TRIAL_GUESS_S[experiment.shape])

    def run_round(self, experiment, round_index):
        labels = list(experiment.order)
        if experiment.concurrent:
            gpus = [(0,), (1,)] if round_index % 2 == 0 else [(1,), (0,)]
            self.run_batch(experiment, round_index, list(zip(labels, gpus)))
        else:
            for label in labels:
                gpus = tuple(range(experiment.variants[label].gpus))
                self.run_batch(experiment, round_index, [(label, gpus)])
                if self.failures and self.stop_on_failure:
                    return

    def run_batch(self, experiment, round_index, launches):
        expected = max(self.expected_s(experiment, label) for label, _ in launches)
        if time.time() + expected > self.deadline:
            print(f"[bench] skip {experiment.name} round {round_index + 1} {[l for l, _ in launches]}: "
                  f"~{expected:.0f}s left {self.deadline - time.time():.0f}s", flush=True)
            return
        running = []
        for label, gpus in launches:
            variant = experiment.variants[label]
            index = len(self.trials.setdefault(experiment.name, []))
            trial_dir = self.work / "trials" / experiment.name / f"{index:02d}_{label}"
            trial_dir.mkdir(parents=True, exist_ok=True)
            flags = script_flags(experiment, variant, self.models[experiment.shape], self.data,
                                 str(trial_dir / "output"))
            command = trial_command(variant, flags)
            env = trial_env(experiment, variant, gpus, trial_dir)
            env["BENCH_T0"] = repr(time.time())
            env_shown = {**variant.env, "CUDA_VISIBLE_DEVICES": env["CUDA_VISIBLE_DEVICES"], **profile_env(experiment)}
            trial = {"label": label, "round": round_index, "gpus": list(gpus), "dir": str(trial_dir),
                     "command": " ".join(f"{k}={v}" for k, v in env_shown.items()) + " " + shlex.join(["python3", *command[1:]]),
                     "ddp_overrides": variant.ddp,
                     "checkpointing": variant.settings.get(
                         "use_gradient_checkpointing", "auto" if variant.script == "generated" else "unsloth"),
                     "started": time.time()}
            print(f"[bench] {experiment.name} r{round_index + 1} {label} gpus={list(gpus)}", flush=True)
            log = open(trial_dir / "log.txt", "w")
            process = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True)
            self.trials[experiment.name].append(trial)
            running.append((trial, process, log))
        for trial, process, log in running:
            limit = min(self.deadline, trial["started"] + MAX_TRIAL_S[experiment.shape])
            try:
                trial["returncode"] = process.wait(timeout=max(1.0, limit - time.time()))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)  # the trial's own session: torchrun and its ranks
                trial["returncode"] = process.wait()
                trial["stopped_at"] = "deadline" if limit == self.deadline else "trial limit"
            log.close()
            trial["duration_s"] = time.time() - trial.pop("started")
            self.durations[(experiment.name, trial["label"])] = trial["duration_s"]
            summarize_trial(trial, experiment, self.matmul, self.flops(experiment))
            self.failures += trial["status"] != "ok"
            print(f"[bench]   {trial['label']}: {trial['status']} {trial['duration_s']:.0f}s "
                  + (f"{trial['tokens_per_s']['median']:.0f} tok/s, peak {peak_gib(trial)} GiB, "
                     f"MFU {trial['mfu']:.3f}" if trial["status"] == "ok" else ""), flush=True)
        self.write(experiment)

    def flops(self, experiment):
        return flops_per_token(shape_config(experiment.shape), plan.SEQ_LEN, plan.LORA_R)

    def write(self, experiment):
        trials = self.trials.get(experiment.name, [])
        write_json(self.out / f"{experiment.name}.json", {
            "experiment": experiment.name,
            "description": experiment.description,
            "setup": {"shape": experiment.shape, "config": shape_config(experiment.shape), "seq_len": plan.SEQ_LEN,
                      "micro_batch_per_gpu": experiment.micro_batch, "gradient_accumulation_steps": 1,
                      "steps": experiment.steps, "warmup_steps": experiment.warmup_steps, "lora_r": plan.LORA_R,
                      "rounds_planned": experiment.rounds, "order": experiment.order,
                      "concurrent": experiment.concurrent, "flops_per_token": self.flops(experiment),
                      "checkpointing_choice": self.checkpointing_choice(experiment)},
            "environment": {**self.env_info, "matmul_bf16": self.matmul},
            "trials": trials,
            "summary": summarize_experiment(experiment, trials),
        })


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="results folder (one JSON per experiment)")
    parser.add_argument("--experiments", required=True, help=f"comma-separated, from {', '.join(plan.EXPERIMENTS)}")
    parser.add_argument("--deadline-s", type=float, required=True, help="stop starting/running trials after this")
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench"), help="models, data and trial folders")
    parser.add_argument("--stop-on-failure", action="store_true",
                        help="run nothing more once a trial fails (keeps device time for a fixed rerun)")
    parser.add_argument("--no-warm-up", action="store_true",
                        help="skip the short untimed trial that opens the call (see warm_up_experiment)")
    args = parser.parse_args()
    start = time.time()
    names = args.experiments.split(",")
    unknown = [n for n in names if n not in plan.EXPERIMENTS]
    if unknown:
        parser.error(f"--experiments: unknown {unknown}; known: {list(plan.EXPERIMENTS)}")
    chosen = [plan.EXPERIMENTS[n] for n in names]
    args.out.mkdir(parents=True, exist_ok=True)
    # Trial folders of an earlier call on the same machine would be read as this call's (same names).
    shutil.rmtree(args.work / "trials", ignore_errors=True)
    memory = gpu_memory_gib()
    short = too_few_gpus(chosen, len(memory))
    if short:
        parser.error(f"--experiments: this machine has {len(memory)} GPUs; {short}")
    env_info = environment(memory)
    matmul = matmul_rates()
    print(f"[bench] matmul bf16 TFLOP/s per GPU: {[round(m['median_flops_per_s'] / 1e12) for m in matmul]}",
          flush=True)
    models, data = prepare_inputs(sorted({e.shape for e in chosen}), args.work)
    print(f"[bench] inputs ready after {time.time() - start:.0f}s", flush=True)
    runner = Runner(args.out, args.work, start + args.deadline_s, models, data, matmul, env_info,
                    args.stop_on_failure)
    if not args.no_warm_up:
        runner.run_round(warm_up_experiment(chosen[0]), 0)
    for round_index in range(max(e.rounds for e in chosen)):
        for experiment in chosen:
            if round_index < experiment.rounds and not (runner.failures and args.stop_on_failure):
                runner.run_round(experiment, round_index)
    with tarfile.open(args.out / "logs.tgz", "w:gz") as tar:
        tar.add(args.work / "trials", arcname="trials", filter=keep_in_logs)
    print(f"[bench] done after {time.time() - start:.0f}s", flush=True)


if __name__ == "__main__":
    main()
