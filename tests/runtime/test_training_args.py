"""`ddp.training_args(Config)(...)`: what generated code builds its training arguments with."""
import pytest

from nbddp.errors import UsageError
from nbddp.runtime.context import DistributedContext


def build(world_size, layout="notebook", **kwargs):
    from trl import SFTConfig

    ddp = DistributedContext(world_size=world_size, batch_layout=layout)
    return ddp.training_args(SFTConfig)(output_dir="out", use_cpu=True, bf16=False, report_to="none", **kwargs)


def test_the_notebooks_global_batch_is_kept_and_rank0_says_so(capsys):
    config = build(2, per_device_train_batch_size=2, gradient_accumulation_steps=4)
    assert (config.per_device_train_batch_size, config.gradient_accumulation_steps) == (2, 2)
    assert config.nbddp_batch_plan.global_batch == 8
    assert capsys.readouterr().out == ("nbddp: SFTConfig: global batch 8 rows = 2 per device x 2 accumulation x 2 "
                                       "processes (the notebook: 2 x 4 x 1; --batch_layout notebook)\n")


def test_defaults_the_notebook_left_are_the_configs_own():
    config = build(4)  # SFTConfig's defaults: 8 rows per device, accumulation 1
    assert (config.per_device_train_batch_size, config.gradient_accumulation_steps) == (2, 1)


def test_an_uneven_split_warns_on_stderr(capsys):
    config = build(2, per_device_train_batch_size=3, gradient_accumulation_steps=1)
    assert config.nbddp_batch_plan.global_batch == 4
    err = capsys.readouterr().err
    assert err.startswith("nbddp: warning: SFTConfig: the notebook's global batch of 3 rows (3 x 1) does not split "
                          "over 2 processes; training with 4 rows per step (2 x 1 x 2)")


def test_per_device_is_classic(capsys):
    config = build(2, "per-device", per_device_train_batch_size=2, gradient_accumulation_steps=4)
    assert (config.per_device_train_batch_size, config.gradient_accumulation_steps) == (2, 4)
    assert capsys.readouterr().err == ""


def test_set_overrides_come_before_the_layout(monkeypatch, capsys):
    monkeypatch.setenv("NBDDP_SET", "gradient_accumulation_steps=8\nlearning_rate=1e-4\nlr_scheduler_type=cosine")
    config = build(2, per_device_train_batch_size=2, gradient_accumulation_steps=4, learning_rate=2e-4)
    assert config.gradient_accumulation_steps == 8  # the command line's: per process, as in Hugging Face's scripts
    assert config.nbddp_batch_plan.command_line == ("gradient_accumulation_steps",)
    assert config.learning_rate == 1e-4 and isinstance(config.learning_rate, float)
    assert config.lr_scheduler_type == "cosine"
    assert "nbddp: SFTConfig: --set learning_rate=0.0001 (the notebook wrote 0.0002)" in capsys.readouterr().out


def test_grpo_generation_batch_must_hold_num_generations():
    from trl import GRPOConfig

    ddp = DistributedContext(world_size=2, batch_layout="per-device")
    with pytest.raises(UsageError, match=r"GRPOConfig: GRPO's generation batch would be 6 completions .* "
                                         r"num_generations=4"):
        ddp.training_args(GRPOConfig)(output_dir="out", use_cpu=True, bf16=False, per_device_train_batch_size=3,
                                      gradient_accumulation_steps=1, num_generations=4, steps_per_generation=1)
    # One process here (GRPOConfig counts the processes of the real group): 4 x 2 generates 8 completions.
    kept = DistributedContext(world_size=1).training_args(GRPOConfig)(
        output_dir="out", use_cpu=True, bf16=False, per_device_train_batch_size=4, gradient_accumulation_steps=2,
        num_generations=8)
    assert (kept.per_device_train_batch_size, kept.gradient_accumulation_steps, kept.generation_batch_size) == (4, 2, 8)


def test_grpo_trains_the_batch_unsloth_gives_it_on_one_gpu(capsys):
    """Unsloth raises a micro batch of 1 to num_generations=6 on one GPU: that is the notebook's global batch."""
    from trl import GRPOConfig

    config = DistributedContext(world_size=1).training_args(GRPOConfig)(
        output_dir="out", use_cpu=True, per_device_train_batch_size=1, gradient_accumulation_steps=1,
        num_generations=6)
    assert (config.per_device_train_batch_size, config.nbddp_batch_plan.global_batch) == (6, 6)
    assert ("nbddp: GRPOConfig: per_device_train_batch_size 1 -> 6 on one device, a multiple of num_generations=6, "
            "as Unsloth sets it") in capsys.readouterr().out


def test_a_smoke_run_can_train_as_the_torchrun_run_will(monkeypatch, capsys):
    monkeypatch.setenv("NBDDP_PLAN_PROCESSES", "2")
    config = build(1, per_device_train_batch_size=2, gradient_accumulation_steps=4)
    assert (config.per_device_train_batch_size, config.gradient_accumulation_steps) == (2, 4)  # both shares here
    assert (config.nbddp_batch_plan.processes, config.nbddp_batch_plan.accumulation) == (2, 2)
    assert "run here by 1 as 2 x 4 (NBDDP_PLAN_PROCESSES=2)" in capsys.readouterr().out
    monkeypatch.setenv("NBDDP_PLAN_PROCESSES", "two")
    with pytest.raises(UsageError, match="NBDDP_PLAN_PROCESSES='two'"):
        build(1)


def test_on_a_cpu_bf16_is_off_unless_the_notebook_sets_it():
    from trl import SFTConfig

    ddp = DistributedContext(world_size=1)
    assert not ddp.on_gpu
    # SFTConfig alone turns bf16 on and then refuses: "Your setup doesn't support bf16/gpu"
    with pytest.raises(ValueError, match="bf16"):
        SFTConfig(output_dir="out", report_to="none")
    assert ddp.training_args(SFTConfig)(output_dir="out", report_to="none").bf16 is False


def test_a_flag_the_notebook_passed_on_is_per_process(monkeypatch, capsys):
    """`--gradient_accumulation_steps 2` on the script's command line (NBDDP_PER_PROCESS), the notebook passing the
    parameter to its config: 2 per process, not the notebook's global batch halved."""
    monkeypatch.setenv("NBDDP_PER_PROCESS", "per_device_train_batch_size=2\ngradient_accumulation_steps=2")
    config = build(2, per_device_train_batch_size=2, gradient_accumulation_steps=2)
    assert (config.per_device_train_batch_size, config.gradient_accumulation_steps) == (2, 2)
    assert capsys.readouterr().out == ("nbddp: SFTConfig: global batch 8 rows = 2 per device x 2 accumulation x 2 "
                                       "processes (command line)\n")


def test_a_value_the_notebook_computed_from_a_flag_is_the_notebooks(monkeypatch):
    monkeypatch.setenv("NBDDP_PER_PROCESS", "gradient_accumulation_steps=2")
    config = build(2, per_device_train_batch_size=2, gradient_accumulation_steps=4)  # e.g. `2 * flag`
    assert config.gradient_accumulation_steps == 2 and config.nbddp_batch_plan.command_line == ()
