"""runtime.graphed_layers on CPU: the buckets, the sequence table a replay copies in, and the layers' calls routed
through a bucket (padded, cut back) giving the eager outputs and gradients. torch's graph capture is CUDA's: here
`make_graphed` hands the bucket's layers back uncaptured, or wrapped like torch's graphed callables (fixed output
and gradient buffers that each call overwrites), so the bucket's own table, padding and buffers are what run."""
import contextlib
import sys
import types

import pytest
import torch

from nbddp import patches
from nbddp.errors import UsageError
from nbddp.formats.run_settings import ENV
from nbddp.runtime import graphed_layers as gl


@pytest.fixture(autouse=True)
def _undo_patches():
    yield
    patches.undo()


class SequenceLayer(torch.nn.Module):
    """A stand-in for Unsloth's decoder layer: each token mixes in the running sum of the tokens before it in its own
    sequence (the table decides where sequences start) and its position."""

    def __init__(self, seed):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.weight = torch.nn.Parameter(torch.randn(4, 4, generator=generator) * 0.3)
        self.position_weight = torch.nn.Parameter(torch.randn(4, generator=generator) * 0.1)

    def forward(self, hidden_states, causal_mask=None, attention_mask=None, position_ids=None, past_key_value=None,
                output_attentions=False, use_cache=False, padding_mask=None, position_embeddings=None,
                packed_seq_lengths=None, **kwargs):
        chunks = torch.split(hidden_states, packed_seq_lengths.tolist(), dim=1)
        mixed = torch.cat([chunk.cumsum(dim=1) for chunk in chunks], dim=1)
        out = torch.tanh(mixed @ self.weight) + position_ids[..., None].float() * self.position_weight
        return (hidden_states + out,)


ROTARY = (torch.zeros(1024, 2), torch.zeros(1024, 2))  # Unsloth's cos and sin tables (unread here)


def model_of(count):
    layers = torch.nn.ModuleList([SequenceLayer(seed) for seed in range(count)])
    layers.train()
    return layers


def run(layers, lengths, hidden):
    """The model's layer loop over one padding-free micro batch of sequences of `lengths`."""
    seq_lengths = torch.tensor(lengths, dtype=torch.int32)
    positions = torch.tensor([[p for length in lengths for p in range(length)]])
    for layer in layers:
        hidden = layer(hidden, causal_mask=None, attention_mask=None, position_ids=positions, past_key_value=None,
                       output_attentions=False, use_cache=False, padding_mask=None, position_embeddings=ROTARY,
                       packed_seq_lengths=seq_lengths)[0]
    return hidden


def uncaptured(modules, samples, num_warmup_iters, pool):
    return modules


def buffered(modules, samples, num_warmup_iters, pool):
    """Like torch's graphed callables: each call's output and every gradient come back in the same buffers."""
    return tuple(Buffered(module) for module in modules)


class Buffered(torch.nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module, self.buffers_ = module, {}

    def forward(self, hidden):
        parameters = [p for p in self.module.parameters() if p.requires_grad]
        return _BufferedCall.apply(self, hidden, *parameters)


class _BufferedCall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, owner, hidden, *parameters):
        with torch.enable_grad():
            inputs = hidden.detach().requires_grad_(hidden.requires_grad)
            out = owner.module(inputs)
        ctx.owner, ctx.inputs, ctx.out, ctx.parameters = owner, inputs, out, parameters
        static = owner.buffers_.setdefault("out", torch.empty_like(out))
        static.copy_(out.detach())
        return static.detach()

    @staticmethod
    def backward(ctx, grad):
        wrt = ([ctx.inputs] if ctx.inputs.requires_grad else []) + list(ctx.parameters)
        grads = list(torch.autograd.grad(ctx.out, wrt, grad))
        statics = ctx.owner.buffers_.setdefault("grads", [torch.empty_like(g) for g in grads])
        for static, value in zip(statics, grads):
            static.copy_(value)
        returned = [static.detach() for static in statics]
        input_grad = returned.pop(0) if ctx.inputs.requires_grad else None
        return (None, input_grad, *returned)


def no_check(calls):
    return contextlib.nullcontext()


def graphs_of(layers, make_graphed=uncaptured):
    return gl.GraphedLayers(layers, torch.device("cpu"), make_graphed=make_graphed, pin=lambda table, device: None,
                            route_check=no_check)


def step(layers, lengths, hidden, grad):
    layers.zero_grad(set_to_none=True)
    out = run(layers, lengths, hidden)
    out.backward(grad)
    return out.detach().clone(), [p.grad.clone() for p in layers.parameters()]


def test_a_micro_batch_goes_to_the_next_bucket_with_room_for_padding():
    assert gl.bucket_size(1) == 256
    assert gl.bucket_size(255) == 256
    assert gl.bucket_size(256) == 512  # at least one padding token: the padding sequence is never empty
    assert gl.bucket_size(1510) == 1536


def test_a_table_load_writes_the_micro_batch_then_the_padding_sequence_in_place():
    table = gl.Table(size=8, sequences=2, device=torch.device("cpu"))
    storage = [t.data_ptr() for t in (table.seq_lengths, table.cu_seqlens, table.position_ids)]
    table.load(torch.tensor([3, 2], dtype=torch.int32), torch.tensor([[0, 1, 2, 0, 1]]), tokens=5)
    assert table.seq_lengths.tolist() == [3, 2, 3]
    assert table.cu_seqlens.tolist() == [0, 3, 5, 8]
    assert table.position_ids.tolist() == [[0, 1, 2, 0, 1, 0, 1, 2]]
    assert [t.data_ptr() for t in (table.seq_lengths, table.cu_seqlens, table.position_ids)] == storage
    table.load(torch.tensor([1, 1], dtype=torch.int32), torch.tensor([[0, 0]]), tokens=2)
    assert table.seq_lengths.tolist() == [1, 1, 6] and table.position_ids.tolist() == [[0, 0, 0, 1, 2, 3, 4, 5]]
    # a row padded past its sequences: the padding sequence covers its tail too, so every row is in a sequence
    table.load(torch.tensor([2, 2], dtype=torch.int32), torch.tensor([[0, 1, 0, 1, 0]]), tokens=5)
    assert table.seq_lengths.tolist() == [2, 2, 4] and table.cu_seqlens.tolist() == [0, 2, 4, 8]


def test_replayed_micro_batches_give_the_eager_outputs_and_gradients():
    layers = model_of(3)
    generator = torch.Generator().manual_seed(0)
    batches = [(lengths, torch.randn(1, sum(lengths), 4, generator=generator),
                torch.randn(1, sum(lengths), 4, generator=generator))
               for lengths in ((5, 60, 100), (7, 9), (40, 30, 100))]
    eager = [step(layers, *batch) for batch in batches]
    graphs = graphs_of(layers)
    replayed = [step(layers, *batch) for batch in batches]
    for (out, grads), (out_eager, grads_eager) in zip(replayed, eager):
        torch.testing.assert_close(out, out_eager)
        for grad, grad_eager in zip(grads, grads_eager):
            torch.testing.assert_close(grad, grad_eager)
    assert graphs.replayed == 3 and not graphs.eager
    assert sorted(graphs.buckets) == [(256, 2, False), (256, 3, False)]  # the third batch reused the first's bucket
    assert graphs.current is None


def test_layers_run_eagerly_outside_training_and_for_padded_batches():
    layers = model_of(2)
    graphs = graphs_of(layers)
    hidden = torch.randn(1, 6, 4)
    with torch.no_grad():
        run(layers, (3, 3), hidden)
    layers[0](hidden, attention_mask=torch.ones(1, 6), position_ids=torch.zeros(1, 6, dtype=torch.long),
              packed_seq_lengths=torch.tensor([6]))
    layers[0](torch.randn(2, 3, 4), position_ids=torch.zeros(2, 3, dtype=torch.long),
              packed_seq_lengths=torch.tensor([3]))
    layers[0](hidden, position_ids=torch.zeros(1, 6, dtype=torch.long), packed_seq_lengths=torch.tensor([6]),
              token_type_ids=torch.zeros(1, 6))
    assert graphs.replayed == 0 and not graphs.buckets
    assert graphs.eager == {"not training": 1, "a padded batch or a key-value cache": 1,
                            "not a padding-free micro batch": 1, "arguments a graph would freeze (token_type_ids)": 1}


def test_a_scalar_keyword_passes_through_to_the_captured_layers():
    layers = model_of(2)
    seen = []
    original = SequenceLayer.forward

    def forward(self, hidden_states, num_items_in_batch=None, **kwargs):
        seen.append(num_items_in_batch)
        return original(self, hidden_states, **kwargs)

    for layer in layers:
        layer.forward = forward.__get__(layer)
    graphs = graphs_of(layers)
    hidden = torch.randn(1, 6, 4, requires_grad=True)
    layers[0](hidden, position_ids=torch.zeros(1, 6, dtype=torch.long), packed_seq_lengths=torch.tensor([6]),
              position_embeddings=ROTARY, num_items_in_batch=torch.tensor(6))
    assert graphs.replayed == 1 and [int(n) for n in seen] == [6]
    assert list(graphs.buckets) == [(256, 1, True)]


def test_a_failed_capture_leaves_the_run_eager_and_says_so(caplog):
    layers = model_of(2)

    def failing(modules, samples, num_warmup_iters, pool):
        raise RuntimeError("operation not permitted when stream is capturing")

    graphs = graphs_of(layers, failing)
    hidden, grad = torch.randn(1, 6, 4), torch.randn(1, 6, 4)
    graphs_off = step(layers, (2, 4), hidden, grad)
    step(layers, (2, 4), hidden, grad)
    patches.undo()
    torch.testing.assert_close(graphs_off[0], step(layers, (2, 4), hidden, grad)[0])
    assert graphs.eager == {"the capture failed": 2} and graphs.replayed == 0
    assert "capturing the bucket of 256 tokens and 2 sequences failed (RuntimeError: operation not permitted" \
        in caplog.text
    assert "0 of 2 micro batches replayed" in graphs.summary()


def test_install_needs_the_setting_and_says_why_it_stays_off(monkeypatch, caplog):
    class Args:
        device = torch.device("cpu")

    trainer = type("T", (), {"args": Args(), "model": model_of(1)})()
    monkeypatch.delenv(ENV.CUDA_GRAPHS, raising=False)
    gl.install(trainer, "off")
    assert "CUDA graphs" not in caplog.text
    monkeypatch.setenv(ENV.CUDA_GRAPHS, "1")
    gl.install(trainer, "unsloth")
    gl.install(trainer, "off")
    assert "stay off: they need gradient checkpointing off, and it is unsloth" in caplog.text
    assert "stay off: they need CUDA, and this process trains on cpu" in caplog.text
    monkeypatch.setenv(ENV.CUDA_GRAPHS, "sometimes")
    with pytest.raises(UsageError, match="expected 1 or 0"):
        gl.install(trainer, "off")


def test_only_layers_whose_forward_is_unsloths_are_graphed():
    model = torch.nn.Module()
    model.layers = model_of(2)
    assert gl.decoder_layers(model) == []  # this test's layers: their forward is not Unsloth's
    unsloth_like = type("LlamaDecoderLayer", (SequenceLayer,), {})
    forward = lambda self, *args, **kwargs: SequenceLayer.forward(self, *args, **kwargs)  # noqa: E731
    forward.__module__ = "unsloth.models.gemma2"
    unsloth_like.forward = forward
    model.layers = torch.nn.ModuleList([unsloth_like(0), unsloth_like(1)])
    assert gl.decoder_layers(model) == []  # Gemma 2's layers take other keywords each
    forward.__module__ = "unsloth.models.llama"
    unsloth_like.forward = forward
    model.layers = torch.nn.ModuleList([unsloth_like(0), unsloth_like(1)])
    assert gl.decoder_layers(model) == list(model.layers)


def test_the_summary_names_buckets_memory_and_eager_reasons():
    graphs = graphs_of(model_of(1))
    graphs.replayed, graphs.eager["not training"] = 5, 1
    graphs.buckets = {(1024, 8, False): None, (2560, 8, False): None}
    graphs.capture_s, graphs.captured_gib = 3.25, 12.04
    assert graphs.summary() == ("CUDA graphs: 5 of 6 micro batches replayed; 2 buckets captured (1,024-2,560 "
                                "tokens) in 3.2 s, 12.0 GiB more GPU memory reserved by the captures; eager: 1 (not "
                                "training)")


def accumulate(layers, batches):
    """One optimizer step's gradients over micro batches (hidden, grad), as Trainer accumulates them."""
    layers.zero_grad(set_to_none=True)
    for lengths, hidden, grad in batches:
        run(layers, lengths, hidden).backward(grad)
    return [p.grad.clone() for p in layers.parameters()]


def test_accumulated_micro_batches_of_one_bucket_sum_their_gradients():
    # torch's graphs hand back gradients in buffers the next replay overwrites; adopted as .grad, the second micro
    # batch's would count twice (pytorch/pytorch#181723)
    layers = model_of(3)
    generator = torch.Generator().manual_seed(1)
    batches = [((50, 60), torch.randn(1, 110, 4, generator=generator), torch.randn(1, 110, 4, generator=generator)),
               ((30, 70), torch.randn(1, 100, 4, generator=generator), torch.randn(1, 100, 4, generator=generator))]
    eager = accumulate(layers, batches)
    graphs = graphs_of(layers, buffered)
    for _ in range(2):  # two optimizer steps: the gradients zeroed to None between them
        for grad, grad_eager in zip(accumulate(layers, batches), eager):
            torch.testing.assert_close(grad, grad_eager)
    assert graphs.replayed == 4 and list(graphs.buckets) == [(256, 2, False)]


def fake_unsloth(monkeypatch, **dispatch_names):
    utils = types.ModuleType("unsloth.utils")
    for name, value in dispatch_names.items():
        module = types.ModuleType(f"unsloth.utils.{name}")
        module.__dict__.update(value)
        setattr(utils, name, module)
        monkeypatch.setitem(sys.modules, f"unsloth.utils.{name}", module)
    monkeypatch.setitem(sys.modules, "unsloth", types.ModuleType("unsloth"))
    monkeypatch.setitem(sys.modules, "unsloth.utils", utils)
    return utils


def test_a_capture_where_a_layer_skips_the_varlen_kernel_fails(monkeypatch, caplog):
    utils = fake_unsloth(monkeypatch, attention_dispatch={"_varlen_attn_call": lambda hidden: hidden})
    layers = model_of(2)

    class VarlenLayer(SequenceLayer):
        def forward(self, hidden_states, **kwargs):
            return super().forward(utils.attention_dispatch._varlen_attn_call(hidden_states), **kwargs)

    varlen = torch.nn.ModuleList([VarlenLayer(0), VarlenLayer(1)]).train()
    gl.GraphedLayers(varlen, torch.device("cpu"), make_graphed=uncaptured, pin=lambda table, device: None)
    hidden, grad = torch.randn(1, 6, 4), torch.randn(1, 6, 4)
    step(varlen, (2, 4), hidden, grad)
    assert "capturing" not in caplog.text
    mixed = torch.nn.ModuleList([VarlenLayer(0), layers[1]]).train()
    graphs = gl.GraphedLayers(mixed, torch.device("cpu"), make_graphed=warmed_up, pin=lambda table, device: None)
    step(mixed, (2, 4), hidden, grad)
    assert graphs.failed == ("RuntimeError: 4 of 8 layer calls took an attention path other than Unsloth's varlen "
                             "kernel, which reads the sequence table on the host")
    assert utils.attention_dispatch._varlen_attn_call(3) == 3  # put back


def warmed_up(modules, samples, num_warmup_iters, pool):
    """Calls each module as torch's capture does (its warm-up calls and the capture's), then hands them back."""
    for module, args in zip(modules, samples):
        for _ in range(num_warmup_iters + 1):
            module(*args)
    return modules


def test_pinning_makes_unsloths_cache_entry_the_buckets_table(monkeypatch):
    cache = {}

    def get_packed_info_from_kwargs(kwargs, device):
        lengths = kwargs["packed_seq_lengths"]
        cu_seqlens = torch.cat([torch.zeros(1, dtype=torch.int32), lengths.cumsum(0, dtype=torch.int32)])
        cache[device] = {"seq_lengths": lengths, "result": (lengths, cu_seqlens, int(lengths.max()))}

    host = {}
    fake_unsloth(monkeypatch, packing={"get_packed_info_from_kwargs": get_packed_info_from_kwargs,
                                       "_PACKED_INFO_CACHE": cache, "_PACKED_HOST_LENGTHS_CACHE": host})
    table = gl.Table(size=8, sequences=2, device=torch.device("cpu"))
    table.load(torch.tensor([3, 2], dtype=torch.int32), torch.tensor([[0, 1, 2, 0, 1]]), tokens=5)
    gl.pin_in_unsloth(table, "cpu")
    lengths, cu_seqlens, max_seqlen = cache["cpu"]["result"]
    assert lengths is table.seq_lengths and cu_seqlens is table.cu_seqlens and max_seqlen == 8
    # Unsloth's host lengths, which choose its attention path: the bucket's size in two distinct lengths
    assert host[lengths.device] == (lengths, cu_seqlens, (1, 1, 6))
    table.load(torch.tensor([1, 1], dtype=torch.int32), torch.tensor([[0, 0]]), tokens=2)
    assert cu_seqlens.tolist() == [0, 1, 2, 8]  # a later micro batch's offsets, where the graphs read them


def test_the_rotary_table_memory_and_hooks_keep_a_micro_batch_eager(monkeypatch):
    layers = model_of(2)
    graphs = graphs_of(layers)
    hidden, grad = torch.randn(1, 6, 4), torch.randn(1, 6, 4)
    short = (torch.zeros(100, 2), torch.zeros(100, 2))  # shorter than the 256-token bucket
    layers[0](hidden, position_ids=torch.zeros(1, 6, dtype=torch.long), packed_seq_lengths=torch.tensor([6]),
              position_embeddings=short)
    monkeypatch.setattr(graphs, "_free_bytes", lambda: 64 * 2 * 4 * 256 - 1)  # one byte short of a bucket
    step(layers, (2, 4), hidden, grad)
    monkeypatch.undo()
    step(layers, (2, 4), hidden, grad)  # captured now
    layers[0](hidden, position_ids=torch.zeros(1, 6, dtype=torch.long), packed_seq_lengths=torch.tensor([2, 4]),
              position_embeddings=(ROTARY[0].clone(), ROTARY[1]))  # a table Unsloth rebuilt since
    assert graphs.replayed == 1 and graphs.eager == {
        "no rotary table as long as the bucket": 1, "no GPU memory for another bucket": 1,
        "the rotary table changed since the capture": 1}
    own_hook = model_of(2)
    own_hook[1].register_forward_hook(lambda module, args, out: out)  # runs at each call of the layer: fine
    with_own_hook = graphs_of(own_hook)
    step(own_hook, (2, 4), hidden, grad)
    assert with_own_hook.replayed == 1 and with_own_hook.failed is None
    hooked = model_of(2)
    hooked[1].norm = torch.nn.Identity()
    hooked[1].norm.register_forward_hook(lambda module, args, out: out)
    with_hooks = graphs_of(hooked)
    step(hooked, (2, 4), hidden, grad)
    assert with_hooks.failed == "RuntimeError: layer 1's norm has hooks, which a graph would run once, at its capture"


def test_a_model_trained_again_keeps_its_graphs(monkeypatch, caplog):
    class Args:
        device = torch.device("cpu")

    class Trainer:
        def __init__(self, model):
            self.args, self.model, self.callbacks = Args(), model, []

        def add_callback(self, callback):
            self.callbacks.append(callback)

    model = torch.nn.Module()
    model.layers = model_of(2)
    monkeypatch.setenv(ENV.CUDA_GRAPHS, "1")
    monkeypatch.setattr(gl, "_why_not", lambda trainer, mode, layers: None)
    monkeypatch.setattr(gl, "decoder_layers", lambda model: list(model.layers))
    first, second = Trainer(model), Trainer(model)
    gl.install(first, "off")
    gl.install(second, "off")
    assert first.callbacks[0].graphs is second.callbacks[0].graphs is model.nbddp_graphed_layers
    assert caplog.text.count("decoder layers' forward and backward replay from graphs") == 1
    assert model.nbddp_graphed_layers.originals[0].__func__ is SequenceLayer.forward  # not a router around one
