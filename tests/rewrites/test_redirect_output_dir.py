from rewrite_case import assert_rewrites, assert_unchanged

from nbddp.export.rewrites.redirect_output_dir import RedirectOutputDir


def test_the_notebooks_output_dir_goes_through_the_runtime():
    changes = assert_rewrites(
        RedirectOutputDir,
        """\
        args = SFTConfig(
            max_steps = 60,
            output_dir = "outputs",
            report_to = "none", # Use TrackIO/WandB etc
        )
        """,
        """\
        args = SFTConfig(
            max_steps = 60,
            output_dir = ddp.output_dir("outputs"),
            report_to = "none", # Use TrackIO/WandB etc
        )
        """,
    )
    assert changes == [(3, 'output_dir="outputs" -> ddp.output_dir("outputs") (NBDDP_OUTPUT_DIR replaces it; '
                           "pipeline.py smoke and run set it to their run folder)")]


def test_other_calls_already_wrapped_and_arguments_without_output_dir_are_left_alone():
    assert_unchanged(
        RedirectOutputDir,
        """\
        model.save_pretrained(output_dir = "outputs")
        args = TrainingArguments(output_dir = ddp.output_dir("outputs"))
        args = GRPOConfig(max_steps = 10)
        """,
    )
