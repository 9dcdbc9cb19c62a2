"""Give a trainer built without callbacks nbddp's metrics: `callbacks=[ddp.metrics_callback()]`.

The callback writes `<output_dir>/metrics.jsonl` (per-step loss, tokens/s of all ranks, peak memory; held-out
losses), which `pipeline.py run` summarises and plots and `pipeline.py regress` compares. A notebook written
for nbddp passes `callbacks=[MetricsCallback(...)]` itself; one that passes other callbacks is left as written
(nbddp does not edit a list the author chose), and so is a call with `**` arguments, which may hold them.

Calls: names ending in `Trainer` (`Trainer`, `SFTTrainer`, `GRPOTrainer`, Unsloth's `UnslothTrainer`, ...)
that pass a model (`model=...`, or a first positional argument), so that a class named like a trainer but
built otherwise is not touched.
"""
import libcst as cst

from nbddp.export.rewrites.base import Rewrite
from nbddp.export.rewrites.call_args import append_keyword, callee_name, has_double_star, keyword
from nbddp.export.rewrites.vocabulary import is_trainer_class


class RecordMetrics(Rewrite):
    NAME = "record-metrics"
    DESCRIPTION = "A trainer without callbacks gets ddp.metrics_callback(): <output_dir>/metrics.jsonl."

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        passes_model = keyword(original_node, "model") is not None or (
            original_node.args and original_node.args[0].keyword is None)
        if not is_trainer_class(callee_name(original_node)) or not passes_model:
            return updated_node
        if keyword(original_node, "callbacks") is not None or has_double_star(original_node):
            return updated_node
        self.record(original_node, "added callbacks=[ddp.metrics_callback()] (loss, tokens/s and memory per step "
                                   "in <output_dir>/metrics.jsonl, which pipeline.py run and regress read)")
        return append_keyword(updated_node, "callbacks", cst.parse_expression("[ddp.metrics_callback()]"))
