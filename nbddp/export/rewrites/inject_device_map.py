"""Load each rank's model copy on that rank's own GPU: `device_map=ddp.device_map()` in model loaders.

Under torchrun every rank holds a whole model; `device_map="auto"` would split one model across all
GPUs and `0`/`"cuda"` would put every rank on GPU 0. Matched loaders: `X.from_pretrained(...)` where X
is `FastLanguageModel`, `FastModel`, `FastVisionModel`, `AutoModel*`, `AutoPeftModel*`, `*ForCausalLM`
or `*ForConditionalGeneration`. Replaced: the maps that split a model (`"auto"`, `"sequential"`, Unsloth's
`"unsloth"` planner, ...) and those that put it on GPU 0. Tokenizers and processors are not models and are left
alone. A notebook's own per-rank map of the whole model (`{"": int(os.environ["LOCAL_RANK"])}`, `{"": local_rank}`)
is right on GPUs, but names a GPU a CPU run does not have: it is replaced too, by the same map on GPUs. One that maps
parts of the model by the local rank is kept, with a note.
"""
import libcst as cst
import libcst.matchers as m

from nbddp.export.rewrites.base import Rewrite
from nbddp.export.rewrites.call_args import (
    append_keyword,
    callee_name,
    code_of,
    has_double_star,
    keyword,
    literal_value,
    receiver_name,
    set_keyword_value,
)
from nbddp.export.rewrites.vocabulary import CUDA, UNSLOTH_LOADERS

LOADER_PREFIXES = ("AutoModel", "AutoPeftModel")
LOADER_SUFFIXES = ("ForCausalLM", "ForConditionalGeneration")

SPLITS_THE_MODEL = ("auto", "balanced", "balanced_low_0", "sequential")
# Unsloth's head-aware multi-GPU planner (unsloth/models/loader_utils.py, resolve_unsloth_device_map); under a
# distributed launch it declines to "sequential" and "balanced", and Transformers (nbddp's fallback) refuses the names.
UNSLOTH_PLANNED = ("unsloth", "unsloth_balanced")
FIRST_GPU = (0, *CUDA)
LOCAL_RANK_NAMES = {"local_rank", "local_process_index"}  # accelerate's PartialState().local_process_index
DDP_DEVICE_MAP = m.Call(func=m.Attribute(value=m.Name("ddp"), attr=m.Name("device_map")), args=[])


def is_model_loader(call: cst.Call) -> bool:
    receiver = receiver_name(call)
    return (
        callee_name(call) == "from_pretrained"
        and receiver is not None
        and (receiver in UNSLOTH_LOADERS or receiver.startswith(LOADER_PREFIXES) or receiver.endswith(LOADER_SUFFIXES))
    )


def _on_first_gpu(value) -> bool:
    """`0`, `"cuda"`, `"cuda:0"`, or `{"": <one of those>}` (the whole model on GPU 0)."""
    if isinstance(value, dict):
        return list(value) == [""] and _on_first_gpu(value[""])
    return any(value == gpu and type(value) is type(gpu) for gpu in FIRST_GPU)


def _reads_local_rank(node: cst.BaseExpression) -> bool:
    """The expression reads the LOCAL_RANK variable, or a name or attribute `local_rank`/`local_process_index`."""
    return any(string.evaluated_value == "LOCAL_RANK" for string in m.findall(node, m.SimpleString())) or any(
        name.value in LOCAL_RANK_NAMES for name in m.findall(node, m.Name()))


def _whole_model_on_local_rank(node: cst.BaseExpression) -> bool:
    """`{"": <the local rank>}` or `<the local rank>` alone: the whole model on the rank's own device, what
    `ddp.device_map()` gives."""
    if m.matches(node, m.Dict(elements=[m.DictElement(key=m.SimpleString())])):
        key = node.elements[0].key
        return key.evaluated_value == "" and _reads_local_rank(node.elements[0].value)
    return not isinstance(node, cst.Dict) and _reads_local_rank(node)


class InjectDeviceMap(Rewrite):
    NAME = "inject-device-map"
    DESCRIPTION = "Model loaders get device_map=ddp.device_map(): each rank loads the whole model on its own GPU."

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if not is_model_loader(original_node):
            return updated_node
        given = keyword(original_node, "device_map")
        if given is None and has_double_star(original_node):
            self.record(original_node, "cannot see whether ** arguments set device_map; it should be ddp.device_map()")
            return updated_node
        if given is None:
            self.record(original_node, "added device_map=ddp.device_map() (each rank loads the model on its own GPU)")
            return append_keyword(updated_node, "device_map", cst.parse_expression("ddp.device_map()"))
        if m.matches(given.value, DDP_DEVICE_MAP):
            return updated_node
        written, value = f"device_map={code_of(given.value)}", literal_value(given.value)
        if value in SPLITS_THE_MODEL:
            reason = "splits the model across GPUs; under torchrun each rank must hold its own copy"
        elif value in UNSLOTH_PLANNED:
            reason = "Unsloth's planner splits the model across GPUs; under torchrun each rank must hold its own copy"
        elif _on_first_gpu(value):
            reason = "puts every rank on GPU 0; each rank must use its own GPU"
        elif _whole_model_on_local_rank(given.value):
            reason = ("the notebook's own LOCAL_RANK map names the rank's GPU, which a CPU run lacks; "
                      "ddp.device_map() is the same map on GPUs and also runs on a CPU")
        elif _reads_local_rank(given.value):
            self.record(given, f"kept {written}: the notebook's own LOCAL_RANK map puts each rank on its own GPU "
                               "(it needs GPUs; ddp.device_map() also runs on a CPU)")
            return updated_node
        else:
            self.record(
                given,
                f"left {written} as written; under torchrun each rank needs the whole model on its own GPU,"
                " as ddp.device_map() gives",
            )
            return updated_node
        self.record(given, f"replaced {written} ({reason})")
        return set_keyword_value(updated_node, "device_map", cst.parse_expression("ddp.device_map()"))
