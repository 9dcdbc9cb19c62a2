"""Orchestration: smoke-run the generated script through papermill, launch it with torchrun, compare runs.

Everything heavy runs in child processes (a Jupyter kernel, torchrun), so this package never imports
torch and the parent process never initialises CUDA.
"""
