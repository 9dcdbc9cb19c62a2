from rewrite_case import assert_rewrites, assert_unchanged

from nbddp.export.rewrites.run_overrides import RunOverrides


def test_the_notebooks_max_steps_and_output_dir_go_through_the_runtime():
    changes = assert_rewrites(
        RunOverrides,
        """\
        args = SFTConfig(
            per_device_train_batch_size = 2,
            max_steps = 60,
            output_dir = "outputs",
            report_to = "none", # Use TrackIO/WandB etc
        )
        """,
        """\
        args = SFTConfig(
            per_device_train_batch_size = 2,
            max_steps = ddp.max_steps(60),
            output_dir = ddp.output_dir("outputs"),
            report_to = "none", # Use TrackIO/WandB etc
        )
        """,
    )
    assert changes == [
        (3, "max_steps=60 -> ddp.max_steps(60) (NBDDP_MAX_STEPS caps it; smoke runs set 3)"),
        (4, 'output_dir="outputs" -> ddp.output_dir("outputs") (NBDDP_OUTPUT_DIR replaces it; pipeline.py smoke '
            "and run set it to their run folder)"),
    ]


def test_arguments_that_train_by_epochs_get_a_cappable_default():
    changes = assert_rewrites(
        RunOverrides,
        "args = TrainingArguments(num_train_epochs = 1, output_dir = ddp.output_dir('outputs'))\n",
        "args = TrainingArguments(num_train_epochs = 1, output_dir = ddp.output_dir('outputs'), "
        "max_steps = ddp.max_steps(-1))\n",
    )
    assert changes == [(1, "added max_steps=ddp.max_steps(-1) (trains by epochs as before; NBDDP_MAX_STEPS caps "
                           "it; smoke runs set 3)")]


def test_other_calls_wrapped_values_and_double_star_arguments_are_left_alone():
    assert_unchanged(
        RunOverrides,
        """\
        trainer = SFTTrainer(model = model, max_steps = 60, output_dir = "outputs")
        model.save_pretrained(output_dir = "outputs")
        args = SFTConfig(max_steps = ddp.max_steps(60), output_dir = ddp.output_dir(output_dir))
        args = GRPOConfig(**settings)
        """,
    )
