"""GPU benchmarks of the generated training script (see docs/performance.md)."""
