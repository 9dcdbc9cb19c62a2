"""The script's inputs, checked before work: flags, --set, data, model names, output folders."""
