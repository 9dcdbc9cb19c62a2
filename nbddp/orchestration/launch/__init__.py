"""`launch`: the generated script under torchrun (or an sbatch script for SLURM), and what is said when it fails."""
