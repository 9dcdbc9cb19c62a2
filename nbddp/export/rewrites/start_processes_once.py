"""A process a cell starts (`subprocess.Popen(...)`: a vLLM or sglang server, `ollama serve`, NeMo-Gym's `ng_run`)
starts once per machine, as a `!command` runs once per machine through `ddp.shell`.

Under torchrun every rank would start its own copy: N servers fighting for one port and one GPU's memory. The call
becomes `ddp.start_process(lambda: subprocess.Popen(...))` (also a bare `Popen(...)`): the first rank of the machine
to get there starts it, the others get a handle on that process, so the lines after it (polling the server on
localhost, `proc.poll()`, `proc.pid`, `proc.terminate()`, `proc.kill()`, `proc.wait()`) run on every rank as
written (nbddp.runtime.started_processes). The lambda leaves the call as the author wrote it, and keeps its
arguments (`stdout = open("vllm.log", "w")`) from being evaluated on the ranks that do not start it.
"""
import libcst as cst
import libcst.matchers as m

from nbddp.export.rewrites.base import Rewrite
from nbddp.export.rewrites.call_args import code_of
from nbddp.export.rewrites.ddp_blocks import ddp_call, is_ddp_call

POPEN = m.Call(func=m.Attribute(value=m.Name("subprocess"), attr=m.Name("Popen")) | m.Name("Popen"))


class StartProcessesOnce(Rewrite):
    NAME = "start-processes-once"
    DESCRIPTION = ("Start a process a cell starts (subprocess.Popen: a server) once per machine, as ddp.shell runs a "
                   "!command; the other ranks get a handle on that process.")

    def visit_Call(self, node: cst.Call) -> bool:
        return not is_ddp_call(node, "start_process")  # started once already

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if not m.matches(original_node, POPEN):
            return updated_node
        self.record(original_node, f"{code_of(original_node.func)}(...) starts a process: it starts once per "
                                   "machine (ddp.start_process), and the machine's other ranks get a handle on it "
                                   "(pid, poll, wait, terminate, kill)")
        return ddp_call("start_process", cst.Lambda(params=cst.Parameters(), body=updated_node))
