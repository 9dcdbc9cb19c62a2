"""What the example notebooks need beyond the runtime: `tiny_model.ensure_weights`, which builds the weights of the
tiny test models the repository keeps as config and tokenizer alone (models/). Standard library at import time."""
