"""The benchmark plan: which variants of which script run, in which order, and what is compared.

Every trial trains the same way: a bench shape (bench/configs/<shape>), seq_len tokens per row with
no padding (bench/make_data.py), LoRA r=16 on every linear layer, one micro batch per step
(gradient_accumulation_steps 1), `steps` optimizer steps of which the first `warmup_steps` are not
timed. A round runs each variant once, in the listed order; rounds repeat that order (A B A B ...)
so drift on a shared machine hits every variant alike. `concurrent` experiments compare one-GPU
variants side by side, one per GPU at the same time, swapping GPUs every round.
"""
from dataclasses import dataclass, field

SEQ_LEN = 2048
LORA_R = 16
SEED = 3407


@dataclass(frozen=True)
class Variant:
    script: str  # "generated" (generated/train.py) or "reference" (bench/reference_ddp.py)
    gpus: int = 1
    # Script flags on top of the common ones. use_gradient_checkpointing: the generated script takes
    # auto | unsloth | true | false (default auto), the reference unsloth | true | false (default unsloth).
    settings: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)
    ddp: dict = field(default_factory=dict)  # accelerate DistributedDataParallelKwargs overrides


@dataclass(frozen=True)
class Experiment:
    name: str
    description: str
    shape: str
    micro_batch: int
    steps: int
    warmup_steps: int
    variants: dict  # label -> Variant
    order: tuple  # labels run in one round (a label may repeat)
    rounds: int
    comparisons: tuple  # (numerator label, denominator label) pairs
    concurrent: bool = False
    # Extra optimizer steps after the timed ones, run under torch.profiler (bench.profile_summary says where
    # each GPU's time went); 0: none.
    profile_steps: int = 0


UNSLOTH_BF16 = {"backend": "unsloth", "load_in_4bit": False}
UNSLOTH_QLORA = {"backend": "unsloth", "load_in_4bit": True}
CHECKPOINTED = {"use_gradient_checkpointing": "unsloth"}
# What `pipeline.py launch` gives each of 2 processes on the 32-core H200 host (cores / processes); torchrun alone: 1.
LAUNCH_THREADS_2GPU = {"OMP_NUM_THREADS": "16"}
REFERENCE_BF16_OFF = {"load_in_4bit": False, "use_gradient_checkpointing": "false"}


def backends_8b(name, setting, settings):
    """Unsloth vs Transformers+PEFT: the same generated script with --backend unsloth / hf and `settings`, 8B,
    one GPU each, side by side, two rounds."""
    return Experiment(
        name=name,
        description=f"Unsloth vs Transformers+PEFT, same generated script (--backend), 8B, 1 GPU each: {setting}",
        shape="llama3-8b", micro_batch=2, steps=16, warmup_steps=4,
        variants={"unsloth": Variant("generated", settings={"backend": "unsloth", **settings}),
                  "hf": Variant("generated", settings={"backend": "hf", **settings})},
        order=("unsloth", "hf"), rounds=2, concurrent=True,
        comparisons=(("unsloth", "hf"),),
    )


def threads_and_profile(name, why, shape, micro_batch, settings):
    """1 vs 2 GPUs with the CPU threads torchrun gives each side (32 for one process, 1 for each of two) and with
    them equal (1 GPU at 1 thread, 2 GPUs at 16 each), 2 rounds, and 3 profiled steps after the timed ones in
    every trial (GPU busy, collective and idle time per step). Generated script, checkpointing off."""
    return Experiment(
        name=name,
        description=f"{why} 1 vs 2 GPUs with the CPU threads torchrun gives each side (32 for one process, 1 for "
                    "each of two) and with them equal; 3 profiled steps after the timed ones in every trial.",
        shape=shape, micro_batch=micro_batch, steps=40, warmup_steps=8, profile_steps=3,
        variants={"2gpu": Variant("generated", 2, settings),
                  "1gpu": Variant("generated", 1, settings),
                  "1gpu_omp1": Variant("generated", 1, settings, env={"OMP_NUM_THREADS": "1"}),
                  "2gpu_omp16": Variant("generated", 2, settings, env=LAUNCH_THREADS_2GPU)},
        order=("2gpu", "1gpu", "1gpu_omp1", "2gpu_omp16"), rounds=2,
        comparisons=(("2gpu", "1gpu"), ("2gpu", "1gpu_omp1"), ("2gpu_omp16", "2gpu"), ("1gpu_omp1", "1gpu")),
    )


EXPERIMENTS = {
    e.name: e
    for e in [
        Experiment(
            name="sanity_1b",
            description="Both scripts run end to end on the 1.1B shape (one GPU each, side by side).",
            shape="llama-1.1b", micro_batch=4, steps=10, warmup_steps=3,
            variants={"generated": Variant("generated", settings=UNSLOTH_BF16),
                      "reference": Variant("reference", settings={"load_in_4bit": False})},
            order=("generated", "reference"), rounds=1, concurrent=True,
            comparisons=(("generated", "reference"),),
        ),
        backends_8b(
            "backends_qlora_8b",
            "QLoRA 4-bit, with gradient checkpointing as Unsloth's notebooks set it (\"unsloth\"; the fallback "
            "takes it as plain checkpointing): the setting of Unsloth's speed and memory claim.",
            {"load_in_4bit": True, **CHECKPOINTED}),
        backends_8b(
            "backends_qlora_8b_auto",
            "QLoRA 4-bit, checkpointing \"auto\" (the generated script's default: each backend takes the "
            "fastest mode that fits).",
            {"load_in_4bit": True}),
        backends_8b("backends_bf16_8b", "bf16 LoRA, checkpointing \"auto\".", {"load_in_4bit": False}),
        Experiment(
            name="scaling_8b",
            description="DDP scaling of the generated script (1 vs 2 GPUs, same per-GPU batch), the generated "
                        "script vs the hand-written reference at 2 GPUs, and the generated script without nbddp's "
                        "MetricsCallback (its token count gathers over ranks every micro batch); Unsloth bf16 "
                        "LoRA, 8B, checkpointing off (what \"auto\" picks on an H200; the reference is told).",
            shape="llama3-8b", micro_batch=2, steps=40, warmup_steps=8,
            variants={"generated_1gpu": Variant("generated", 1, UNSLOTH_BF16),
                      "generated_2gpu": Variant("generated", 2, UNSLOTH_BF16),
                      "reference_2gpu": Variant("reference", 2, REFERENCE_BF16_OFF),
                      "generated_2gpu_no_metrics": Variant("generated", 2, UNSLOTH_BF16,
                                                           env={"BENCH_REMOVE_CALLBACKS": "MetricsCallback"})},
            order=("generated_1gpu", "generated_2gpu", "reference_2gpu", "generated_2gpu_no_metrics"), rounds=2,
            comparisons=(("generated_2gpu", "generated_1gpu"), ("generated_2gpu", "reference_2gpu"),
                         ("generated_2gpu_no_metrics", "generated_2gpu")),
        ),
        Experiment(
            name="scaling_8b_device_tokens",
            description="scaling_8b again once MetricsCallback counted tokens on the device and summed them over "
                        "ranks once per logged step (instead of Trainer's gather and host sync before every micro "
                        "batch): 1 vs 2 GPUs and generated vs reference, Unsloth bf16 LoRA, 8B, checkpointing off.",
            shape="llama3-8b", micro_batch=2, steps=40, warmup_steps=8,
            variants={"generated_1gpu": Variant("generated", 1, UNSLOTH_BF16),
                      "generated_2gpu": Variant("generated", 2, UNSLOTH_BF16),
                      "reference_2gpu": Variant("reference", 2, REFERENCE_BF16_OFF)},
            order=("generated_2gpu", "reference_2gpu", "generated_1gpu"), rounds=3,
            comparisons=(("generated_2gpu", "generated_1gpu"), ("generated_2gpu", "reference_2gpu")),
        ),
        Experiment(
            name="scaling_8b_qlora",
            description="DDP scaling of the generated script and generated vs reference at 2 GPUs, Unsloth QLoRA "
                        "4-bit, 8B, checkpointing off (what \"auto\" picks on an H200; the reference is told).",
            shape="llama3-8b", micro_batch=2, steps=40, warmup_steps=8,
            variants={"generated_1gpu": Variant("generated", 1, UNSLOTH_QLORA),
                      "generated_2gpu": Variant("generated", 2, UNSLOTH_QLORA),
                      "reference_2gpu": Variant("reference", 2, {"load_in_4bit": True,
                                                                 "use_gradient_checkpointing": "false"})},
            order=("generated_1gpu", "generated_2gpu", "reference_2gpu"), rounds=3,
            comparisons=(("generated_2gpu", "generated_1gpu"), ("generated_2gpu", "reference_2gpu")),
        ),
        Experiment(
            name="scaling_8b_4gpu",
            description="DDP scaling of the generated script over 1, 2 and 4 GPUs (same per-GPU batch) and the "
                        "generated script vs the reference at 4 GPUs; Unsloth bf16 LoRA, 8B, checkpointing off. "
                        "Needs a 4-GPU machine (nvidia-h200-x4).",
            shape="llama3-8b", micro_batch=2, steps=40, warmup_steps=8,
            variants={"generated_1gpu": Variant("generated", 1, UNSLOTH_BF16),
                      "generated_2gpu": Variant("generated", 2, UNSLOTH_BF16),
                      "generated_4gpu": Variant("generated", 4, UNSLOTH_BF16),
                      "reference_4gpu": Variant("reference", 4, REFERENCE_BF16_OFF)},
            order=("generated_1gpu", "generated_4gpu", "reference_4gpu", "generated_2gpu"), rounds=2,
            comparisons=(("generated_2gpu", "generated_1gpu"), ("generated_4gpu", "generated_1gpu"),
                         ("generated_4gpu", "reference_4gpu")),
        ),
        Experiment(
            name="recheck_8b",
            description="A second generated vs hand-written pair at 2 GPUs (reference first this time), Unsloth "
                        "bf16 LoRA, 8B, more timed steps: scaling_8b's one pair fell short of the target.",
            shape="llama3-8b", micro_batch=2, steps=36, warmup_steps=6,
            variants={"reference_2gpu": Variant("reference", 2, {"load_in_4bit": False}),
                      "generated_2gpu": Variant("generated", 2, UNSLOTH_BF16)},
            order=("reference_2gpu", "generated_2gpu"), rounds=1,
            comparisons=(("generated_2gpu", "reference_2gpu"),),
        ),
        threads_and_profile(
            "profile_1b",
            "Where the 1.1B shape's 2-GPU step time goes (gap_1b: scaling 0.65, no suspect closed it). Unsloth bf16 "
            "LoRA.", "llama-1.1b", 4, UNSLOTH_BF16),
        threads_and_profile(
            "threads_8b_qlora", "QLoRA 8B scaling (scaling_8b_qlora: 0.918) with the threads equal. Unsloth QLoRA.",
            "llama3-8b", 2, UNSLOTH_QLORA),
        Experiment(
            name="batch_1b",
            description="Whether more GPU work per step closes the 1.1B shape's 2-GPU gap (profile_1b: 102 ms of "
                        "kernels per step against 127-219 ms steps, the rest host time that varies from trial to "
                        "trial): micro batch 4 and 8, 1 vs 2 GPUs, with the CPU threads `pipeline.py launch` "
                        "gives (all cores for one process, half each for two). Unsloth bf16 LoRA.",
            shape="llama-1.1b", micro_batch=4, steps=40, warmup_steps=8,
            variants={"2gpu": Variant("generated", 2, UNSLOTH_BF16, env=LAUNCH_THREADS_2GPU),
                      "1gpu": Variant("generated", 1, UNSLOTH_BF16),
                      "2gpu_mb8": Variant("generated", 2, {**UNSLOTH_BF16, "per_device_train_batch_size": 8},
                                          env=LAUNCH_THREADS_2GPU),
                      "1gpu_mb8": Variant("generated", 1, {**UNSLOTH_BF16, "per_device_train_batch_size": 8})},
            order=("2gpu", "1gpu", "2gpu_mb8", "1gpu_mb8"), rounds=2,
            comparisons=(("2gpu", "1gpu"), ("2gpu_mb8", "1gpu_mb8"), ("1gpu_mb8", "1gpu")),
        ),
        Experiment(
            name="bucket_8b_qlora",
            description="Whether the QLoRA 8B 2-GPU gap (0.93 over 6 pairs) is NCCL's waiting kernels running beside "
                        "backward compute (threads_8b_qlora: the rank that waited 289 ms per step in the all-reduce "
                        "ran its compute kernels 12% slower): DDP's default 25 MB buckets, all-reduced during "
                        "backward, against one bucket all-reduced after it (168 MB of LoRA gradients, under 1 ms "
                        "over NVLink). Threads as `pipeline.py launch` gives them. Unsloth QLoRA, 3 profiled steps.",
            shape="llama3-8b", micro_batch=2, steps=40, warmup_steps=8, profile_steps=3,
            variants={"2gpu": Variant("generated", 2, UNSLOTH_QLORA, env=LAUNCH_THREADS_2GPU),
                      "1gpu": Variant("generated", 1, UNSLOTH_QLORA),
                      "2gpu_one_bucket": Variant("generated", 2, UNSLOTH_QLORA, env=LAUNCH_THREADS_2GPU,
                                                 ddp={"bucket_cap_mb": 1024})},
            order=("2gpu", "1gpu", "2gpu_one_bucket"), rounds=2,
            comparisons=(("2gpu", "1gpu"), ("2gpu_one_bucket", "1gpu"), ("2gpu_one_bucket", "2gpu")),
        ),
        Experiment(
            name="gap_1b",
            description="Suspects for the 2-GPU gap on the 1.1B shape, one interleaved run: OMP threads, DDP bucket "
                        "view/static graph/bucket size and padded batches on the generated script (baseline "
                        "opens and closes the round); the checkpointing mode on the reference, the one script "
                        "that exposes it.",
            shape="llama-1.1b", micro_batch=4, steps=40, warmup_steps=8,
            variants={
                "baseline_1gpu": Variant("generated", 1, UNSLOTH_BF16),
                "baseline": Variant("generated", 2, UNSLOTH_BF16),
                "omp_threads_8": Variant("generated", 2, UNSLOTH_BF16, env={"OMP_NUM_THREADS": "8"}),
                "ddp_tuned": Variant("generated", 2, UNSLOTH_BF16,
                                     ddp={"gradient_as_bucket_view": True, "static_graph": True, "bucket_cap_mb": 200}),
                "padded": Variant("generated", 2, UNSLOTH_BF16, env={"UNSLOTH_PADDING_CHOICE": "padded"}),
                "reference_unsloth": Variant("reference", 2, {"use_gradient_checkpointing": "unsloth"}),
                "reference_true": Variant("reference", 2, {"use_gradient_checkpointing": "true"}),
                "reference_off": Variant("reference", 2, {"use_gradient_checkpointing": "false"}),
            },
            order=("baseline", "baseline_1gpu", "omp_threads_8", "ddp_tuned", "padded", "reference_unsloth",
                   "reference_true", "reference_off", "baseline"),
            rounds=1,
            comparisons=(("baseline", "baseline_1gpu"), ("omp_threads_8", "baseline"), ("ddp_tuned", "baseline"),
                         ("padded", "baseline"), ("reference_true", "reference_unsloth"),
                         ("reference_off", "reference_unsloth")),
        ),
    ]
}
