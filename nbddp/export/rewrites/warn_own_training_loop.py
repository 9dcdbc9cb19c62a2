"""Warn about a training loop of the notebook's own (`loss.backward()`, `optimizer.step()` outside any Trainer).

The DDP of a Trainer's training comes from the Trainer: it wraps the model in DistributedDataParallel and shards
the data. A loop of the cell's own does neither, so under torchrun each rank trains a separate copy of the model on
the same rows, with no gradient sync: N times the work for one process's result. The export cannot make such a loop
DDP's without knowing its data and model, so it leaves the code alone and says so in the report, at the first
`.backward()` (but `accelerator.backward(loss)`: Accelerate's, which syncs) or `<optimizer>.step()` of the cell,
functions it defines included. A cell tagged `rank0` (and code under `if ddp.is_main_process:`) trains once.
"""
import libcst as cst
import libcst.matchers as m

from nbddp.export.rewrites.base import Rewrite
from nbddp.export.rewrites.call_args import callee_name, code_of, receiver_name
from nbddp.export.rewrites.ddp_blocks import MAIN_PROCESS_ONLY


def trains(call: cst.Call) -> bool:
    """`<loss>.backward()` but Accelerate's, or `<optimizer>.step()` (a receiver whose name starts with `opt`)."""
    if not isinstance(call.func, cst.Attribute):
        return False
    receiver = receiver_name(call) or ""
    if callee_name(call) == "backward":
        return receiver != "accelerator"
    return callee_name(call) == "step" and receiver.lower().startswith("opt")


class WarnOwnTrainingLoop(Rewrite):
    NAME = "warn-own-training-loop"
    DESCRIPTION = ("Warn about a training loop of the notebook's own (loss.backward(), optimizer.step()): under "
                   "torchrun each rank trains a separate copy of the model.")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._warned = "rank0" in self.context.cell_tags

    def visit_If(self, node: cst.If) -> bool:
        return not m.matches(node, MAIN_PROCESS_ONLY)

    def visit_Call(self, node: cst.Call) -> None:
        if self._warned or not trains(node):
            return
        self._warned = True
        self.record(node, f"warning: the cell trains in a loop of its own ({code_of(node)}), not through a Trainer: "
                          "under torchrun each rank trains a separate copy of the model on the same data, with no "
                          "gradient sync; run the script on one process (--nproc_per_node 1), or make the loop "
                          "DDP's (torch.nn.parallel.DistributedDataParallel(model, device_ids=[ddp.local_rank]) on "
                          "GPUs, a DistributedSampler for its rows)")
