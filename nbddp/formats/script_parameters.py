"""nbddp's own parameters of a generated script: the names and the lines export appends to its parameters cell.

One home for a contract three rooms share (export writes them, the runtime reads them as flags, orchestration
passes them); standard library only, so orchestration imports it without the export room's libcst.
"""
BACKEND = "backend"  # auto | unsloth | hf (runtime.backend)
RESUME = "resume"  # trainer.train() continues from the last complete checkpoint in output_dir
BATCH_LAYOUT = "batch_layout"  # how N processes share the notebook's batch (runtime.batch_plan)
WORKDIR = "workdir"  # where the cells run, from the script's folder (runtime.working_directory)
STRATEGY = "strategy"  # ddp | fsdp | auto: a whole model per GPU, or sharded (runtime.trainer.fsdp, auto_strategy)
STRATEGIES = ("ddp", "fsdp", "auto")  # auto: ddp when the memory estimate fits one GPU, else fsdp

NBDDP_PARAMETERS = {name: "nbddp" for name in (BACKEND, RESUME, BATCH_LAYOUT, STRATEGY, WORKDIR)}  # name -> "defined in"

# Appended after the stages' parameters; `{workdir}`: the notebooks' folder from the script's, as a JSON string.
NBDDP_PARAMETER_LINES = (
    "# nbddp",
    f'{BACKEND} = "auto"  # auto | unsloth | hf',
    f"{RESUME} = False  # continue from the last complete checkpoint in output_dir",
    f'{BATCH_LAYOUT} = "notebook"  # notebook | per-device | auto | N: how the processes share the batch (README)',
    f'{STRATEGY} = "auto"  # ddp | fsdp | auto: a whole model per GPU, sharded across them, or by the memory estimate',
    f"{WORKDIR} = {{workdir}}  # where the cells run, from this script's folder: the notebooks', as in Jupyter",
)
