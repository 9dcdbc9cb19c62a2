"""nbddp: annotated fine-tuning notebooks -> one DDP-safe script that torchrun runs unchanged."""


def load_ipython_extension(ipython):
    """`%load_ext nbddp`: the `%nbddp` line magic (nbddp.orchestration.notebook_magic)."""
    from nbddp.orchestration import notebook_magic

    notebook_magic.load_ipython_extension(ipython)
