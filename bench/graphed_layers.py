"""Can Unsloth's decoder layers train as CUDA graphs, and what would that save? A few layers of Llama-3.1 8B's
widths (random-init, 4-bit, LoRA r=16 on all seven projections, checkpointing off, nbddp's packed attention) over
one padding-free micro batch, forward and backward on one GPU: eagerly as Unsloth runs them, and replayed from
graphs that `torch.cuda.make_graphed_callables` captured at a bucket of BUCKET tokens, the micro batch padded up
to it with one more sequence whose gradient is zero (its own attention block: the real tokens never see it).

    python -m bench.graphed_layers --out $OUT/graphed_layers.json [--layers 4 --rounds 3]   (--layers 32: all of 8B's)

Per variant and round: `host_ms`, the time to issue one forward and backward of the layers; `drained_ms`, until
the GPU finished them; `launches` of one call (torch.profiler). `max_rel_diff`: graphed against eager, over the
real tokens' outputs and every LoRA gradient, each relative to the eager tensor's largest value. `other_lengths`:
the same for a micro batch of other lengths replayed from the same graphs, only the sequence table and positions
copied in (a bucket serves every micro batch that fits it with as many sequences: the table's size is captured,
and max_seqlen is captured as the bucket). `same_shapes_max_rel_diff`: graphed against the same padded micro
batch run eagerly, the graphs' own arithmetic (0 is a clean pass). `pool_gib`: memory the graphs keep reserved
between replays (what one bucket's saved activations cost). `eager_repeat_max_rel_diff`: the eager step against
itself, the yardstick for the differences. `buckets`: the layout a runtime would hold, graphs of each layer for two
buckets in one shared pool, replayed A, B, A (see `buckets`). `runtime`: nbddp's own lever
(`nbddp.runtime.graphed_layers`, the run setting `cuda_graphs`) under the model's forward with labels, losses and
gradients of accumulated micro batches against eager ones (see `runtime_check`). A stage that raises is recorded
with its error (and the error it happened during) instead of its figures, so a capture that fails says why. Needs
CUDA and Unsloth (the GPU image's) and nbddp's packed attention applying there; docs/performance.md weighs the lever
this measures.
"""
import argparse
import gc
import importlib.metadata
import itertools
import json
import platform
import statistics
import tempfile
import time
import traceback
from pathlib import Path

LENGTHS = (74, 164, 372, 120, 301, 201, 97, 181)  # 1,510 tokens: the median micro batch of the 8B layout runs
OTHER_LENGTHS = (955, 74, 69, 120, 66, 50, 40, 80)  # 1,454 tokens, the longest row among them
BUCKET = 1536
HIDDEN = 4096
# Two buckets of per-layer graphs in one pool: bucket -> the micro batch replayed there
BUCKETS = {1536: LENGTHS, 2048: (955, 164, 372, 120, 74, 97, 50, 40)}  # 1,510 and 1,872 tokens
# nbddp's runtime lever on the model's own forward: optimizer steps of micro batches, the first step's two of one
# bucket (1,510 and 1,496 tokens: accumulated gradients must add up), the second's of another
RUNTIME_STEPS = ((LENGTHS, (60, 301, 97, 372, 120, 164, 201, 181)), (BUCKETS[2048],))
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def padded(lengths, bucket):
    """The sequence table padded to `bucket` tokens with one more sequence, and every token's position in its
    sequence: (table, positions). A micro batch that does not fit the bucket is an error."""
    pad = bucket - sum(lengths)
    if pad < 1:
        raise ValueError(f"{sum(lengths)} tokens do not leave room for a padding sequence in a bucket of {bucket}")
    table = (*lengths, pad)
    return table, positions_of(table)


def positions_of(lengths):
    """Every token's position in its sequence, for sequences of `lengths` packed into one row."""
    return [position for length in lengths for position in range(length)]


def write_model(layers, out_dir):
    """A random-init Llama of 8B widths with `layers` layers (and a 32,000-token vocabulary) in `out_dir`."""
    from bench import materialize

    config = materialize.shape_config("llama3-8b")
    config.update(num_hidden_layers=layers, vocab_size=32000)
    materialize.write_weights(out_dir, config, seed=0)
    materialize.write_tokenizer(out_dir, config["max_position_embeddings"])


def load(torch, path):
    from unsloth import FastLanguageModel

    model, _ = FastLanguageModel.from_pretrained(str(path), max_seq_length=2048, load_in_4bit=True,
                                                 dtype=torch.bfloat16)
    model = FastLanguageModel.get_peft_model(model, r=16, target_modules=TARGETS, lora_alpha=16, lora_dropout=0,
                                             bias="none", use_gradient_checkpointing=False, random_state=3407)
    with torch.no_grad():  # lora_B starts at zero, which would leave lora_A's gradients zero: nothing to compare
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=0.02)
    model.train()
    return model


def layer_kwargs(torch, model, positions):
    """What Unsloth's Llama forward passes its first decoder layer for a padding-free micro batch whose tokens
    have these `positions` in their sequences (a forward pre-hook reads it; the model finds the sequences where
    the positions restart)."""
    seen = {}
    layers = model.base_model.model.model.layers

    def record(module, args, kwargs):
        seen.update(kwargs)
        raise _Seen

    handle = layers[0].register_forward_pre_hook(record, with_kwargs=True)
    ids = torch.full((1, len(positions)), 1, dtype=torch.long, device="cuda")
    try:
        with torch.no_grad():
            model(input_ids=ids, position_ids=torch.tensor([positions], device="cuda"))
    except _Seen:
        pass
    finally:
        handle.remove()
    missing = [key for key in ("packed_seq_lengths", "position_ids", "position_embeddings") if seen.get(key) is None]
    if missing:
        raise RuntimeError(f"Unsloth's Llama forward gave its first layer no {', '.join(missing)}: not the packed "
                           "path this bench measures")
    return seen


class _Seen(Exception):
    """Stops the model's forward once the first layer's arguments are read."""


def layer_modules(torch, model, kwargs):
    """Each decoder layer as a module of `hidden -> hidden` with the micro batch's other arguments fixed."""
    fixed = {key: value for key, value in kwargs.items() if key not in ("hidden_states",)}

    class Layer(torch.nn.Module):
        def __init__(self, layer):
            super().__init__()
            self.layer = layer

        def forward(self, hidden):
            return self.layer(hidden, **fixed)[0]

    return [Layer(layer) for layer in model.base_model.model.model.layers]


def layer_stack(torch, model, kwargs):
    """The decoder layers as one module of `hidden -> hidden` with the micro batch's other arguments fixed."""

    class Stack(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(layer_modules(torch, model, kwargs))

        def forward(self, hidden):
            for layer in self.layers:
                hidden = layer(hidden)
            return hidden

    return Stack()


def chain(graphed):
    """One call of `hidden -> hidden` through graphed layers in turn, as a model's layer loop calls them."""

    def call(hidden):
        for layer in graphed:
            hidden = layer(hidden)
        return hidden

    return call


def lora_parameters(model):
    return [p for name, p in model.named_parameters() if "lora_" in name and p.requires_grad]


def forward_backward(call, hidden, grad_out, parameters):
    for parameter in parameters:
        parameter.grad = None
    out = call(hidden)
    out.backward(grad_out)
    return out


def step(call, hidden, grad_out, parameters):
    """One forward and backward; (output, the LoRA gradients), copied out of any buffer a replay reuses."""
    out = forward_backward(call, hidden, grad_out, parameters)
    return out.detach().clone(), [parameter.grad.detach().clone() for parameter in parameters]


def timed(torch, call, hidden, grad_out, parameters):
    torch.cuda.synchronize()
    start = time.perf_counter()
    forward_backward(call, hidden, grad_out, parameters)
    issued = time.perf_counter()
    torch.cuda.synchronize()
    return (issued - start) * 1e3, (time.perf_counter() - start) * 1e3


def launches(torch, call, hidden, grad_out, parameters):
    """The launches (and copies) one forward and backward issues."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        forward_backward(call, hidden, grad_out, parameters)
        torch.cuda.synchronize()
    names = ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC", "cudaGraphLaunch",
             "cudaMemcpyAsync", "cudaMemsetAsync")
    return {event.key: event.count for event in prof.key_averages() if event.key in names}


def largest_difference(a, b, rows):
    """Largest |a - b| relative to b's largest value, over the first `rows` rows of the outputs and every
    gradient."""
    (out_a, grads_a), (out_b, grads_b) = a, b
    pairs = [(out_a[:, :rows], out_b[:, :rows]), *zip(grads_a, grads_b)]
    return max(float((x.float() - y.float()).abs().max() / y.float().abs().max().clamp_min(1e-30)) for x, y in pairs)


def capture_table(torch, packing, kwargs, bucket):
    """The tensors of the micro batch's sequence table that its layers read (Unsloth's packed-info cache entry
    for `kwargs`' lengths, made now if missing), with max_seqlen set to the bucket: an upper bound the varlen
    kernel accepts, so graphs captured with it serve every table of the bucket. Returns {"lengths", "cu_seqlens",
    "seq_lengths", "position_ids"}: what a replay's table is copied into."""
    seq_lengths = kwargs["packed_seq_lengths"]
    packing.get_packed_info_from_kwargs({"packed_seq_lengths": seq_lengths}, seq_lengths.device)
    entries = [entry for entry in packing._PACKED_INFO_CACHE.values() if entry["seq_lengths"] is seq_lengths]
    if len(entries) != 1:
        raise RuntimeError(f"{len(entries)} entries of Unsloth's packed-info cache hold this micro batch's table")
    lengths, cu_seqlens, _ = entries[0]["result"]
    entries[0]["result"] = (lengths, cu_seqlens, bucket)
    return {"lengths": lengths, "cu_seqlens": cu_seqlens, "seq_lengths": seq_lengths,
            "position_ids": kwargs["position_ids"]}


def load_table(torch, tensors, table, positions):
    """Copy the sequence table `table` and its `positions` into the captured tensors, in place."""
    tensors["lengths"].copy_(torch.tensor(table, dtype=tensors["lengths"].dtype))
    tensors["seq_lengths"].copy_(torch.tensor(table, dtype=tensors["seq_lengths"].dtype))
    tensors["cu_seqlens"].copy_(torch.tensor([0, *itertools.accumulate(table)], dtype=tensors["cu_seqlens"].dtype))
    tensors["position_ids"].copy_(torch.tensor([positions], dtype=tensors["position_ids"].dtype))


def micro_batch(torch, generator, bucket, lengths):
    """Random layer inputs of `bucket` tokens and output gradients that are zero past the real `lengths`' tokens
    (the padding sequence carries no loss): (hidden, grad_out)."""
    hidden = torch.randn(1, bucket, HIDDEN, device="cuda", dtype=torch.bfloat16, generator=generator)
    grad_out = torch.randn(1, bucket, HIDDEN, device="cuda", dtype=torch.bfloat16, generator=generator) * 1e-2
    grad_out[:, sum(lengths):] = 0
    return hidden, grad_out


def buckets(torch, packing, model, parameters, eager_for, rounds):
    """What a runtime replaying the model's own layer loop would hold: graphs of each layer, captured together per
    bucket of BUCKETS, both buckets in one memory pool (a micro batch's forward and backward end before the next
    one's start, so buckets never replay interleaved). Returns `pool_gib` after each capture (the pool is shared:
    the second figure is both), `max_rel_diff` of replays in the order A, B, A against the same micro batch run
    eagerly (bucket A replayed after B's capture and replay: whether B overwrote what A keeps), the `launches` of
    one replay, and `drained_ms`, the median replay and eager step over `rounds` rounds, interleaved."""
    pool = torch.cuda.graph_pool_handle()
    torch.cuda.synchronize()
    base = torch.cuda.memory_reserved()
    generator = torch.Generator(device="cuda").manual_seed(1)
    result, sets = {"pool_gib": {}, "max_rel_diff": [], "launches": {}, "drained_ms": {}}, {}
    for bucket, lengths in BUCKETS.items():
        table, positions = padded(lengths, bucket)
        kwargs = layer_kwargs(torch, model, positions)
        tensors = capture_table(torch, packing, kwargs, bucket)
        modules = layer_modules(torch, model, kwargs)
        samples = tuple((torch.randn(1, bucket, HIDDEN, device="cuda", dtype=torch.bfloat16, generator=generator)
                         .requires_grad_(index > 0),) for index in range(len(modules)))  # layer 0's input: no grad
        graphed = torch.cuda.make_graphed_callables(tuple(modules), samples, num_warmup_iters=3, pool=pool)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        result["pool_gib"][bucket] = (torch.cuda.memory_reserved() - base) / 2 ** 30
        hidden, grad_out = micro_batch(torch, generator, bucket, lengths)
        sets[bucket] = (chain(graphed), tensors, table, positions, hidden, grad_out, lengths)

    def replay(bucket):
        call, tensors, table, positions, hidden, grad_out, _ = sets[bucket]
        load_table(torch, tensors, table, positions)
        return call, hidden, grad_out

    first = next(iter(BUCKETS))
    for bucket in (*BUCKETS, first):
        lengths = sets[bucket][-1]
        replayed = step(*replay(bucket), parameters)
        reference = step(*eager_for(lengths, *sets[bucket][4:6]), parameters)
        result["max_rel_diff"].append([bucket, largest_difference(replayed, reference, sum(lengths))])
    for bucket in BUCKETS:
        lengths = sets[bucket][-1]
        result["launches"][bucket] = launches(torch, *replay(bucket), parameters)
        eager = eager_for(lengths, *sets[bucket][4:6])
        step(*eager, parameters)  # its sequence table cached again
        times = {"graphed": [], "eager": []}
        for round_ in range(rounds):
            for name in (("eager", "graphed") if round_ % 2 == 0 else ("graphed", "eager")):
                call = eager if name == "eager" else replay(bucket)
                times[name].append(timed(torch, *call, parameters)[1])
        result["drained_ms"][bucket] = {name: statistics.median(values) for name, values in times.items()}
    return result


def runtime_check(torch, model, parameters, rounds):
    """nbddp's runtime lever itself (`GraphedLayers` on the model's decoder layers) under the model's own forward with
    labels, each of RUNTIME_STEPS an optimizer step of micro batches accumulated. Returns `max_rel_diff` of its losses
    and LoRA gradients against the eager steps, `eager_repeat_max_rel_diff` (eager against itself, the yardstick),
    `padded_max_rel_diff` (against the steps run through the lever with its modules left eager: padded, pinned and cut
    back as it does, nothing replayed; the graphs' own share) and `padding_max_rel_diff` (those against the plain eager
    steps: what the padding alone changes), or `padded_error` where that reference failed, `drained_ms` of all the steps
    eagerly and then graphed (median over `rounds`; not interleaved: the layers stay graphed once they are), the losses,
    and the lever's own summary line. A micro batch the lever ran eagerly (a failed capture, a reason of its own) is an
    error, not a figure."""
    from nbddp.runtime import graphed_layers

    generator = torch.Generator(device="cuda").manual_seed(2)

    def micro_batch(lengths):  # as TRL's padding-free collator and Trainer hand it to the model
        ids = torch.randint(model.config.vocab_size, (1, sum(lengths)), device="cuda", generator=generator)
        return {"input_ids": ids, "position_ids": torch.tensor([positions_of(lengths)], device="cuda"),
                "labels": ids, "packed_seq_lengths": torch.tensor(lengths, dtype=torch.int32, device="cuda"),
                "num_items_in_batch": torch.tensor(sum(lengths) - len(lengths), device="cuda")}

    steps = [[micro_batch(lengths) for lengths in micro_batches] for micro_batches in RUNTIME_STEPS]

    def run(batches):
        for parameter in parameters:
            parameter.grad = None
        losses = []
        for batch in batches:
            loss = model(**batch).loss
            loss.backward()
            losses.append(float(loss))
        return losses, [parameter.grad.detach().clone() for parameter in parameters]

    def timed_steps():
        torch.cuda.synchronize()
        started = time.perf_counter()
        for batches in steps:
            run(batches)
        torch.cuda.synchronize()
        return (time.perf_counter() - started) * 1e3

    eager = [run(batches) for batches in steps]
    again = [run(batches) for batches in steps]
    eager_ms = statistics.median(timed_steps() for _ in range(rounds))
    layers = graphed_layers.decoder_layers(model)
    if not layers:
        raise RuntimeError("the model's decoder layers are not Unsloth's Llama ones, which the lever graphs")
    micro_batches = sum(len(batches) for batches in steps)
    padded = {}
    try:  # a reference only: its failure is recorded, the lever's check goes on
        padded["steps"] = lever_left_eager(graphed_layers, layers, torch.device("cuda"),
                                           lambda: [run(batches) for batches in steps], micro_batches)
    except Exception as error:
        padded["error"] = "".join(traceback.format_exception_only(error)).strip()[-2000:]
    graphs = graphed_layers.GraphedLayers(layers, torch.device("cuda"))
    graphed = [run(batches) for batches in steps]
    if graphs.failed or graphs.replayed != micro_batches:  # the lever falls back to eager quietly: not a pass
        raise RuntimeError(f"the lever replayed {graphs.replayed} of {micro_batches} micro batches: {graphs.summary()}"
                           + (f"; {graphs.failed}" if graphs.failed else ""))
    graphed_ms = statistics.median(timed_steps() for _ in range(rounds))
    return {"max_rel_diff": max(step_difference(a, b) for a, b in zip(graphed, eager)),
            "eager_repeat_max_rel_diff": max(step_difference(a, b) for a, b in zip(again, eager)),
            **({"padded_max_rel_diff": max(step_difference(a, b) for a, b in zip(graphed, padded["steps"])),
                "padding_max_rel_diff": max(step_difference(a, b) for a, b in zip(padded["steps"], eager))}
               if "steps" in padded else {"padded_error": padded["error"]}),
            "drained_ms": {"eager": eager_ms, "graphed": graphed_ms},
            "losses": {"eager": [losses for losses, _ in eager], "graphed": [losses for losses, _ in graphed]},
            "summary": graphs.summary()}


def lever_left_eager(graphed_layers, layers, device, run_steps, micro_batches, **lever_options):
    """`run_steps()` through nbddp's lever (`GraphedLayers(layers, device, **lever_options)`) with each bucket's
    "graphs" the eager layer modules it would capture (padded, pinned and cut back as it does, nothing replayed),
    then the layers' own forward again. An error unless every micro batch went through a bucket."""
    lever = graphed_layers.GraphedLayers(layers, device, make_graphed=lambda modules, samples, **options: modules,
                                         **lever_options)
    try:
        results = run_steps()
    finally:
        for layer in layers:  # the lever's instance attribute: the class's forward again
            vars(layer).pop("forward", None)
    if lever.failed or lever.replayed != micro_batches:
        raise RuntimeError(f"the eager lever took {lever.replayed} of {micro_batches} micro batches: "
                           f"{lever.summary()}")
    return results


def step_difference(a, b):
    """Largest difference of step a from step b: each loss relative to b's, each gradient relative to b's largest
    value."""
    (losses_a, grads_a), (losses_b, grads_b) = a, b
    return max([abs(x - y) / abs(y) for x, y in zip(losses_a, losses_b)]
               + [float((x.float() - y.float()).abs().max() / y.float().abs().max().clamp_min(1e-30))
                  for x, y in zip(grads_a, grads_b)])


def release_graphs(torch):
    """Give back the memory of graphs no longer referenced: a graphed module's forward closes over the module (a
    cycle, which only the collector frees)."""
    torch.cuda.synchronize()
    gc.collect()
    torch.cuda.empty_cache()


def stage(record, name, work):
    """Run `work()`, keeping its result; on an exception record it under `errors` and return None."""
    try:
        return work()
    except Exception as error:  # a bench of feasibility: the failure is the finding
        text = "".join(traceback.format_exception_only(error)).strip()
        if error.__context__ is not None:  # a failed capture ends in capture_end()'s error, the cause before it
            text += " (during: " + "".join(traceback.format_exception_only(error.__context__)).strip() + ")"
        record.setdefault("errors", {})[name] = text[-2000:]
        full = traceback.format_exc()  # the head holds the first error of a chain, the tail the last
        record.setdefault("tracebacks", {})[name] = full if len(full) <= 8000 else f"{full[:3000]}\n...\n{full[-5000:]}"
        return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--layers", type=int, default=4, help="decoder layers of 8B widths")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    import unsloth  # noqa: F401  (before torch's users, as in a notebook)
    import torch
    from unsloth.utils import packing

    from nbddp.runtime import packed_attention

    record = {"what": __doc__.split("\n\n")[0], "layers": args.layers, "bucket": BUCKET, "lengths": LENGTHS,
              "other_lengths": OTHER_LENGTHS, "device": torch.cuda.get_device_name(),
              "python": platform.python_version(),
              "versions": {name: importlib.metadata.version(name) for name in ("torch", "unsloth", "bitsandbytes")},
              "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

    def write():
        with open(args.out, "w") as out:
            json.dump(record, out, indent=1)

    write()
    record["packed_attention_patch"] = bool(packed_attention.use_varlen_kernel())
    if not record["packed_attention_patch"]:
        record["errors"] = {"packed_attention_patch": "nbddp's packed attention does not apply to this torch and "
                            "Unsloth: the layers would run Unsloth's attention once per sequence, which this bench "
                            "does not measure"}
        write()
        return 1

    def build():
        with tempfile.TemporaryDirectory() as folder:
            write_model(args.layers, Path(folder))
            return load(torch, folder)

    model = stage(record, "load", build)
    write()
    if model is None:
        return 1
    parameters = lora_parameters(model)
    generator = torch.Generator(device="cuda").manual_seed(0)
    hidden, grad_out = micro_batch(torch, generator, BUCKET, LENGTHS)
    real = sum(LENGTHS)

    def eager_for(lengths, hidden=hidden, grad_out=grad_out):
        stack = layer_stack(torch, model, layer_kwargs(torch, model, positions_of(lengths)))
        rows = sum(lengths)
        return stack, hidden[:, :rows].contiguous(), grad_out[:, :rows].contiguous()

    eager = stage(record, "eager", lambda: eager_for(LENGTHS))
    eager_result = stage(record, "eager_step", lambda: step(eager[0], *eager[1:], parameters)) if eager else None
    table_tensors, same_shapes = {}, {}

    def capture():
        captured_kwargs = layer_kwargs(torch, model, padded(LENGTHS, BUCKET)[1])
        table_tensors.update(capture_table(torch, packing, captured_kwargs, BUCKET))
        stack = layer_stack(torch, model, captured_kwargs)
        same_shapes["eager"] = step(stack, hidden, grad_out, parameters)  # the graphs' arithmetic, run eagerly
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        before = torch.cuda.memory_reserved()
        graphed = torch.cuda.make_graphed_callables(stack, (hidden,), num_warmup_iters=3)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # what is still reserved now, the graphs' pools hold
        record["pool_gib"] = (torch.cuda.memory_reserved() - before) / 2 ** 30
        return graphed

    graphed = stage(record, "capture", capture)
    write()
    graphed_result = stage(record, "graphed_step", lambda: step(graphed, hidden, grad_out, parameters)) \
        if graphed else None
    if graphed_result and eager_result:
        record["max_rel_diff"] = largest_difference(graphed_result, eager_result, real)
    if graphed_result and same_shapes:
        record["same_shapes_max_rel_diff"] = largest_difference(graphed_result, same_shapes["eager"], real)

    variants = {"eager": (eager[0], *eager[1:]) if eager else None,
                "graphed": (graphed, hidden, grad_out) if graphed else None}
    if variants["eager"]:  # capture replaced Unsloth's one cached sequence table: rebuild eager's before timing
        stage(record, "eager_warm_up", lambda: step(*variants["eager"], parameters))
    rounds = []
    for round_ in range(args.rounds):
        figures = {}
        for name in (("eager", "graphed") if round_ % 2 == 0 else ("graphed", "eager")):
            if variants[name] is None:
                continue
            host, drained = stage(record, f"{name}_timed", lambda: timed(torch, *variants[name], parameters)) \
                or (None, None)
            figures[name] = {"host_ms": host, "drained_ms": drained}
        rounds.append(figures)
        print(f"round {round_ + 1}: {json.dumps(figures)}", flush=True)
    record["rounds"] = rounds

    def median_of(name, key):
        values = [r[name][key] for r in rounds if name in r and r[name][key] is not None]
        return statistics.median(values) if values else None

    record["median"] = {name: {key: median_of(name, key) for key in ("host_ms", "drained_ms")}
                        for name in variants if variants[name]}
    record["launches"] = {name: stage(record, f"{name}_launches",
                                      lambda: launches(torch, *variants[name], parameters))
                          for name in variants if variants[name]}
    write()

    if graphed:  # the same graphs for a micro batch of other lengths: only the table and the positions change
        def other():
            load_table(torch, table_tensors, *padded(OTHER_LENGTHS, BUCKET))
            rows = sum(OTHER_LENGTHS)
            other_grad = grad_out.clone()
            other_grad[:, rows:] = 0  # this table's padding sequence
            replayed = step(graphed, hidden, other_grad, parameters)
            reference = step(*eager_for(OTHER_LENGTHS), parameters)
            return largest_difference(replayed, reference, rows)

        record["other_lengths_max_rel_diff"] = stage(record, "other_lengths", other)
    if eager:  # the yardstick for every difference above: the eager step against itself
        record["eager_repeat_max_rel_diff"] = stage(record, "eager_repeat", lambda: largest_difference(
            step(*variants["eager"], parameters), eager_result, real))
    write()
    graphed = variants = None  # the stack's graphs and their pool go before the buckets' are measured
    release_graphs(torch)
    record["buckets"] = stage(record, "buckets", lambda: buckets(torch, packing, model, parameters, eager_for,
                                                                  args.rounds))
    write()
    release_graphs(torch)
    record["runtime"] = stage(record, "runtime", lambda: runtime_check(torch, model, parameters, args.rounds))
    write()
    print(json.dumps({key: record.get(key) for key in ("median", "launches", "max_rel_diff", "same_shapes_max_rel_diff",
                                                         "other_lengths_max_rel_diff", "pool_gib", "buckets",
                                                         "runtime", "errors")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
