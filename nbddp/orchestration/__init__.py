"""Orchestration: smoke-run the generated script through papermill, launch it with torchrun, compare runs.

A folder per command: smoke/ (papermill, one device), launch/ (torchrun, or a SLURM job script), regress/ (the suite
against its baseline), project/ (`new`, run folders, result files); run.py is `run`, smoke then launch. The modules
here are what several commands read: the script's parameters and notebook, the children's environment, devices,
signals and console, metrics and plots; and the command line's flag spelling and the `%nbddp` magic.

Everything heavy runs in child processes (a Jupyter kernel, torchrun), so this package never imports
torch and the parent process never initialises CUDA.
"""
