from rewrite_case import assert_rewrites, assert_unchanged

from nbddp.export.rewrites.plan_training_args import PlanTrainingArgs


def test_a_config_is_built_by_the_runtime_and_the_report_names_the_batch_kept():
    changes = assert_rewrites(
        PlanTrainingArgs,
        """\
        trainer = SFTTrainer(
            model = model,
            args = SFTConfig(
                per_device_train_batch_size = 2,
                gradient_accumulation_steps = 4, # the notebook's comment
            ),
        )
        """,
        """\
        trainer = SFTTrainer(
            model = model,
            args = ddp.training_args(SFTConfig)(
                per_device_train_batch_size = 2,
                gradient_accumulation_steps = 4, # the notebook's comment
            ),
        )
        """,
    )
    assert changes == [(3, "SFTConfig(...) -> ddp.training_args(SFTConfig)(...) (the notebook's 2 x 4 rows per step "
                           "kept on N processes, see --batch_layout; --set NAME=VALUE overrides)")]


def test_defaults_and_qualified_names_are_named_as_written():
    changes = assert_rewrites(
        PlanTrainingArgs,
        "args = transformers.TrainingArguments(output_dir = 'out', **extra)\n",
        "args = ddp.training_args(transformers.TrainingArguments)(output_dir = 'out', **extra)\n",
    )
    assert changes == [(1, "transformers.TrainingArguments(...) -> ddp.training_args(transformers.TrainingArguments)"
                           "(...) (the notebook's per_device_train_batch_size's default x "
                           "gradient_accumulation_steps's default rows per step kept on N processes, see "
                           "--batch_layout; --set NAME=VALUE overrides)")]


def test_other_calls_are_left_alone():
    assert_unchanged(
        PlanTrainingArgs,
        """\
        trainer = SFTTrainer(model = model, per_device_train_batch_size = 2)
        config = LoraConfig(r = 16)
        args = ddp.training_args(GRPOConfig)(num_generations = 4)
        """,
    )
