"""Drop a notebook's own process setup: `ddp` has set this rank's GPU and joined the process group already.

- `torch.cuda.set_device(0)` (also `"cuda"`, `"cuda:0"`, `torch.device("cuda")`) would put every rank on GPU 0,
  and fails without CUDA; the runtime sets `cuda:<local_rank>` when it joins the group. Another device
  (`set_device(local_rank)`, `set_device(1)`) is the author's choice and is left alone.
- `init_process_group(...)` (`dist.`, `torch.distributed.` or imported bare) would join a second time (torch
  refuses), or ask for nccl where there is no GPU: the runtime joined with nccl on GPUs, gloo on CPU.
- `destroy_process_group()`: `ddp.shutdown()`, the script's last statement, leaves the group.

Only a line that makes nothing but such calls is dropped; it leaves `# nbddp: dropped <call>` (see dropped_lines).
"""
import libcst as cst
import libcst.matchers as m

from nbddp.export.rewrites.base import Rewrite
from nbddp.export.rewrites.call_args import callee_name, code_of
from nbddp.export.rewrites.dropped_lines import comment_out, dropped_line
from nbddp.export.rewrites.replace_cuda_device import TORCH_DEVICE, is_first_gpu

SET_DEVICE = m.Attribute(value=m.Attribute(value=m.Name("torch"), attr=m.Name("cuda")), attr=m.Name("set_device"))
WHY = {
    "set_device": "ddp set this rank's own GPU already (cuda:<local_rank>; none on CPU)",
    "init_process_group": "ddp joined the process group already: nccl on GPUs, gloo on CPU",
    "destroy_process_group": "ddp.shutdown() leaves the process group at the end of the script",
}


def _first_gpu_device(node: cst.BaseExpression) -> bool:
    """`0`, `"cuda"`, `"cuda:0"`, or `torch.device(<those>)`."""
    if m.matches(node, m.Call(func=TORCH_DEVICE)):
        return bool(node.args) and all(is_first_gpu(arg.value) for arg in node.args)
    return is_first_gpu(node)


def setup_call(small: cst.BaseSmallStatement) -> str | None:
    """Which setup call a statement is (a key of WHY), or None."""
    if not (isinstance(small, cst.Expr) and isinstance(small.value, cst.Call)):
        return None
    call = small.value
    if m.matches(call.func, SET_DEVICE):
        return "set_device" if len(call.args) == 1 and _first_gpu_device(call.args[0].value) else None
    name = callee_name(call)
    return name if name in ("init_process_group", "destroy_process_group") else None


class DropProcessSetup(Rewrite):
    NAME = "drop-process-setup"
    DESCRIPTION = ("Drop the notebook's torch.cuda.set_device(0), init_process_group(...) and destroy_process_group():"
                   " ddp set this rank's device and joined the process group; ddp.shutdown() leaves it.")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._dropped: list[cst.SimpleStatementLine] = []

    def leave_SimpleStatementLine(self, original_node, updated_node):
        calls = [setup_call(small) for small in original_node.body]
        if not all(calls):
            return updated_node
        for small, call in zip(original_node.body, calls):
            self.record(small, f"dropped {code_of(small.value)}: {WHY[call]}")
        dropped = dropped_line(updated_node, "; ".join(code_of(small.value) for small in original_node.body))
        self._dropped.append(dropped)
        return dropped

    def leave_IndentedBlock(self, original_node, updated_node):
        body, footer = comment_out(updated_node.body, updated_node.footer, self._dropped, keep_statement=True)
        return updated_node.with_changes(body=body, footer=footer)

    def leave_Module(self, original_node, updated_node):
        body, footer = comment_out(updated_node.body, updated_node.footer, self._dropped, keep_statement=False)
        return updated_node.with_changes(body=body, footer=footer)
