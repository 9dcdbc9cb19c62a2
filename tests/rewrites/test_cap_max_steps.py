from rewrite_case import assert_rewrites, assert_unchanged

from nbddp.export.rewrites.cap_max_steps import CapMaxSteps


def test_the_notebooks_max_steps_goes_through_the_runtime():
    changes = assert_rewrites(
        CapMaxSteps,
        """\
        args = SFTConfig(
            per_device_train_batch_size = 2,
            max_steps = 60,
            output_dir = "outputs",
        )
        """,
        """\
        args = SFTConfig(
            per_device_train_batch_size = 2,
            max_steps = ddp.max_steps(60),
            output_dir = "outputs",
        )
        """,
    )
    assert changes == [(3, "max_steps=60 -> ddp.max_steps(60) (NBDDP_MAX_STEPS caps it; smoke runs set 3)")]


def test_arguments_that_train_by_epochs_get_a_cappable_default():
    changes = assert_rewrites(
        CapMaxSteps,
        "args = TrainingArguments(num_train_epochs = 1, output_dir = 'outputs')\n",
        "args = TrainingArguments(num_train_epochs = 1, output_dir = 'outputs', max_steps=ddp.max_steps(-1))\n",
    )
    assert changes == [(1, "added max_steps=ddp.max_steps(-1) (trains by epochs as before; NBDDP_MAX_STEPS caps it, "
                           "smoke runs set 3)")]


def test_other_calls_already_wrapped_and_unknown_keywords_are_left_alone():
    assert_unchanged(
        CapMaxSteps,
        """\
        trainer = SFTTrainer(model = model, max_steps = 60)
        args = SFTConfig(max_steps = ddp.max_steps(60))
        args = GRPOConfig(**settings)
        """,
    )
