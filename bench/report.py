"""Markdown tables and the scaling plot from bench/results/*.json (what docs/performance.md and bench/results/HISTORY.md show).

    python -m bench.report --results bench/results --plot bench/results/scaling.png \
        --step-plots bench/results/steps > /tmp/tables.md

Where an experiment has no 4-GPU measurement, the plot projects one from the 2-GPU efficiency under
one stated model: the per-step DDP overhead at N GPUs is all-reduce
traffic, whose bytes per GPU grow as 2(N-1)/N (ring), so overhead(4) = 1.5 * overhead(2) and
efficiency(4) = 1 / (1 + 1.5 * (1/efficiency(2) - 1)).
"""
import argparse
import json
from pathlib import Path



def projected_efficiency(efficiency_2gpu, gpus=4):
    """Efficiency at `gpus` GPUs if the 2-GPU overhead is ring all-reduce traffic (see module docstring)."""
    traffic = (2 * (gpus - 1) / gpus) / (2 * 1 / 2)
    return 1 / (1 + traffic * (1 / efficiency_2gpu - 1))


def load(results_dir):
    return {p.stem: json.loads(p.read_text()) for p in sorted(Path(results_dir).glob("*.json"))}


def fmt(value, digits=0):
    return "–" if value is None else f"{value:,.{digits}f}"


def variant_table(result):
    rows = ["| variant | GPUs | checkpointing | trials | tok/s (median of trials; per trial) | tok/s per GPU | MFU | "
            "peak GiB (max rank) | first step s |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    trials = result["trials"]
    gpus = world_sizes(result)
    for label, summary in result["summary"]["variants"].items():
        mine = [t for t in trials if t["label"] == label and t["status"] == "ok"]
        spreads = [f"{t['tokens_per_s']['median']:,.0f} [{t['tokens_per_s']['p10']:,.0f}–{t['tokens_per_s']['p90']:,.0f}]"
                   for t in mine]
        rows.append(f"| {label} | {gpus[label]} | {checkpointing_used(mine)} | {summary['trials']} | {fmt(summary['tokens_per_s_median'])}; "
                    f"{'; '.join(spreads)} | {fmt(summary['tokens_per_s_per_gpu_median'])} | "
                    f"{summary['mfu_median']:.3f} | {fmt(summary['peak_allocated_gib_max_rank_median'], 1)} | "
                    f"{fmt(summary['t_first_step_s_median'], 1)} |")
    failed = [t["label"] for t in trials if t["status"] != "ok"]
    if failed:
        rows.append(f"\nFailed trials: {', '.join(failed)}.")
    return "\n".join(rows)


def world_sizes(result):
    """{variant label: GPUs} of the experiment's finished trials."""
    return {t["label"]: t["world_size"] for t in result["trials"] if t["status"] == "ok"}


def checkpointing_used(trials):
    """'asked -> what Trainer got' per variant, e.g. 'auto -> off' (Trainer's flag; "unsloth" shows as on)."""
    seen = sorted({f"{t.get('checkpointing')} -> {'on' if t.get('gradient_checkpointing_arg') else 'off'}"
                   for t in trials})
    return ", ".join(seen)


def comparison_table(result):
    rows = ["| comparison | tok/s ratio per round | median | per-GPU ratio (scaling efficiency) | peak memory ratio |",
            "| --- | --- | --- | --- | --- |"]
    for c in result["summary"]["comparisons"]:
        pairs = ", ".join(f"{r:.3f}" for r in c["tokens_per_s"]["per_pair"]) or "–"
        rows.append(f"| {c['numerator']} / {c['denominator']} | {pairs} | {fmt(c['tokens_per_s']['median'], 3)} | "
                    f"{fmt(c['tokens_per_s_per_gpu']['median'], 3)} | {fmt(c['peak_allocated_gib']['median'], 3)} |")
    return "\n".join(rows)


def profile_table(result):
    """Per profiled trial and rank, ms per step: wall, GPU busy, compute alone, inside collectives, idle; "" when
    no trial was profiled (every trial of an experiment profiles the same steps)."""
    rows, profiled_steps = [], None
    for t in result["trials"]:
        for rank, profile in sorted((t.get("profile") or {}).items()):
            profiled_steps = profile["profiled_steps"]
            for device, d in sorted(profile["devices"].items()):
                rows.append(f"| {t['label']} | {t['round'] + 1} | {rank} (GPU {device}) | "
                            f"{profile['wall_ms_per_step']:.1f} | {d['kernel_busy_ms_per_step']:.1f} | "
                            f"{d['compute_busy_ms_per_step']:.1f} | {d['collective_ms_per_step']:.1f} | "
                            f"{d['idle_ms_per_step']:.1f} |")
    if not rows:
        return ""
    first, last = profiled_steps
    return (f"\nProfiled steps {first}–{last} (after the timed ones), ms per step:\n\n"
            "| variant | round | rank | wall | GPU busy | compute kernels | in collectives | idle |\n"
            "| --- | --- | --- | --- | --- | --- | --- | --- |\n" + "\n".join(rows) + "\n")


def markdown(results):
    parts = []
    for name, result in results.items():
        setup = result["setup"]
        parts.append(f"### {name}\n\n{result['description']}\n\n"
                     f"Shape {setup['shape']}, seq {setup['seq_len']}, micro batch {setup['micro_batch_per_gpu']}/GPU, "
                     f"{setup['steps']} steps ({setup['warmup_steps']} warm-up), "
                     f"{'side by side' if setup['concurrent'] else 'one trial at a time'}; "
                     f"{len(result.get('calls') or [result.get('environment')])} device call(s); the memory model's "
                     f"checkpointing choice for this shape: {setup['checkpointing_choice']['chosen']}.\n\n"
                     + variant_table(result) + "\n\n" + comparison_table(result) + "\n" + profile_table(result))
    return "\n".join(parts)


def scaling_points(results):
    """(name, {GPUs: tok/s}, {GPUs: efficiency}) for every 1-GPU variant that an experiment compares with more
    GPUs: medians of the variants' trials, and the median of the per-round efficiencies (as the tables give it)."""
    points = []
    for name, result in results.items():
        variants = result["summary"]["variants"]
        gpus = world_sizes(result)
        series = {}
        for c in result["summary"]["comparisons"]:
            base, scaled = c["denominator"], c["numerator"]
            if gpus.get(base) == 1 and gpus.get(scaled, 1) > 1 and base in variants and scaled in variants:
                by_gpus, efficiency = series.setdefault(base, ({1: variants[base]["tokens_per_s_median"]}, {}))
                by_gpus[gpus[scaled]] = variants[scaled]["tokens_per_s_median"]
                efficiency[gpus[scaled]] = c["tokens_per_s_per_gpu"]["median"]
        points += [(f"{name}: {base} scaled", by_gpus, efficiency) for base, (by_gpus, efficiency) in series.items()]
    return points


def other_points(results):
    """(name, GPUs, speed-up over the experiment's 1-GPU variant) of the multi-GPU variants of a scaling experiment
    that are not scaled from its 1-GPU variant (the hand-written reference, variants of a suspect)."""
    points = []
    for name, result in results.items():
        gpus = world_sizes(result)
        variants = result["summary"]["variants"]
        comparisons = result["summary"]["comparisons"]
        bases = [c["denominator"] for c in comparisons if gpus.get(c["denominator"]) == 1 and c["denominator"] in variants]
        scaled = {c["numerator"] for c in comparisons if c["denominator"] in bases}
        if not bases:
            continue
        one = variants[bases[0]]["tokens_per_s_median"]
        for label, summary in variants.items():
            if gpus.get(label, 1) > 1 and label not in scaled:
                points.append((f"{name}: {label}", gpus[label], summary["tokens_per_s_median"] / one))
    return points


def panels_by_shape(results):
    """(shape, scaling points, other points) per model shape, largest shape first: one plot panel each, since a
    host-bound small shape and a GPU-bound large one scale for different reasons."""
    shapes = sorted({r["setup"]["shape"] for r in results.values()}, reverse=True)  # llama3-8b before llama-1.1b
    panels = []
    for shape in shapes:
        subset = {name: r for name, r in results.items() if r["setup"]["shape"] == shape}
        if points := scaling_points(subset):
            panels.append((shape, points, other_points(subset)))
    return panels


def plot(panels, path):
    """One panel per shape (`panels_by_shape`): speed-up over one GPU, measured and, without a 4-GPU measurement,
    projected; the other multi-GPU variants as crosses."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(panels), figsize=(6.4 * len(panels), 4.8), squeeze=False)
    for axis, (shape, points, others) in zip(axes[0], panels):
        most_gpus = max([4] + [n for _, by_gpus, _ in points for n in by_gpus])
        axis.plot([1, most_gpus], [1, most_gpus], ":", color="grey", label="ideal (efficiency 1)")
        for name, by_gpus, efficiencies in points:
            counts = sorted(by_gpus)
            one, most = by_gpus[1], counts[-1]
            efficiency = efficiencies[most]
            line, = axis.plot(counts, [by_gpus[n] / one for n in counts], "o-",
                              label=f"{name} (eff. {efficiency:.2f} at {most})")
            if most == 2:  # no 4-GPU measurement: project one
                four = 4 * projected_efficiency(efficiency)
                axis.plot([2, 4], [by_gpus[2] / one, four], "o--", color=line.get_color(), alpha=0.6)
                axis.annotate(f"{projected_efficiency(efficiency):.2f}", (4, four), textcoords="offset points",
                              xytext=(6, -3), fontsize=7, color=line.get_color())
        for name, gpus, speedup in others:
            axis.plot([gpus], [speedup], "x", markersize=8, label=name)
        axis.set_xticks([1, 2, 4] + sorted({n for _, by_gpus, _ in points for n in by_gpus if n > 4}))
        axis.set_xlim(0.8, most_gpus + 0.6)
        axis.set_xlabel("GPUs (H200, same per-GPU batch); dashed: projected,\nlabelled with its efficiency")
        axis.set_ylabel("speed-up over 1 GPU (tokens/s ratio)")
        axis.set_title(f"DDP scaling of the generated script: {shape}")
        axis.legend(fontsize=6, loc="upper left")
        axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def step_time_plot(result, path):
    """Device step time of every trial of one experiment, step by step (warm-up shaded): where a trial slowed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    calls = result.get("calls") or [result["environment"]]
    figure, axis = plt.subplots(figsize=(7.2, 4.2))
    for trial in result["trials"]:
        if trial["status"] != "ok":
            continue
        started = calls[trial.get("call", 0)]["date_utc"][11:16]  # which device call: its start, HH:MM UTC
        axis.plot(range(1, len(trial["step_ms_all"]) + 1), trial["step_ms_all"], lw=1,
                  label=f"{trial['label']} (call at {started}, round {trial['round'] + 1})")
    axis.axvspan(0.5, result["setup"]["warmup_steps"] + 0.5, color="grey", alpha=0.15, lw=0)
    steady = [ms for t in result["trials"] if t["status"] == "ok" for ms in t["step_ms_all"][result["setup"]["warmup_steps"]:]]
    axis.set_ylim(0.9 * min(steady), 1.15 * max(steady))  # warm-up steps (compilation) run off the top
    axis.set_xlabel("step (shaded: warm-up, not timed)")
    axis.set_ylabel("device step time, ms")
    axis.set_title(f"{result['experiment']}: step times of every trial")
    axis.legend(fontsize=6, ncol=2)
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path("bench/results"))
    parser.add_argument("--plot", type=Path, help="write the scaling plot (PNG) here")
    parser.add_argument("--step-plots", type=Path, help="write <experiment>_steps.png (step times per trial) here")
    args = parser.parse_args()
    results = load(args.results)
    print(markdown(results))
    if args.plot:
        plot(panels_by_shape(results), args.plot)
    if args.step_plots:
        args.step_plots.mkdir(parents=True, exist_ok=True)
        for name, result in results.items():
            step_time_plot(result, args.step_plots / f"{name}_steps.png")


if __name__ == "__main__":
    main()
