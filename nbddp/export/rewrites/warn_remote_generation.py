"""Warn about a cell that generates through a remote API (OpenAI's client, `openai.*`): every rank would call it.

Llama3.2_(1B)-RAFT builds its dataset with GPT-4o (19 minutes, paid). Under torchrun each rank runs that cell: N
times the cost and the time, and each rank may end with a different dataset to train on. The export leaves the
code alone and says so in the report, at the cell's first such call: building an OpenAI client (`OpenAI(...)`,
`AsyncOpenAI`, `AzureOpenAI`: openai's, or LlamaIndex's `OpenAI(model = "gpt-4o")`), `*.completions.create(...)` or
a call on the `openai` module. It does not run the generation once and share it: the call that spends is often
not in sight (RAFT's is `raft_dataset.run()`, two cells on, inside LlamaIndex), and sharing a result takes a
collective that every rank must reach and a result that pickles. Calls inside functions the cell defines (a reward
function scoring each rank's own completions) do not count, nor a cell tagged `rank0` or code under
`if ddp.is_main_process:`.
"""
import libcst as cst
import libcst.matchers as m

from nbddp.export.rewrites.base import Rewrite
from nbddp.export.rewrites.call_args import callee_name, code_of
from nbddp.export.rewrites.ddp_blocks import MAIN_PROCESS_ONLY

CLIENTS = {"OpenAI", "AsyncOpenAI", "AzureOpenAI"}
COMPLETIONS = m.Attribute(value=m.Attribute(attr=m.Name("completions")), attr=m.Name("create"))


def calls_remote_generation(call: cst.Call) -> bool:
    """`OpenAI(...)` (also `openai.OpenAI`, `AsyncOpenAI`, `AzureOpenAI`), `*.completions.create(...)`, or
    `openai.*(...)`."""
    if callee_name(call) in CLIENTS or m.matches(call.func, COMPLETIONS):
        return True
    root = call.func
    while isinstance(root, cst.Attribute):  # openai.ChatCompletion.create -> openai
        root = root.value
    return root is not call.func and m.matches(root, m.Name("openai"))


class WarnRemoteGeneration(Rewrite):
    NAME = "warn-remote-generation"
    DESCRIPTION = ("Warn about a cell that generates through a remote API (OpenAI's client): under torchrun every "
                   "rank makes the calls.")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._warned = "rank0" in self.context.cell_tags

    def visit_If(self, node: cst.If) -> bool:
        return not m.matches(node, MAIN_PROCESS_ONLY)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False

    def visit_Call(self, node: cst.Call) -> None:
        if self._warned or not calls_remote_generation(node):
            return
        self._warned = True
        self.record(node, f"warning: the cell generates through a remote API ({code_of(node.func)}): under torchrun "
                          "every rank makes its calls, here and through what it builds in later cells: N times the "
                          "cost and time, and each rank may get different answers (a dataset that differs between "
                          "ranks); generate once and save it (tag the generating cells notebook-only and run them in "
                          "Jupyter), then load the saved file in a cell every rank runs")
