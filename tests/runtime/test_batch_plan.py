import pytest

from nbddp.errors import UsageError
from types import SimpleNamespace

from nbddp.runtime.memory import batch_plan
from nbddp.runtime.memory.batch_plan import generation_batch_problem, one_gpu_grpo_micro_batch, parse_layout, plan


def layout(p):
    return p.micro_batch, p.accumulation, p.processes, p.global_batch


def test_the_notebooks_global_batch_is_kept_by_dividing_the_accumulation():
    p = plan(2, 4, 2, "notebook")
    assert layout(p) == (2, 2, 2, 8)
    assert p.warning is None
    assert p.describe() == ("global batch 8 rows = 2 per device x 2 accumulation x 2 processes "
                            "(the notebook: 2 x 4 x 1; --batch_layout notebook)")


def test_one_process_runs_the_notebook_as_written():
    p = plan(2, 4, 1, "notebook")
    assert layout(p) == (2, 4, 1, 8)
    assert p.describe() == "global batch 8 rows = 2 per device x 4 accumulation x 1 process (as the notebook)"


def test_an_accumulation_the_processes_do_not_divide_takes_the_fullest_exact_split():
    assert layout(plan(4, 3, 2, "notebook")) == (3, 2, 2, 12)  # 12 rows: 3 x 2 x 2, not 2 x 3 x 2
    assert layout(plan(8, 1, 2, "notebook")) == (4, 1, 2, 8)
    assert layout(plan(2, 1, 2, "notebook")) == (1, 1, 2, 2)


def test_a_global_batch_that_does_not_split_takes_the_nearest_and_warns():
    p = plan(3, 1, 2, "notebook")
    assert p.global_batch != 3
    assert abs(p.global_batch - 3) == 1
    assert "does not split over 2 processes" in p.warning
    assert "--batch_layout per-device" in p.warning


def test_per_device_is_classic_ddp():
    p = plan(2, 4, 2, "per-device")
    assert layout(p) == (2, 4, 2, 16)
    assert p.warning is None  # asked for: not a surprise


def test_an_explicit_micro_batch_is_checked_now_and_applied_at_train():
    given = plan(2, 4, 2, 4)
    assert layout(given) == (2, 2, 2, 8) and given.layout == "4" and given.fuller  # fuller_batch takes 4 later
    assert not plan(2, 4, 2, "notebook").fuller and plan(2, 4, 2, "auto").fuller
    with pytest.raises(UsageError, match="not a whole number of micro batches of 3"):
        plan(2, 4, 2, 3)


def test_layout_values_are_checked():
    assert parse_layout(" Auto ") == "auto"
    assert parse_layout("16") == 16
    for bad in ("fast", "0", True, -1, None):
        with pytest.raises(UsageError, match="--batch_layout must be one of notebook, per-device, auto"):
            parse_layout(bad)
    with pytest.raises(UsageError, match="gradient_accumulation_steps=0"):
        plan(2, 0, 1, "notebook")


def test_grpo_generation_batch_is_checked_against_num_generations():
    kept = plan(2, 4, 2, "notebook")  # 8 completions per generation, as on one process
    assert generation_batch_problem(kept, 8, None, None) is None
    classic = plan(3, 1, 2, "per-device")  # 6 completions
    problem = generation_batch_problem(classic, 4, None, None)
    assert "generation batch would be 6 completions" in problem and "num_generations=4" in problem
    assert generation_batch_problem(classic, 4, 8, None) is None  # set explicitly: the config's own
    assert generation_batch_problem(classic, None, None, None) is None  # not GRPO


def test_one_process_can_run_the_layout_of_two():
    emulated = plan(2, 4, 2, "notebook", running=1)  # NBDDP_PLAN_PROCESSES=2 on one process
    assert layout(emulated) == (2, 2, 2, 8) and emulated.accumulation_here == 4
    assert emulated.describe().endswith(", run here by 1 as 2 x 4 (NBDDP_PLAN_PROCESSES=2)")
    assert plan(2, 4, 2, "notebook").accumulation_here == 2
    with pytest.raises(UsageError, match="cannot take equal shares"):
        plan(2, 4, 3, "notebook", running=2)


def test_arguments_a_trainer_rebuilt_find_their_plan_again():
    made = plan(2, 4, 2, "auto")
    batch_plan.remember(made)
    kept = SimpleNamespace(per_device_train_batch_size=2, gradient_accumulation_steps=2, nbddp_batch_plan=made)
    rebuilt = SimpleNamespace(per_device_train_batch_size=2, gradient_accumulation_steps=2)  # from to_dict()
    other = SimpleNamespace(per_device_train_batch_size=16, gradient_accumulation_steps=3)
    assert batch_plan.of(kept) is made and batch_plan.of(rebuilt) is made and rebuilt.nbddp_batch_plan is made
    assert batch_plan.of(other) is None


def test_grpo_on_two_processes_splits_the_batch_unsloth_trains_on_one_gpu():
    # Gemma3_(1B)-GRPO: 1 x 1 and num_generations=6; Unsloth trains 6 x 1 on one GPU
    assert one_gpu_grpo_micro_batch(1, 1, 6, None, None) == 6
    two = plan(one_gpu_grpo_micro_batch(1, 1, 6, None, None), 1, 2, "notebook")
    assert (two.micro_batch, two.accumulation_here, two.global_batch) == (3, 1, 6)
    assert generation_batch_problem(two, 6, None, None) is None
    # already a multiple, or a generation setting given: the notebook's own
    assert one_gpu_grpo_micro_batch(2, 3, 6, None, None) == 2
    assert one_gpu_grpo_micro_batch(1, 1, 6, None, 2) == 1
    assert one_gpu_grpo_micro_batch(4, 1, None, None, None) == 4


BOTH = batch_plan.BATCH_KEYWORDS


def test_command_line_values_are_per_process():
    """`--per_device_train_batch_size 2 --gradient_accumulation_steps 2` on 2 processes: 2 x 2 x 2, as in every
    Hugging Face script, not the notebook's global batch of 4 split over them."""
    p = plan(2, 2, 2, "notebook", command_line=BOTH)
    assert layout(p) == (2, 2, 2, 8) and p.warning is None
    assert p.describe() == "global batch 8 rows = 2 per device x 2 accumulation x 2 processes (command line)"
    assert p.as_record()["command_line"] == list(BOTH)
    assert layout(plan(2, 2, 2, "notebook")) == (2, 1, 2, 4)  # the same values from the notebook


def test_one_command_line_value_keeps_the_notebooks_micro_batch_per_device():
    p = plan(4, 2, 2, "notebook", command_line=("gradient_accumulation_steps",))
    assert layout(p) == (4, 2, 2, 16)
    assert p.describe().endswith("x 2 processes (gradient_accumulation_steps from the command line)")


def test_command_line_values_run_by_one_process_for_two():
    """The smoke run's layout check (NBDDP_PLAN_PROCESSES=2 on one process) trains the 2 processes' global batch."""
    p = plan(2, 2, 2, "notebook", running=1, command_line=BOTH)
    assert (p.global_batch, p.accumulation_here) == (8, 4)


def test_a_fuller_layout_keeps_the_command_lines_rows_per_process():
    auto = plan(2, 2, 2, "auto", command_line=BOTH)
    assert layout(auto) == (2, 2, 2, 8) and auto.fuller
    assert auto.describe().endswith("(command line: 2 x 2 per process; --batch_layout auto)")
    assert plan(2, 2, 2, 4, command_line=BOTH).layout == "4"
    with pytest.raises(UsageError, match="the command line's 2 x 2 rows per process are not a whole number of "
                                         "micro batches of 3"):
        plan(2, 2, 2, 3, command_line=BOTH)


def test_the_command_lines_values_travel_in_the_environment():
    environ = {batch_plan.PER_PROCESS: "per_device_train_batch_size=2\nlearning_rate=1"}
    assert batch_plan.command_line_values(environ) == {"per_device_train_batch_size": "2"}
    text = batch_plan.per_process_environment({"gradient_accumulation_steps": 4, "rows": 5}, environ)
    assert text == "per_device_train_batch_size=2\ngradient_accumulation_steps=4"
    assert batch_plan.per_process_environment({"rows": 5}, {}) == ""
