"""Memory planning: the batch layout, the memory estimate, gradient checkpointing."""
