"""Send tensors and models to this rank's device, `ddp.device`, instead of a hard-coded CUDA device.

`ddp.device` is `cuda:<local_rank>` on GPUs and `cpu` without them, so the same script runs under
torchrun on N GPUs and on a laptop. Replaced: `x.cuda()` (also `x.cuda(0)`), `"cuda"`/`"cuda:0"` as
the device of `x.to(...)`, of `torch.set_default_device(...)` or as any `device=` argument, assigned to a name
that says device (`device = "cuda"`, `DEVICE: str = "cuda:0"`; not `device_type`, which `torch.autocast` wants as
a string), and `torch.device("cuda")`/`torch.device("cuda:0")`.
`torch.cuda.get_device_properties(0)` (Unsloth's notebooks open and close training with a memory-stats cell
built on it) becomes `ddp.device_properties()`: this rank's GPU, and on the CPU a stand-in instead of
"Torch not compiled with CUDA enabled". With another device (`get_device_properties(i)` over
`range(torch.cuda.device_count())`, `1`) it becomes `ddp.device_properties(i)`: that device on GPUs, as written,
and the stand-in on the CPU. Other devices (`"cpu"`, `"cuda:1"`, variables) of the other calls are the author's
choice and are left alone.
"""
import libcst as cst
import libcst.matchers as m

from nbddp.export.rewrites.base import Rewrite
from nbddp.export.rewrites.call_args import callee_name, code_of, keyword, literal_value
from nbddp.export.rewrites.vocabulary import CUDA

TORCH_DEVICE = m.Attribute(value=m.Name("torch"), attr=m.Name("device"))
SET_DEFAULT_DEVICE = m.Attribute(value=m.Name("torch"), attr=m.Name("set_default_device"))
GET_DEVICE_PROPERTIES = m.Attribute(value=m.Attribute(value=m.Name("torch"), attr=m.Name("cuda")),
                                    attr=m.Name("get_device_properties"))


def _ddp_device() -> cst.Attribute:
    return cst.Attribute(value=cst.Name("ddp"), attr=cst.Name("device"))


def _is_cuda(node: cst.BaseExpression) -> bool:
    value = literal_value(node)
    return isinstance(value, str) and value in CUDA


def _names_a_device(target: cst.BaseExpression) -> bool:
    """`device`, `DEVICE`, `self.eval_device`: a name that says device, and not a device type."""
    name = target.attr if isinstance(target, cst.Attribute) else target
    return isinstance(name, cst.Name) and "device" in name.value.lower() and "type" not in name.value.lower()


def is_first_gpu(node: cst.BaseExpression) -> bool:
    value = literal_value(node)
    return (type(value) is int and value == 0) or _is_cuda(node)


class ReplaceCudaDevice(Rewrite):
    NAME = "replace-cuda-device"
    DESCRIPTION = ('Use ddp.device (this rank\'s GPU, or the CPU) instead of .cuda(), "cuda" and "cuda:0" (also '
                   'device = "cuda"), and ddp.device_properties() instead of torch.cuda.get_device_properties(0) '
                   '(ddp.device_properties(i) for another device).')

    def leave_Assign(self, original_node: cst.Assign, updated_node: cst.Assign) -> cst.Assign:
        if all(_names_a_device(target.target) for target in original_node.targets):
            return self._replace_assigned(original_node, original_node.targets[-1].target, updated_node)
        return updated_node

    def leave_AnnAssign(self, original_node: cst.AnnAssign, updated_node: cst.AnnAssign) -> cst.AnnAssign:
        if original_node.value is not None and _names_a_device(original_node.target):
            return self._replace_assigned(original_node, original_node.target, updated_node)
        return updated_node

    def _replace_assigned(self, original_node, target, updated_node):
        """`device = "cuda"` -> `device = ddp.device`, so that `x.to(device)` later follows the rank."""
        if not _is_cuda(original_node.value):
            return updated_node
        name = code_of(target)
        self.record(original_node, f"replaced {name} = {code_of(original_node.value)} with {name} = ddp.device")
        return updated_node.with_changes(value=_ddp_device())

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if m.matches(original_node.func, TORCH_DEVICE):
            return self._replace_torch_device(original_node, updated_node)
        if m.matches(original_node.func, GET_DEVICE_PROPERTIES):
            return self._replace_device_properties(original_node, updated_node)
        if isinstance(original_node.func, cst.Attribute) and callee_name(original_node) == "cuda":
            return self._replace_cuda_method(original_node, updated_node)
        if m.matches(original_node.func, SET_DEFAULT_DEVICE) or (
                isinstance(original_node.func, cst.Attribute) and callee_name(original_node) == "to"):
            updated_node = self._replace_first_arg(original_node, updated_node)
        return self._replace_device_keyword(original_node, updated_node)

    def _replace_torch_device(self, original_node, updated_node):
        args = original_node.args
        if args and _is_cuda(args[0].value) and all(is_first_gpu(arg.value) for arg in args[1:]):
            self.record(original_node, f"replaced {code_of(original_node)} with ddp.device")
            return _ddp_device()
        return updated_node

    def _replace_device_properties(self, original_node, updated_node):
        """`torch.cuda.get_device_properties(0)` (or no device, or "cuda") -> `ddp.device_properties()`; with
        another device, `torch.cuda.get_device_properties(i)` -> `ddp.device_properties(i)` (its arguments kept)."""
        func = cst.Attribute(value=cst.Name("ddp"), attr=cst.Name("device_properties"))
        args = original_node.args
        if len(args) > 1:
            return updated_node
        if args and not is_first_gpu(args[0].value):
            replacement = updated_node.with_changes(func=func)
            self.record(original_node, f"replaced {code_of(original_node)} with {code_of(replacement)} (that GPU; "
                                       "the CPU without one)")
            return replacement
        self.record(original_node, f"replaced {code_of(original_node)} with ddp.device_properties() "
                                   "(this rank's GPU; the CPU without one)")
        return cst.Call(func=func)

    def _replace_cuda_method(self, original_node, updated_node):
        """`x.cuda()`, `x.cuda(0)`, `x.cuda(device=0, non_blocking=True)` -> `x.to(ddp.device, ...)`."""
        args = list(updated_node.args)
        device = keyword(updated_node, "device") or (args[0] if args and args[0].keyword is None else None)
        if device is not None and not is_first_gpu(device.value):
            return updated_node
        others = [arg for arg in args if arg is not device]
        if others:  # the last argument keeps the call's closing layout
            others[-1] = others[-1].with_changes(comma=args[-1].comma)
        comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")) if others else cst.MaybeSentinel.DEFAULT
        to_device = cst.Arg(_ddp_device(), comma=comma)
        self.record(original_node.func.attr, "replaced .cuda() with .to(ddp.device)")
        return updated_node.with_changes(
            func=updated_node.func.with_changes(attr=cst.Name("to")), args=[to_device, *others]
        )

    def _replace_first_arg(self, original_node, updated_node):
        """`x.to("cuda")`, `x.to("cuda:0", dtype)` -> `x.to(ddp.device, ...)`; `torch.set_default_device("cuda")`."""
        if not original_node.args or original_node.args[0].keyword or not _is_cuda(original_node.args[0].value):
            return updated_node
        func = ".to" if callee_name(original_node) == "to" else code_of(original_node.func)
        written = code_of(original_node.args[0].value)
        self.record(original_node.args[0], f"replaced {func}({written}) with {func}(ddp.device)")
        first, *others = updated_node.args
        return updated_node.with_changes(args=[first.with_changes(value=_ddp_device()), *others])

    def _replace_device_keyword(self, original_node, updated_node):
        """`device="cuda"` in any call (`x.to(device="cuda")`, `torch.zeros(3, device="cuda:0")`)."""
        given = keyword(original_node, "device")
        if given is None or not _is_cuda(given.value):
            return updated_node
        self.record(given, f"replaced device={code_of(given.value)} with device=ddp.device")
        return updated_node.with_changes(
            args=[
                arg.with_changes(value=_ddp_device()) if arg.keyword and arg.keyword.value == "device" else arg
                for arg in updated_node.args
            ]
        )
