"""What nbddp adds to every Trainer under DDP: its patches and callbacks."""
