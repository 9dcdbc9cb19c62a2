"""nbddp: annotated fine-tuning notebooks -> one DDP-safe script that torchrun runs unchanged."""
