"""`SFTTrainer(..., tokenizer=x)` -> `SFTTrainer(..., processing_class=x)`.

TRL 0.12 and Transformers 5 removed the `tokenizer=` argument of their trainers; Unsloth-era notebooks
still pass it (Unsloth patches it back in, the plain Transformers path does not). The installed TRL
and Transformers trainers all take `processing_class`.
"""
import libcst as cst

from nbddp.export.rewrites.base import Rewrite
from nbddp.export.rewrites.call_args import callee_name, keyword
from nbddp.export.rewrites.vocabulary import TRAINERS


class RenameTrainerTokenizer(Rewrite):
    NAME = "rename-trainer-tokenizer"
    DESCRIPTION = "Pass the tokenizer to trainers as processing_class=, the name current TRL and Transformers take."

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if callee_name(original_node) not in TRAINERS:
            return updated_node
        given = keyword(original_node, "tokenizer")
        if given is None:
            return updated_node
        if keyword(original_node, "processing_class") is not None:
            self.fail(given, "the trainer gets both tokenizer= and processing_class=", hint="keep processing_class=")
        self.record(given, "tokenizer= -> processing_class= (TRL >= 0.12 and Transformers 5 removed tokenizer=)")
        renamed = keyword(updated_node, "tokenizer").with_changes(keyword=cst.Name("processing_class"))
        return updated_node.with_changes(
            args=[renamed if arg is keyword(updated_node, "tokenizer") else arg for arg in updated_node.args]
        )
