import pytest
from rewrite_case import assert_rewrites, assert_unchanged, run

from nbddp.export.rewrites.resume_from_checkpoint import ResumeFromCheckpoint


def test_train_resumes_from_the_checkpoint_the_runtime_chooses():
    changes = assert_rewrites(
        ResumeFromCheckpoint,
        """\
        # train the adapters
        trainer_stats = trainer.train()
        """,
        """\
        # train the adapters
        trainer_stats = trainer.train(resume_from_checkpoint=ddp.checkpoint_to_resume(trainer))
        """,
    )
    assert changes == [(2, "added resume_from_checkpoint=ddp.checkpoint_to_resume(trainer) "
                           "(--resume or a torchrun restart continues from the last complete checkpoint)")]


@pytest.mark.parametrize("receiver", ["sft_trainer", "self.trainer", "SFT_Trainer"])
def test_any_trainer_by_name(receiver):
    assert_rewrites(
        ResumeFromCheckpoint,
        f"{receiver}.train()\n",
        f"{receiver}.train(resume_from_checkpoint=ddp.checkpoint_to_resume({receiver}))\n",
    )


def test_other_arguments_keep_their_layout():
    assert_rewrites(
        ResumeFromCheckpoint,
        """\
        trainer.train(
            ignore_keys_for_eval = ["past_key_values"],  # not compared
        )
        """,
        """\
        trainer.train(
            ignore_keys_for_eval = ["past_key_values"],  # not compared
            resume_from_checkpoint = ddp.checkpoint_to_resume(trainer),
        )
        """,
    )


@pytest.mark.parametrize("call", ['trainer.train(resume_from_checkpoint=True)',
                                  'trainer.train(resume_from_checkpoint="outputs/checkpoint-60")',
                                  'trainer.train("outputs/checkpoint-60")'])
def test_where_the_author_resumes_from_stays_theirs(call):
    code, changes = run(ResumeFromCheckpoint, call + "\n")
    assert code == call + "\n"
    written = call[call.index("(") + 1:-1].removeprefix("resume_from_checkpoint=")
    assert changes == [(1, f"left resume_from_checkpoint={written} as written; --resume does not change it")]


def test_double_star_arguments_are_left_with_a_note():
    code, changes = run(ResumeFromCheckpoint, "trainer.train(**options)\n")
    assert code == "trainer.train(**options)\n"
    assert changes == [(1, "cannot see whether ** arguments set resume_from_checkpoint; left as written")]


def test_models_and_other_calls_are_left_alone():
    assert_unchanged(
        ResumeFromCheckpoint,
        """\
        model.train()
        FastLanguageModel.for_training(model)
        train(trainer)
        trainer.evaluate()
        trainer.train
        """,
    )
