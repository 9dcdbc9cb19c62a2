"""Transformers' optimizer names that cannot run everywhere: bitsandbytes' need bitsandbytes and a CUDA device
(`ddp.optimizer` trains AdamW without them), and no quantized one runs under FSDP (`fsdp.shardable_optimizer`
trains torch's of the same update)."""

# transformers.trainer_optimizer._BITSANDBYTES_OPTIMIZERS, each by Transformers' torch optimizer of the same update
# (None: Transformers has that update in bitsandbytes alone)
BITSANDBYTES_TORCH_UPDATE = {
    **dict.fromkeys(("adamw_bnb_8bit", "adamw_8bit", "paged_adamw_32bit", "paged_adamw_8bit"), "adamw_torch"),
    **dict.fromkeys(("rmsprop_bnb", "rmsprop_bnb_8bit", "rmsprop_bnb_32bit"), "rmsprop"),
    **dict.fromkeys(("ademamix", "ademamix_8bit", "paged_ademamix_32bit", "paged_ademamix_8bit", "lion_32bit",
                     "lion_8bit", "paged_lion_32bit", "paged_lion_8bit"), None),
}
BITSANDBYTES_OPTIMIZERS = frozenset(BITSANDBYTES_TORCH_UPDATE)
# every quantized optimizer of Transformers: bitsandbytes' and torchao's AdamW in 4 and 8 bits
QUANTIZED_TORCH_UPDATE = {**BITSANDBYTES_TORCH_UPDATE,
                          **dict.fromkeys(("adamw_torch_4bit", "adamw_torch_8bit"), "adamw_torch")}
