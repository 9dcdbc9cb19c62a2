"""nbddp's own parameters of a generated script, by name: the script settings of the table of run settings
(`run_settings`, which also writes the lines export appends to the script's parameters cell).

The names three rooms share (export writes them, the runtime reads them as flags, orchestration passes them);
standard library only, so orchestration imports it without the export room's libcst.
"""
from nbddp.formats.run_settings import script_parameters, setting

BACKEND = "backend"  # auto | unsloth | hf (runtime.backend)
RESUME = "resume"  # trainer.train() continues from the last complete checkpoint in output_dir
BATCH_LAYOUT = "batch_layout"  # how N processes share the notebook's batch (runtime.memory.batch_plan)
WORKDIR = "workdir"  # where the cells run, from the script's folder (runtime.working_directory)
STRATEGY = "strategy"  # ddp | fsdp | auto: a whole model per GPU, or sharded (runtime.trainer.fsdp, auto_strategy)
STRATEGIES = setting(STRATEGY).choices  # auto: ddp when the memory estimate fits one GPU, else fsdp

OWN_PARAMETERS = {entry.name: "nbddp" for entry in script_parameters()}  # name -> "defined in"
