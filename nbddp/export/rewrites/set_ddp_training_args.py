"""Make training arguments right for torchrun, on GPUs and on CPU.

In `TrainingArguments(...)`, `Seq2SeqTrainingArguments(...)` and TRL's configs (`SFTConfig`, `DPOConfig`,
`GRPOConfig`, ... and Unsloth's `UnslothTrainingArguments`, an `SFTConfig`):

- add `ddp_find_unused_parameters=False` (LoRA freezes most weights; searching for unused ones costs a
  pass and can fail under gradient checkpointing) and `average_tokens_across_devices=True` (the loss is
  normalised by the tokens of all ranks), unless the author set them; a `ddp_timeout` the author set is
  noted as having no effect (the runtime creates the process group before any trainer, with the
  run setting `timeout_s`'s timeout, and accelerate keeps an existing group);
- wrap `fp16=X`/`bf16=X` as `ddp.gpu_only(X)`; a TRL config with neither gets `bf16=ddp.gpu_only(True)`,
  TRL's own default on GPU, because the trainer refuses bf16 on CPU (`TrainingArguments` defaults to
  fp32, which runs anywhere, so it gets nothing);
- 8-bit and paged optimizers (`optim="adamw_8bit"`) -> `ddp.optimizer("adamw_8bit")`, which falls back
  when bitsandbytes cannot run;
- `dataset_num_proc=N` -> `ddp.cap_num_proc(N)`, here and in `*Trainer(...)` calls (Unsloth-era
  notebooks pass it to `SFTTrainer`): every rank starts its own worker processes.
"""
import libcst as cst

from nbddp.export.rewrites.base import Rewrite
from nbddp.export.rewrites.call_args import (
    append_keyword,
    callee_name,
    code_of,
    has_double_star,
    keyword,
    literal_value,
)
from nbddp.export.rewrites.ddp_blocks import ddp_call, is_ddp_call, wrap_keyword
from nbddp.export.rewrites.vocabulary import TRAINING_ARGUMENTS, TRL_CONFIGS, is_trainer_class
from nbddp.formats.run_settings import ENV

DDP_DEFAULTS = {"ddp_find_unused_parameters": "False", "average_tokens_across_devices": "True"}


def is_bitsandbytes_optimizer(node: cst.BaseExpression) -> bool:
    value = literal_value(node)
    return isinstance(value, str) and ("8bit" in value or value.startswith("paged_"))


class SetDdpTrainingArgs(Rewrite):
    NAME = "set-ddp-training-args"
    DESCRIPTION = (
        "DDP settings in TrainingArguments/SFTConfig; precision, 8-bit optimizers and dataset workers "
        "that also work on CPU and on many ranks."
    )

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        name = callee_name(original_node)
        if name in TRAINING_ARGUMENTS:
            updated_node = self._set_ddp_defaults(original_node, updated_node)
            updated_node = self._guard_precision(original_node, updated_node, trl=name in TRL_CONFIGS)
            updated_node = self._wrap_optimizer(original_node, updated_node)
        if name in TRAINING_ARGUMENTS or is_trainer_class(name):
            updated_node = self._cap_dataset_num_proc(original_node, updated_node)
        return updated_node

    def _set_ddp_defaults(self, original_node, updated_node):
        timeout = keyword(original_node, "ddp_timeout")
        if timeout is not None:
            self.record(timeout, f"ddp_timeout={code_of(timeout.value)} has no effect under nbddp; "
                                 f"set {ENV.TIMEOUT_S} (seconds) instead")
        missing = [name for name in DDP_DEFAULTS if keyword(original_node, name) is None]
        if not missing:
            return updated_node
        if has_double_star(original_node):
            self.record(original_node, f"cannot see whether ** arguments set {', '.join(missing)}; left as written")
            return updated_node
        for name in missing:
            updated_node = append_keyword(updated_node, name, cst.parse_expression(DDP_DEFAULTS[name]))
        added = ", ".join(f"{name}={DDP_DEFAULTS[name]}" for name in missing)
        self.record(original_node, f"added {added} (settings for DDP)")
        return updated_node

    def _guard_precision(self, original_node, updated_node, trl):
        given = [keyword(original_node, name) for name in ("fp16", "bf16")]
        for arg in filter(None, given):
            if not is_ddp_call(arg.value, "gpu_only"):
                name = arg.keyword.value
                written = code_of(arg.value)
                self.record(arg, f"{name}={written} -> {name}=ddp.gpu_only(...) (mixed precision needs a GPU)")
                updated_node = wrap_keyword(updated_node, name, "gpu_only")
        if trl and given == [None, None] and not has_double_star(original_node):
            reason = "TRL turns bf16 on by default; the trainer refuses it on CPU"
            self.record(original_node, f"added bf16=ddp.gpu_only(True) ({reason})")
            updated_node = append_keyword(updated_node, "bf16", ddp_call("gpu_only", cst.Name("True")))
        return updated_node

    def _wrap_optimizer(self, original_node, updated_node):
        given = keyword(original_node, "optim")
        if given is None or not is_bitsandbytes_optimizer(given.value):
            return updated_node
        written = code_of(given.value)
        self.record(given, f"optim={written} -> ddp.optimizer({written}) (bitsandbytes optimizers need a GPU)")
        return wrap_keyword(updated_node, "optim", "optimizer")

    def _cap_dataset_num_proc(self, original_node, updated_node):
        given = keyword(original_node, "dataset_num_proc")
        if given is None or is_ddp_call(given.value, "cap_num_proc") or literal_value(given.value) is None:
            return updated_node
        written = code_of(given.value)
        reason = "every rank starts its own workers"
        self.record(given, f"dataset_num_proc={written} -> ddp.cap_num_proc({written}) ({reason})")
        return wrap_keyword(updated_node, "dataset_num_proc", "cap_num_proc")
