from rewrite_case import assert_rewrites, assert_unchanged, run

from nbddp.export.rewrites.set_ddp_training_args import SetDdpTrainingArgs

DDP_ADDED = (
    "added ddp_find_unused_parameters=False, average_tokens_across_devices=True (settings for DDP)"
)


def test_unsloth_training_arguments():
    changes = assert_rewrites(
        SetDdpTrainingArgs,
        """\
        trainer = SFTTrainer(
            model = model,
            train_dataset = dataset,
            dataset_num_proc = 2,
            args = TrainingArguments(
                per_device_train_batch_size = 2,
                max_steps = 60,
                fp16 = not is_bfloat16_supported(),
                bf16 = is_bfloat16_supported(),
                optim = "adamw_8bit",
                output_dir = "outputs",  # checkpoints go here
            ),
        )
        """,
        """\
        trainer = SFTTrainer(
            model = model,
            train_dataset = dataset,
            dataset_num_proc = ddp.cap_num_proc(2),
            args = TrainingArguments(
                per_device_train_batch_size = 2,
                max_steps = 60,
                fp16 = ddp.gpu_only(not is_bfloat16_supported()),
                bf16 = ddp.gpu_only(is_bfloat16_supported()),
                optim = ddp.optimizer("adamw_8bit"),
                output_dir = "outputs",  # checkpoints go here
                ddp_find_unused_parameters = False,
                average_tokens_across_devices = True,
            ),
        )
        """,
    )
    assert sorted(changes) == [
        (4, "dataset_num_proc=2 -> ddp.cap_num_proc(2) (every rank starts its own workers)"),
        (5, DDP_ADDED),
        (8, "fp16=not is_bfloat16_supported() -> fp16=ddp.gpu_only(...) (mixed precision needs a GPU)"),
        (9, "bf16=is_bfloat16_supported() -> bf16=ddp.gpu_only(...) (mixed precision needs a GPU)"),
        (10, 'optim="adamw_8bit" -> ddp.optimizer("adamw_8bit") (bitsandbytes optimizers need a GPU)'),
    ]


def test_trl_config_without_precision_gets_trls_default_on_gpu_only():
    changes = assert_rewrites(
        SetDdpTrainingArgs,
        'config = trl.SFTConfig(output_dir="out", optim="paged_adamw_32bit", dataset_num_proc=4)\n',
        'config = trl.SFTConfig(output_dir="out", optim=ddp.optimizer("paged_adamw_32bit"), '
        "dataset_num_proc=ddp.cap_num_proc(4), ddp_find_unused_parameters=False, "
        "average_tokens_across_devices=True, bf16=ddp.gpu_only(True))\n",
    )
    assert (1, "added bf16=ddp.gpu_only(True) (TRL turns bf16 on by default; the trainer refuses it on CPU)") in changes


def test_transformers_arguments_without_precision_stay_fp32():
    code, _ = run(SetDdpTrainingArgs, 'args = TrainingArguments(output_dir="out")\n')
    assert "bf16" not in code and "fp16" not in code


def test_settings_the_author_chose_are_kept():
    changes = assert_rewrites(
        SetDdpTrainingArgs,
        """\
        args = GRPOConfig(
            ddp_find_unused_parameters = True,
            ddp_timeout = 60,
            fp16 = True,
            optim = "adamw_torch",
        )
        """,
        """\
        args = GRPOConfig(
            ddp_find_unused_parameters = True,
            ddp_timeout = 60,
            fp16 = ddp.gpu_only(True),
            optim = "adamw_torch",
            average_tokens_across_devices = True,
        )
        """,
    )
    assert sorted(changes) == [
        (1, "added average_tokens_across_devices=True (settings for DDP)"),
        (3, "ddp_timeout=60 has no effect under nbddp; set NBDDP_TIMEOUT_S (seconds) instead"),
        (4, "fp16=True -> fp16=ddp.gpu_only(...) (mixed precision needs a GPU)"),
    ]


def test_double_star_arguments_are_not_second_guessed():
    code, changes = run(SetDdpTrainingArgs, "args = SFTConfig(bf16=True, **settings)\n")
    assert code == "args = SFTConfig(bf16=ddp.gpu_only(True), **settings)\n"
    assert changes[0][1].startswith("cannot see whether ** arguments set ddp_find_unused_parameters")


def test_already_rewritten_and_unrelated_calls_are_left_alone():
    assert_unchanged(
        SetDdpTrainingArgs,
        """\
        args = SFTConfig(
            bf16=ddp.gpu_only(True),
            optim=ddp.optimizer("adamw_8bit"),
            dataset_num_proc=ddp.cap_num_proc(2),
            ddp_find_unused_parameters=False,
            average_tokens_across_devices=True,
        )
        trainer = SFTTrainer(model=model, args=args, dataset_num_proc=None)
        other = Config(fp16=True, optim="adamw_8bit", dataset_num_proc=2)
        """,
    )


def test_nested_in_a_function():
    code, changes = run(
        SetDdpTrainingArgs,
        """\
        def make_args(steps):
            return transformers.TrainingArguments(max_steps=steps, ddp_find_unused_parameters=False,
                                                  average_tokens_across_devices=True, bf16=True)
        """,
    )
    assert "bf16=ddp.gpu_only(True)" in code
    assert changes == [(3, "bf16=True -> bf16=ddp.gpu_only(...) (mixed precision needs a GPU)")]
