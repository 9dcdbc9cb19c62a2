"""DDP settings for a multimodal model whose tower adapters may get no gradient: a static graph, or the search.

Unsloth's notebooks often put LoRA on every `q_proj`, ... of a vision-language model (an explicit
`target_modules` list, or `finetune_vision_layers` left True), then train it on text: Gemma 4's and Ministral 3's
GRPO notebooks do. The vision (or audio) tower's adapters then never get a gradient. One process does not mind
(the optimizer skips them); DDP with `find_unused_parameters=False`, which nbddp sets because re-entrant
checkpointing (Unsloth's) refuses the search, fails at step 2 ("Expected to have finished reduction in the prior
iteration").

`patch_trainer(Trainer)` changes that for a trainer whose model has trainable parameters outside its language
model, unless the author set `ddp_static_graph` (Transformers 5's argument), by the trainer's
`gradient_accumulation_steps` when it prepares the model (after the batch layout):

- 1: `static_graph=True`, DDP's answer: it finds the unused parameters in the first step, leaves them out of every
  later all-reduce, and supports re-entrant checkpointing with unused parameters (torch's DistributedDataParallel
  docs). It assumes that the same parameters go unused in every step, which holds for a tower that all rows use or
  none does.
- more: `find_unused_parameters=True`, which DDP supports under `no_sync()` (the accumulation steps), where static
  graphs fail ("expect_autograd_hooks_ INTERNAL ASSERT FAILED", pytorch#143580; the fix, pytorch PR 187732, is
  open). It searches the autograd graph after every forward (slower) and refuses re-entrant checkpointing, which the
  Transformers+PEFT fallback does not use (non-reentrant by default) and Unsloth's "unsloth" mode may.

Rank 0 prints one line saying which and why.
"""
import functools

from nbddp import log, patches

# a tower's config; a speech model's codec (Sesame's CSM: LoRA on `q_proj` also reaches its Mimi codec, which
# encodes the audio without gradients)
MULTIMODAL_CONFIG_KEYS = ("vision_config", "audio_config", "codec_config")


def patch_trainer(trainer_class) -> None:
    """Make `trainer_class.__init__` choose DDP's settings for the models described above; twice is once."""
    def make(original):
        @functools.wraps(original)
        def __init__(self, *args, **kwargs):
            original(self, *args, **kwargs)
            if getattr(self.args, "ddp_static_graph", None) is None:
                outside = trainable_outside_language_model(self.model)
                if outside:
                    wrap_for_unused_parameters(self, outside)

        return __init__

    patches.wrap("unused-tower-adapters", trainer_class, "__init__", make)


def trainable_outside_language_model(model) -> list[str]:
    """Names of the trainable parameters of a multimodal `model` (its config has a vision, audio or codec config) that
    belong neither to its language model (`get_decoder()`, less a `codec_model`) nor to its input or output
    embeddings; [] otherwise."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not any(hasattr(base.config, key) for key in MULTIMODAL_CONFIG_KEYS):
        return []
    try:
        language = [base.get_decoder(), base.get_input_embeddings(), base.get_output_embeddings()]
    except (AttributeError, NotImplementedError):
        return []
    inside = {id(p) for module in language if module is not None for p in module.parameters()}
    codec = getattr(base, "codec_model", None)  # CSM's get_decoder() is the whole model, codec and all
    if codec is not None:
        inside -= {id(p) for p in codec.parameters()}
    return [name for name, p in model.named_parameters() if p.requires_grad and id(p) not in inside]


def wrap_for_unused_parameters(trainer, outside: list[str]) -> None:
    """Have `trainer`'s accelerator wrap the model in DDP, if it does, with `static_graph=True` when the trainer
    accumulates no gradients, else with `find_unused_parameters=True`, and say which on rank 0. Set as
    `prepare_model` runs: Transformers 4.x replaces the accelerator's DDP settings (`ddp_handler`) just before it
    prepares the model, and `--batch_layout auto` sets the accumulation at train(). (accelerate wraps one process
    that torchrun started in DDP too.)"""
    from accelerate.utils import DistributedDataParallelKwargs
    from torch.nn.parallel import DistributedDataParallel

    accelerator = trainer.accelerator
    prepare_model = accelerator.prepare_model

    @functools.wraps(prepare_model)
    def prepare(*args, **kwargs):
        accumulation = trainer.args.gradient_accumulation_steps
        if accelerator.ddp_handler is None:
            accelerator.ddp_handler = DistributedDataParallelKwargs()
        if accumulation == 1:
            accelerator.ddp_handler.static_graph = True
            how = ("static_graph=True, so those that get no gradient (a vision tower trained on text) are left out of "
                   "the all-reduce after step 1")
        else:
            accelerator.ddp_handler.find_unused_parameters = True
            how = (f"find_unused_parameters=True, so those that get no gradient (a vision tower trained on text) are "
                   f"found in every step; not static_graph, which torch fails under gradient accumulation "
                   f"({accumulation} steps here; pytorch#143580)")
        model = prepare_model(*args, **kwargs)
        if isinstance(model, DistributedDataParallel) and accelerator.is_main_process:
            log.info(f"nbddp: {len(outside)} trainable tensors lie outside the language model ({outside[0]}, ...): DDP "
                     f"runs with {how}")
        return model

    accelerator.prepare_model = prepare
