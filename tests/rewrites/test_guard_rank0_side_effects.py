from textwrap import dedent

import pytest
from rewrite_case import assert_rewrites, assert_unchanged, run

from nbddp.export.rewrites.guard_rank0_side_effects import GuardRank0SideEffects


def test_saving_the_lora_runs_once_and_the_others_wait():
    changes = assert_rewrites(
        GuardRank0SideEffects,
        """\
        # Local saving
        model.save_pretrained("lora_model")  # adapters only
        tokenizer.save_pretrained("lora_model")
        trainer.save_model("outputs/final")
        """,
        """\
        # Local saving
        if ddp.is_main_process:
            model.save_pretrained("lora_model")  # adapters only
            tokenizer.save_pretrained("lora_model")
        ddp.barrier()
        trainer.save_model("outputs/final")
        """,
    )
    assert changes == [
        (2, "model.save_pretrained() runs on the main process only; then all ranks wait at ddp.barrier()"),
        (3, "tokenizer.save_pretrained() runs on the main process only; then all ranks wait at ddp.barrier()"),
    ]


@pytest.mark.parametrize(
    "statement",
    [
        'print(f"{trainer_stats.metrics[\'train_runtime\']} seconds used for training.")',
        "pprint(config)",
        "pprint.pprint(config)",
        "display(df.head())",
        "plt.show()",
        'fig.savefig("loss.png")',
    ],
)
def test_display_statements_are_guarded_without_a_barrier(statement):
    code, changes = run(GuardRank0SideEffects, f"{statement}\nx = 1\n")
    assert code == f"if ddp.is_main_process:\n    {statement}\nx = 1\n"
    assert changes and all(line == 1 for line, _ in changes)


@pytest.mark.parametrize(
    "save", ['model.save_pretrained_merged("m", tokenizer, save_method="merged_16bit")', 'model.push_to_hub_gguf("me/m", t)',
             'model.save_lora("grpo_saved_lora")']
)
def test_unsloth_saves_get_a_barrier(save):
    code, _ = run(GuardRank0SideEffects, f"{save}\n")
    assert code == f"if ddp.is_main_process:\n    {save}\nddp.barrier()\n"


@pytest.mark.parametrize("save, under_fsdp", [
    ('model.save_pretrained_merged("m", tokenizer, save_method="merged_16bit")', "it merges in this one process"),
    ('model.push_to_hub_merged("me/m", tokenizer, "merged_16bit", token="")', "it merges in this one process"),
    ('model.save_pretrained_merged("m", tokenizer)', "it merges in this one process"),  # Unsloth's default method
    ('model.save_pretrained_torchao("m", tokenizer)', "it merges in this one process"),
    ('model.save_pretrained_gguf("m", tokenizer, quantization_method="q4_k_m")', "it is refused"),
    ('model.save_pretrained_merged("m", tokenizer, save_method="lora")', None),
    ('model.push_to_hub_merged("me/m", tokenizer, "lora")', None),
    ('model.save_pretrained_merged("m", tokenizer, save_method="LoRA")', None),
    ('model.save_pretrained_merged("m", tokenizer, save_method="Merged 16bit")', "it merges in this one process"),
    ('model.save_pretrained_merged("m", tokenizer, save_method=method)', "it merges in this one process"),
    ('model.save_pretrained_merged("m", tokenizer, save_method="merged_4bit_forced")', "it is refused"),
    ('model.save_pretrained("m")', None),
])
def test_the_report_says_what_fsdp_makes_of_a_merged_save(save, under_fsdp):
    _, changes = run(GuardRank0SideEffects, f"{save}\n")
    (line, message), = changes
    if under_fsdp is None:
        assert "--strategy fsdp" not in message
    else:
        assert f"; under --strategy fsdp {under_fsdp}" in message


def test_nested_statements_are_guarded_in_place_without_a_barrier():
    changes = assert_rewrites(
        GuardRank0SideEffects,
        """\
        for step, loss in enumerate(losses):
            total += loss
            if step % 10 == 0:
                print(step, loss)
                model.save_pretrained(f"ckpt-{step}")

        def report(x):
            print(x)  # shown once
            return x
        """,
        """\
        for step, loss in enumerate(losses):
            total += loss
            if step % 10 == 0:
                if ddp.is_main_process:
                    print(step, loss)
                    model.save_pretrained(f"ckpt-{step}")

        def report(x):
            if ddp.is_main_process:
                print(x)  # shown once
            return x
        """,
    )
    assert [line for line, _ in changes] == [4, 5, 8]


def test_one_line_blocks_become_blocks():
    assert_rewrites(
        GuardRank0SideEffects,
        "for row in rows: print(row)  # each row\n",
        "for row in rows:  # each row\n    if ddp.is_main_process:\n        print(row)\n",
    )


def test_collective_calls_stay_on_every_rank_with_a_note():
    before = "print(trainer.evaluate())\ntrainer_stats = trainer.train()\ntrainer.push_to_hub()\n"
    code, changes = run(GuardRank0SideEffects, before)
    assert "ddp.is_main_process" not in code
    assert changes == [(1, "left for all ranks: it calls trainer.evaluate(), which every rank must run")]


def test_mixed_lines_existing_guards_and_rank0_cells_are_left_alone():
    assert_unchanged(
        GuardRank0SideEffects,
        """\
        x = 1; print(x)
        if ddp.is_main_process:
            print("once")
            model.save_pretrained("lora_model")
        ddp.barrier()
        values = [print(v) for v in vs]
        """,
    )
    assert_unchanged(GuardRank0SideEffects, 'print("hi")\n', tags={"rank0"})


def test_an_existing_barrier_is_not_doubled():
    assert_rewrites(
        GuardRank0SideEffects,
        'model.save_pretrained("m")\nddp.barrier()\n',
        'if ddp.is_main_process:\n    model.save_pretrained("m")\nddp.barrier()\n',
    )


def test_experiment_trackers_start_and_log_one_run_from_the_main_process():
    changes = assert_rewrites(
        GuardRank0SideEffects,
        """\
        import wandb
        wandb.login(key=wandb_key)
        wandb.init(project="unsloth", name="llama-sft")  # one run, not one per rank
        trainer_stats = trainer.train()
        for step, loss in enumerate(losses):
            wandb.log({"loss": loss}, step=step)
        mlflow.log_params({"lr": lr}); trackio.log({"loss": loss})
        wandb.finish()
        """,
        """\
        import wandb
        if ddp.is_main_process:
            wandb.login(key=wandb_key)
            wandb.init(project="unsloth", name="llama-sft")  # one run, not one per rank
        trainer_stats = trainer.train()
        for step, loss in enumerate(losses):
            if ddp.is_main_process:
                wandb.log({"loss": loss}, step=step)
        if ddp.is_main_process:
            mlflow.log_params({"lr": lr}); trackio.log({"loss": loss})
            wandb.finish()
        """,
    )
    assert changes == [
        (2, "wandb.login() runs on the main process only"),
        (3, "wandb.init() runs on the main process only"),
        (6, "wandb.log() runs on the main process only"),
        (7, "mlflow.log_params() runs on the main process only"),
        (7, "trackio.log() runs on the main process only"),
        (8, "wandb.finish() runs on the main process only"),
    ]


def test_a_run_the_cell_binds_is_made_and_used_on_the_main_process():
    changes = assert_rewrites(
        GuardRank0SideEffects,
        """\
        run = wandb.init(project="unsloth")
        run.config.update({"lr": lr})
        run.log({"eval_loss": eval_loss})
        run.finish()
        """,
        """\
        if ddp.is_main_process:
            run = wandb.init(project="unsloth")
            run.config.update({"lr": lr})
            run.log({"eval_loss": eval_loss})
            run.finish()
        """,
    )
    assert changes[0] == (1, "wandb.init() runs on the main process only; `run` exists there only")
    assert [line for line, _ in changes] == [1, 2, 3, 4]


def test_a_tracker_run_around_training_is_left_for_all_ranks_with_a_note():
    before = """\
        with mlflow.start_run(run_name="sft"):
            trainer.train()
        """
    code, changes = run(GuardRank0SideEffects, before)
    assert code == dedent(before)
    assert changes == [(1, "left for all ranks: `with mlflow.start_run(...)` starts a run on every rank; call it as "
                           "a statement (nbddp runs that on the main process only) and end the run after the block")]


def test_tracker_values_and_other_runs_are_left_alone():
    assert_unchanged(
        GuardRank0SideEffects,
        """\
        table = wandb.Table(columns=["prompt", "answer"])
        run = make_run()
        run.log(x)
        args = SFTConfig(report_to="wandb")
        """,
    )
