"""The script's inputs, checked before work: flags, --set, data, output folders (model names: nbddp.model_names,
shared with the fallback)."""
