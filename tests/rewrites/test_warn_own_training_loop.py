import textwrap

import pytest
from rewrite_case import assert_unchanged, run

from nbddp.export.rewrites.warn_own_training_loop import WarnOwnTrainingLoop

ADVICE = ("not through a Trainer: under torchrun each rank trains a separate copy of the model on the same data, with "
          "no gradient sync; run the script on one process (--nproc_per_node 1), or make the loop DDP's "
          "(torch.nn.parallel.DistributedDataParallel(model, device_ids=[ddp.local_rank]) on GPUs, a "
          "DistributedSampler for its rows)")


def test_diffusion_gemmas_own_loop_gets_a_warning_at_its_first_backward():
    # DiffusionGemma_(26B-A4B)-Sudoku, cell 16, cut short.
    before = """\
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr = LR)
        for step in range(1, STEPS + 1):
            for _ in range(GRAD_ACCUM):
                loss = torch.nn.functional.cross_entropy(logits[m], x0.to(dev)[m])
                (loss / GRAD_ACCUM).backward(); step_loss += loss.item() / GRAD_ACCUM
            opt.step(); sched.step(); opt.zero_grad(set_to_none = True)
        """
    code, changes = run(WarnOwnTrainingLoop, before)
    assert code == textwrap.dedent(before)
    assert changes == [(5, f"warning: the cell trains in a loop of its own ((loss / GRAD_ACCUM).backward()), {ADVICE}")]


@pytest.mark.parametrize("line", ["optimizer.step()", "loss.backward(retain_graph = True)"])
def test_a_step_or_a_backward_alone_is_a_loop_of_its_own_also_in_a_function(line):
    _, changes = run(WarnOwnTrainingLoop, f"def train_step(batch):\n    {line}\n")
    assert [(number, message.split(" (")[0]) for number, message in changes] == [
        (2, "warning: the cell trains in a loop of its own")]


def test_trainers_accelerate_schedulers_and_rank0_training_are_left_alone():
    assert_unchanged(WarnOwnTrainingLoop, """\
        trainer_stats = trainer.train()
        accelerator.backward(loss)
        scheduler.step()
        env.step(action)
        if ddp.is_main_process:
            loss.backward()
        """)
    assert_unchanged(WarnOwnTrainingLoop, "loss.backward()\n", tags={"rank0"})
