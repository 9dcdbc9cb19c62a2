"""What a run reports: metrics, progress, heartbeats, tracebacks, display()."""
