"""Unsloth's decoder layers replayed from CUDA graphs (the run setting `cuda_graphs`; docs/performance.md, "CUDA
graphs over the decoder layers").

A training step under `--batch_layout auto` spends most of its time in the host issuing the layers' kernels, one
by one, while the GPU waits. With `cuda_graphs` on, and the layout's checkpointing off, each decoder layer's forward
and backward is captured once per bucket as a CUDA graph (`torch.cuda.make_graphed_callables`) and replayed: one
launch a layer and pass instead of about a hundred. A graph replays fixed shapes, so a padding-free micro batch of
T tokens (one row, its sequences end to end) runs padded up to its bucket, the next multiple of BUCKET_TOKENS above
T, by one more sequence: its own attention block, no loss, zero gradient, so the real tokens' outputs and every
gradient are the micro batch's own. A bucket (its size, its number of sequences) is captured the first time a micro
batch needs it; every bucket shares one memory pool, which is sound because a micro batch's forward and backward end
before the next one's forward starts.

Measured on one H100 (docs/performance.md): every micro batch of the 8B Alpaca notebook replayed, its step 1.78x sooner,
about 1.1 s to capture a bucket. Only where the arithmetic is known to replay: on CUDA, under real Unsloth with its own
decoder layer forward and the `unsloth-packed-attention` patch (the varlen kernel reads its sequence table from the GPU;
Unsloth's per sequence paths read it on the host, which a graph would freeze: a capture in which a layer took one
fails). The graphs hand back each gradient in a buffer the next replay overwrites, which autograd would adopt as a
parameter's gradient (pytorch/pytorch#181723): the layers' parameters get zeroed gradients of nbddp's before a replay.
Any other call of a layer (evaluation, no grad, padded batches, a key-value cache) runs eagerly, as does everything
after a capture that fails (said once, with the error). `install` says what it did; at the end of training rank 0 says
how many micro batches replayed.
"""
import collections
import contextlib
import functools
import gc
import math
import time

import torch
from transformers import TrainerCallback

from nbddp import log, patches
from nbddp.formats import run_settings
from nbddp.rank import is_main_process

PATCH = "unsloth-graphed-layers"
BUCKET_TOKENS = 256
# The keywords Unsloth's Llama-family model passes its decoder layers (unsloth/models/llama.py,
# LlamaModel_fast_forward, with the model's own **kwargs); those of NOT_SET must be empty for a layer to replay
# from a graph.
KEYWORDS = {"causal_mask", "attention_mask", "position_ids", "past_key_value", "output_attentions", "use_cache",
            "padding_mask", "position_embeddings", "packed_seq_lengths"}
NOT_SET = ("causal_mask", "attention_mask", "past_key_value", "output_attentions", "use_cache", "padding_mask")
MAX_BUCKETS = 12  # each holds its layers' input, output and gradient buffers besides the shared pool
# GPU memory a bucket may take a token, layer and hidden unit, in bytes: its fixed buffers (8 a hidden unit) and the
# pool's growth (0.17 MiB a token and layer at 8B widths, bench/results/graphed_layers_1xh100.json: about 43 x
# hidden), with a margin. A new bucket is captured only where that much is free.
BUCKET_BYTES = 64


def wanted() -> bool:
    """Whether the run setting `cuda_graphs` is on; a value that is neither on nor off is a usage error."""
    return run_settings.switch("cuda_graphs")


def install(trainer, mode: str) -> None:
    """Under `cuda_graphs`, replay `trainer.model`'s decoder layers from CUDA graphs when the chosen gradient
    checkpointing `mode` is "off" and the model is Unsloth's on CUDA (see the module); say on rank 0 what was done,
    or why not. A model trained again (another trainer) keeps its graphs."""
    if not wanted():
        return
    graphs = getattr(trainer.model, "nbddp_graphed_layers", None)
    if graphs is not None:
        trainer.add_callback(GraphsReport(graphs))
        return
    layers = decoder_layers(trainer.model)
    reason = _why_not(trainer, mode, layers)
    if reason:
        _say(f"CUDA graphs (the run setting `cuda_graphs`) stay off: {reason}")
        return
    graphs = trainer.model.nbddp_graphed_layers = GraphedLayers(layers, trainer.args.device)
    trainer.add_callback(GraphsReport(graphs))
    _say(f"CUDA graphs (the run setting `cuda_graphs`): the {len(layers)} decoder layers' forward and backward replay "
         f"from graphs, each micro batch padded to the next multiple of {BUCKET_TOKENS} tokens by one more sequence "
         "that carries no loss; a bucket's graphs are captured when a micro batch first needs them")


def _why_not(trainer, mode, layers):
    from nbddp.runtime.memory.gradient_checkpointing import real_unsloth_imported

    if mode != "off":
        return f"they need gradient checkpointing off, and it is {mode}"
    if trainer.args.device.type != "cuda":
        return f"they need CUDA, and this process trains on {trainer.args.device.type}"
    if not real_unsloth_imported():
        return "they replay Unsloth's decoder layers, and this run trains on Transformers+PEFT"
    if "unsloth-packed-attention" not in patches.active():
        return ("Unsloth's attention here reads each micro batch's sequence lengths on the host, which a graph "
                "would freeze (the patch `unsloth-packed-attention` did not apply)")
    if not layers:
        return "found no decoder layers whose forward is Unsloth's Llama one"
    return None


def decoder_layers(model) -> list:
    """The model's decoder layers, when they are a ModuleList of modules whose forward is Unsloth's Llama-family one
    (every layer called with the same keywords: Gemma 2's alternate); else []."""
    for name, module in model.named_modules():
        if name.endswith("layers") and isinstance(module, torch.nn.ModuleList) and len(module):
            forwards = {getattr(type(layer).forward, "__module__", "") for layer in module}
            return list(module) if forwards == {"unsloth.models.llama"} else []
    return []


def bucket_size(tokens: int) -> int:
    """The bucket of a micro batch of `tokens` tokens: the next multiple of BUCKET_TOKENS with room for at least one
    padding token."""
    return math.ceil((tokens + 1) / BUCKET_TOKENS) * BUCKET_TOKENS


class Table:
    """One bucket's sequence table on the GPU, at the addresses its graphs read: `seq_lengths` (the micro batch's
    sequences and the padding sequence), `cu_seqlens` (their offsets) and `position_ids` (each token's position in
    its sequence). `load` copies a micro batch's in on the device, without waiting for it."""

    def __init__(self, size: int, sequences: int, device, position_dtype=torch.long):
        self.size, self.sequences = size, sequences
        self.seq_lengths = torch.zeros(sequences + 1, dtype=torch.int32, device=device)
        self.cu_seqlens = torch.zeros(sequences + 2, dtype=torch.int32, device=device)
        self.pad_positions = torch.arange(size, dtype=position_dtype, device=device).unsqueeze(0)
        self.position_ids = torch.zeros(1, size, dtype=position_dtype, device=device)

    def load(self, seq_lengths, position_ids, tokens: int) -> None:
        """Make the table the micro batch's: `seq_lengths` of its sequences, `position_ids` (1, tokens), then the
        padding sequence's, which covers every token past the sequences (a row padded past them included)."""
        self.seq_lengths[: self.sequences].copy_(seq_lengths)
        self.seq_lengths[self.sequences:] = self.size - seq_lengths.sum()
        torch.cumsum(self.seq_lengths, 0, dtype=torch.int32, out=self.cu_seqlens[1:])
        self.position_ids[:, :tokens].copy_(position_ids)
        self.position_ids[:, tokens:].copy_(self.pad_positions[:, : self.size - tokens])


def pin_in_unsloth(table: Table, device) -> None:
    """Make Unsloth's packed-sequence cache hand the layers this (loaded) table while its graphs are captured: its
    entry for `table.seq_lengths`, with the bucket as max_seqlen (an upper bound the varlen kernel takes, so the
    graphs serve every micro batch of the bucket). The table adopts the entry's cu_seqlens, so that Unsloth finds
    its host copy of the lengths (no read from the GPU while capturing), and that host copy becomes a table of the
    bucket's size with sequences of two lengths: what Unsloth chooses its attention path by, so that it chooses the
    varlen kernel, which reads the real table on the GPU, whatever the micro batch captured with (equal lengths
    would send it to its per-sequence path)."""
    from unsloth.utils import packing

    packing.get_packed_info_from_kwargs({"packed_seq_lengths": table.seq_lengths}, device)
    entries = [e for e in packing._PACKED_INFO_CACHE.values() if e["seq_lengths"] is table.seq_lengths]
    if len(entries) != 1:
        raise RuntimeError(f"{len(entries)} entries of Unsloth's packed-sequence cache hold the bucket's table")
    lengths, cu_seqlens, _ = entries[0]["result"]
    if lengths.data_ptr() != table.seq_lengths.data_ptr():
        raise RuntimeError("Unsloth's packed-sequence cache copied the bucket's lengths: a replay would not see them")
    table.cu_seqlens = cu_seqlens
    entries[0]["result"] = (lengths, cu_seqlens, table.size)
    packing._PACKED_HOST_LENGTHS_CACHE[lengths.device] = (
        lengths, cu_seqlens, (1,) * table.sequences + (table.size - table.sequences,))


@contextlib.contextmanager
def unsloth_varlen_only(layer_calls: list):
    """Around a capture: count Unsloth's varlen attention calls (`attention_dispatch._varlen_attn_call`, swapped
    for a counting one meanwhile); fewer than the layer calls `layer_calls[0]` means a layer took a path that reads
    the sequence table on the host, which the graphs would freeze: an error."""
    from unsloth.utils import attention_dispatch

    original, calls = attention_dispatch._varlen_attn_call, [0]

    def counted(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)

    attention_dispatch._varlen_attn_call = counted
    try:
        yield
    finally:
        attention_dispatch._varlen_attn_call = original
    if calls[0] != layer_calls[0]:
        raise RuntimeError(f"{layer_calls[0] - calls[0]} of {layer_calls[0]} layer calls took an attention path other "
                           "than Unsloth's varlen kernel, which reads the sequence table on the host")


class _Layer(torch.nn.Module):
    """A decoder layer as `hidden -> hidden` with a bucket's other arguments fixed: what a graph captures."""

    def __init__(self, forward, layer, keywords, calls):
        super().__init__()
        self.layer, self._forward, self._keywords, self._calls = layer, forward, keywords, calls

    def forward(self, hidden):
        self._calls[0] += 1
        return self._forward(hidden, **self._keywords)[0]


Bucket = collections.namedtuple("Bucket", "table graphed rotary")  # rotary: the cos table captured


class GraphedLayers:
    """Replays `layers` (one model's decoder layers, called in order by its forward) from graphs, bucket by bucket;
    `make_graphed`, `pin` and `route_check` are torch's and Unsloth's (tests give stand-ins)."""

    def __init__(self, layers, device, make_graphed=None, pin=pin_in_unsloth, route_check=unsloth_varlen_only):
        self.layers, self.device, self.pin, self.route_check = list(layers), device, pin, route_check
        self.make_graphed = make_graphed or torch.cuda.make_graphed_callables
        self.parameters = [p for layer in self.layers for p in layer.parameters() if p.requires_grad]
        self.grads = None  # nbddp's gradient tensors for them, made at the first replay
        self.pool = torch.cuda.graph_pool_handle() if device.type == "cuda" else None
        self.buckets = {}  # (size, sequences, input requires grad) -> Bucket
        self.current = None  # (Bucket, tokens) of the micro batch between the first layer and the last
        self.failed = None
        self.replayed, self.eager = 0, collections.Counter()  # micro batches; eager ones by reason
        self.capture_s, self.captured_gib = 0.0, 0.0
        self.originals = [layer.forward for layer in self.layers]
        for index, layer in enumerate(self.layers):
            patches.set_attribute(PATCH, layer, "forward", functools.partial(self.forward, index))

    def forward(self, index, hidden_states, *args, **kwargs):
        """Layer `index`'s forward: eager, or the micro batch's bucket replayed (padded at the first layer, cut
        back to its tokens after the last)."""
        if index == 0:
            self.current = self._enter(hidden_states, args, kwargs)
        if self.current is None:
            return self.originals[index](hidden_states, *args, **kwargs)
        bucket, tokens = self.current
        if index == 0:
            hidden_states = torch.nn.functional.pad(hidden_states, (0, 0, 0, bucket.table.size - tokens))
        hidden_states = bucket.graphed[index](hidden_states)
        if index == len(self.layers) - 1:
            self.current = None
            hidden_states = hidden_states[:, :tokens]
        return (hidden_states,)

    def _enter(self, hidden, args, kwargs):
        """At the first layer: the micro batch's (Bucket, tokens), its table loaded, or None to run it eagerly."""
        reason = self._why_eager(hidden, args, kwargs)
        if reason:
            self.eager[reason] += 1
            return None
        tokens, lengths = hidden.shape[1], kwargs["packed_seq_lengths"]
        key = (bucket_size(tokens), lengths.numel(), hidden.requires_grad)
        bucket = self.buckets.get(key)
        if bucket is None:
            reason = self._why_no_capture(key, hidden.shape[2])
            bucket = None if reason else self._capture(key, hidden, kwargs)
            if bucket is None:
                self.eager[reason or "the capture failed"] += 1
                return None
        if kwargs["position_embeddings"][0] is not bucket.rotary:
            self.eager["the rotary table changed since the capture"] += 1
            return None
        bucket.table.load(lengths, kwargs["position_ids"], tokens)
        self._own_gradients()
        self.replayed += 1
        return bucket, tokens

    def _own_gradients(self):
        """Give each trainable parameter of the layers without a gradient a zeroed one of nbddp's (see the module)."""
        if self.grads is None:
            self.grads = [torch.zeros_like(p) for p in self.parameters]
        fresh = []
        for parameter, grad in zip(self.parameters, self.grads):
            if parameter.grad is None:
                parameter.grad = grad
                fresh.append(grad)
        if fresh:
            torch._foreach_zero_(fresh)

    def _why_eager(self, hidden, args, kwargs):
        """Why this micro batch runs eagerly (the summary's words), or None."""
        if self.failed:
            return "the capture failed"
        if not (torch.is_grad_enabled() and self.layers[0].training) or torch.is_inference_mode_enabled():
            return "not training"
        if any(kwargs.get(name) is not None and kwargs.get(name) is not False for name in NOT_SET):
            return "a padded batch or a key-value cache"
        # Other keywords pass through to the attention (Trainer's num_items_in_batch, ...): a scalar is fixed at
        # capture, which the layers do not read; anything per token would be frozen, so that runs eagerly.
        frozen = [name for name in sorted(set(kwargs) - KEYWORDS)
                  if isinstance(kwargs[name], torch.Tensor) and kwargs[name].dim() > 0]
        if args or frozen:
            return f"arguments a graph would freeze ({', '.join(frozen) or 'positional'})"
        lengths, positions = kwargs.get("packed_seq_lengths"), kwargs.get("position_ids")
        if hidden.dim() != 3 or hidden.shape[0] != 1 or lengths is None or positions is None:
            return "not a padding-free micro batch"
        if hidden.device != lengths.device or hidden.device.type != self.device.type:
            return "its sequence table is not on its device"
        size = bucket_size(hidden.shape[1])
        rotary = kwargs.get("position_embeddings")
        if not rotary or rotary[0].shape[0] < size:  # the attention would build its own table, which may move
            return "no rotary table as long as the bucket"
        return None

    def _why_no_capture(self, key, hidden_size):
        """Why bucket `key`, not captured yet, is not captured now (the summary's words), or None."""
        if len(self.buckets) >= MAX_BUCKETS:
            return f"more than {MAX_BUCKETS} buckets"
        if self._free_bytes() < BUCKET_BYTES * len(self.layers) * hidden_size * key[0]:
            return "no GPU memory for another bucket"
        return None

    def _free_bytes(self):
        """GPU memory a capture can take: free on the device and held unused by the allocator (CPU: unbounded)."""
        if self.device.type != "cuda":
            return math.inf
        free, _ = torch.cuda.mem_get_info(self.device)
        return free + torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(self.device)

    def _capture(self, key, hidden, kwargs):
        """Capture every layer for bucket `key` = (size, sequences, input requires grad), its table loaded with the
        micro batch's; the new Bucket, or None after a failure, which turns the graphs off for the rest of the
        run."""
        size, sequences, input_grad = key
        started, reserved = time.monotonic(), self._reserved()
        try:
            hooked = _hooked(self.layers)
            if hooked:
                raise RuntimeError(f"{hooked} has hooks, which a graph would run once, at its capture")
            table = Table(size, sequences, hidden.device, kwargs["position_ids"].dtype)
            table.load(kwargs["packed_seq_lengths"], kwargs["position_ids"], hidden.shape[1])
            self.pin(table, hidden.device)
            keywords = dict(kwargs, position_ids=table.position_ids, packed_seq_lengths=table.seq_lengths)
            calls = [0]
            modules = tuple(_Layer(forward, layer, keywords, calls)
                            for forward, layer in zip(self.originals, self.layers))
            samples = tuple((torch.zeros(1, size, hidden.shape[2], dtype=hidden.dtype, device=hidden.device)
                             .requires_grad_(input_grad or index > 0),) for index in range(len(modules)))
            with _autocast_cache_off(), self.route_check(calls):
                graphed = self.make_graphed(modules, samples, num_warmup_iters=3, pool=self.pool)
        except Exception as error:  # any failure: eager from now on, said once, the run goes on
            self.failed = f"{type(error).__name__}: {error}"
            _say(f"warning: CUDA graphs off from here: capturing the bucket of {size} tokens and {sequences} "
                 f"sequences failed ({self.failed[:500]}); the layers run eagerly")
            self.buckets.clear()
            gc.collect()  # a graphed module's forward closes over the module: a cycle
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            return None
        self.capture_s += time.monotonic() - started
        self.captured_gib += (self._reserved() - reserved) / 2 ** 30
        bucket = self.buckets[key] = Bucket(table, graphed, kwargs["position_embeddings"][0])
        return bucket

    def _reserved(self):
        return torch.cuda.memory_reserved(self.device) if self.device.type == "cuda" else 0

    def summary(self) -> str:
        """One line: micro batches replayed of all, the buckets, their capture time and memory, why others ran
        eagerly."""
        sizes = sorted({size for size, _, _ in self.buckets})
        total = self.replayed + sum(self.eager.values())
        eager = "; eager: " + ", ".join(f"{count} ({reason})" for reason, count in self.eager.items()) \
            if self.eager else ""
        span = f"{sizes[0]:,}-{sizes[-1]:,}" if len(sizes) > 1 else f"{sizes[0]:,}" if sizes else "none"
        return (f"CUDA graphs: {self.replayed} of {total} micro batches replayed; {len(self.buckets)} buckets captured "
                f"({span} tokens) in {self.capture_s:.1f} s, {self.captured_gib:.1f} GiB more GPU memory reserved "
                f"by the captures{eager}")


class GraphsReport(TrainerCallback):
    """Says at the end of training how the graphs served (`GraphedLayers.summary`)."""

    def __init__(self, graphs: GraphedLayers):
        self.graphs = graphs

    def on_train_end(self, args, state, control, **kwargs):
        _say(self.graphs.summary())


def _hooked(layers):
    """The name of a module inside `layers` with forward or backward hooks (or "every module", for global ones), or
    None. A layer's own hooks run as ever: its call is not captured, only its forward."""
    from torch.nn.modules import module as torch_module

    if any(getattr(torch_module, name, None) for name in (
            "_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
            "_global_backward_pre_hooks")):
        return "every module"
    for index, layer in enumerate(layers):
        for name, module in list(layer.named_modules())[1:]:
            if module._forward_hooks or module._forward_pre_hooks or module._backward_hooks \
                    or module._backward_pre_hooks:
                return f"layer {index}'s {name}"
    return None


@contextlib.contextmanager
def _autocast_cache_off():
    """Capture under the autocast the micro batch runs in, without autocast's weight cache (a graph cannot keep
    it)."""
    was = torch.is_autocast_cache_enabled()
    torch.set_autocast_cache_enabled(False)
    try:
        yield
    finally:
        torch.set_autocast_cache_enabled(was)


def _say(text: str) -> None:
    if is_main_process():
        log.info(f"nbddp: {text}")
