"""nbddp's run settings and environment variables: one table, which everything else reads.

A setting is a value a run takes: a parameter of every generated script (`backend`, `batch_layout`, ...), an option
of the commands (`--strategy`, `--set`, `--device`, ...), or a variable in a child process's environment
(`NBDDP_MAX_STEPS`, ...). SETTINGS holds each once: its type and default, the commands that take it, the
NBDDP_ variable that carries it (if any) and what it does. From it come the lines export appends to a script's
parameters cell (`script_parameters`), the options of `smoke`, `run`, `launch` and `regress` (nbddp.cli), the names
the runtime and orchestration read and set (`ENV.MAX_STEPS`, `setting("timeout_s").default`) and the table in
docs/settings.md (`markdown`). No other file of nbddp spells an NBDDP_ name, in code, docstrings or comments: they
say "the run setting `max_steps`", or the option a user types (tests/formats/test_run_settings.py).
Standard library only: every room reads it.
"""
import os
from dataclasses import dataclass
from types import SimpleNamespace

PREFIX = "NBDDP_"
SCRIPT = "script"  # the generated script's own flags: `python generated/train.py --strategy fsdp`
COMMANDS = (SCRIPT, "smoke", "run", "launch", "regress")


@dataclass(frozen=True)
class Setting:
    """One setting. `commands`: those of COMMANDS that take it as an option (SCRIPT: a parameter of every generated
    script, its line in the parameters cell `name = default  # comment`); `env`: the variable that carries it to
    a kernel or a worker, `set_by` and `read_by` saying who writes and who reads it. The command options are
    `flags` (default `--name-with-dashes`) with argparse's `dest`, `metavar`, `action`, `nargs`; `flag_help` is
    their --help text (`{scope}`: a command's words from `scopes`)."""

    name: str
    type: str  # how its text reads: str, int, float, bool, path, NAME=VALUE
    default: object
    help: str  # what it does, one line
    commands: tuple = ()
    env: str = ""
    set_by: str = ""
    read_by: str = ""
    choices: tuple = ()
    comment: str = ""  # the script parameter's comment, when it differs from `help`
    flags: tuple = ()
    dest: str = ""
    metavar: object = None
    action: str | None = None
    nargs: int | None = None
    flag_help: str = ""
    scopes: tuple = ()  # (command, words its --help adds at `{scope}`)

    def option_strings(self) -> tuple:
        return self.flags or (f"--{self.name.replace('_', '-')}",)

    def destination(self) -> str:
        return self.dest or self.name

    def help_for(self, command: str) -> str:
        return (self.flag_help or self.help).replace("{scope}", dict(self.scopes).get(command, ""))


TORCHRUN_COMMANDS = ("run", "launch")  # torchrun's world: the commands that start it

SETTINGS = (
    # the commands' options, in the order of their --help
    Setting("script", "path", "generated/train.py", "the generated script", commands=("smoke", "run", "launch"),
            flag_help="the generated script (default: %(default)s)"),
    Setting("nproc_per_node", "str", "auto", "processes on this node; auto = one per visible GPU, or 2 CPU processes "
            "without GPUs", commands=TORCHRUN_COMMANDS),
    Setting("nnodes", "int", 1, "number of nodes (default: 1)", commands=TORCHRUN_COMMANDS,
            flags=("--nnodes", "--nodes")),
    Setting("node_rank", "int", 0, "this node's rank, 0..nnodes-1", commands=TORCHRUN_COMMANDS),
    Setting("rdzv_endpoint", "str", None, "HOST:PORT every node reaches (needed with --nnodes > 1)",
            commands=TORCHRUN_COMMANDS),
    Setting("rdzv_id", "str", "nbddp", "job id, the same on every node", commands=TORCHRUN_COMMANDS,
            flag_help="job id, the same on every node (default: %(default)s)"),
    Setting("max_restarts", "int", 0, "restart all workers up to N times after a failure; they resume from the last "
            "checkpoint (default: 0)", commands=TORCHRUN_COMMANDS, metavar="N"),
    Setting("param", "NAME VALUE", (), "override a notebook parameter; VALUE is typed like its default (repeatable)",
            commands=("smoke", "run"), flags=("-p", "--param"), action="append", nargs=2, metavar=("NAME", "VALUE")),
    Setting("params_file", "path", None, "YAML file of parameter overrides (-p wins over it)",
            commands=("smoke", "run"), flags=("-f", "--params-file")),
    Setting("device", "str", None, "the one device the smoke run sees: a GPU index or cpu (default: the first "
            "GPU, else cpu)", commands=("smoke", "run")),
    Setting("timeout", "int", 1800, "seconds each notebook cell of the smoke run may run", commands=("smoke", "run"),
            flag_help="seconds each notebook cell may run (default: %(default)s)"),
    Setting("set", "NAME=VALUE", (), "override a keyword of the training arguments the notebook builds; repeatable",
            commands=(SCRIPT, "smoke", "run", "launch", "regress"), env="NBDDP_SET",
            set_by="--set of the commands and of the script; regress's `set:`", read_by="runtime (training_overrides)",
            dest="overrides", action="append", metavar="NAME=VALUE", scopes=(("regress", " in every case, over the "
                                                                                         "case's own `set:`"),),
            flag_help="override a keyword of the training arguments the notebook builds (TrainingArguments, "
                      "SFTConfig, GRPOConfig, ...){scope}, typed as Transformers types that field and checked before "
                      "anything runs; repeatable; e.g. --set learning_rate=1e-4 --set bf16=false"),
    # nbddp's parameters of every generated script, in the order of its parameters cell
    Setting("backend", "str", "auto", "Unsloth's API for the cells: unsloth itself, hf (nbddp.fallback, on "
            "Transformers+PEFT), or auto: unsloth given CUDA and the package", commands=(SCRIPT,),
            choices=("auto", "unsloth", "hf"),
            comment="auto | unsloth | hf"),
    Setting("resume", "bool", False, "continue from the last complete checkpoint in output_dir", commands=(SCRIPT,)),
    Setting("batch_layout", "str", "notebook", "how the processes share the batch (README)",
            commands=(SCRIPT, "smoke", "run", "launch"), choices=("notebook", "per-device", "auto", "N"),
            comment="notebook | per-device | auto | N: how the processes share the batch (README)",
            metavar="{notebook,per-device,auto}",
            flag_help="how N processes share the notebook's batch: notebook (the script's default) keeps its global "
                      "batch (per_device_train_batch_size x gradient_accumulation_steps) by dividing the "
                      "accumulation; per-device is classic DDP, each process runs the notebook's per-device settings, "
                      "so the global batch grows N times; auto keeps the global batch in the fullest micro batch that "
                      "fits each GPU, with the cheapest gradient checkpointing that fits (a number B: micro batch B, "
                      "the global batch kept); e.g. --batch-layout per-device"),
    Setting("strategy", "str", "auto", "a whole model per GPU, sharded across them, or by the memory estimate",
            commands=(SCRIPT, "smoke", "run", "launch"), choices=("ddp", "fsdp", "auto"),
            comment="ddp | fsdp | auto: a whole model per GPU, sharded across them, or by the memory estimate",
            metavar="{ddp,fsdp,auto}",
            flag_help="how the model lies on the GPUs: ddp keeps a whole model on every GPU (the fastest; Unsloth's "
                      "kernels); fsdp shards it across them (Transformers+PEFT under accelerate's FSDP2), for a 16- or "
                      "32-bit model one GPU cannot hold (GPUs only); auto (the script's default) takes ddp when the "
                      "memory estimate says one process fits its GPU, else fsdp, and says which and why; e.g. "
                      "--strategy fsdp"),
    Setting("workdir", "path", "", "where the cells run, from the script's folder; export writes the notebooks' "
            "folder", commands=(SCRIPT,),
            comment="where the cells run, from this script's folder: the notebooks', as in Jupyter"),
    Setting("log_level", "str", "INFO", "the level of nbddp's own messages: -q WARNING, -v DEBUG",
            commands=("smoke", "run", "launch"), flags=("-q", "--quiet", "-v", "--verbose"), env="NBDDP_LOG_LEVEL",
            choices=("DEBUG", "INFO", "WARNING", "ERROR"), set_by="smoke, run, launch (-q, -v)",
            read_by="nbddp.log, in every process"),
    # carried in the environment only
    Setting("max_steps", "int", None, "training stops after at most this many steps, whatever the notebook says",
            env="NBDDP_MAX_STEPS", set_by="smoke (its steps, 3 unless -p max_steps); the user",
            read_by="runtime (ddp.max_steps)"),
    Setting("output_dir", "path", None, "the training arguments' output_dir, for a script without an output_dir "
            "parameter", env="NBDDP_OUTPUT_DIR", set_by="smoke, run (their run folder); the user",
            read_by="runtime (ddp.output_dir, the output_dir preflight); run's summary; launch's failure report"),
    Setting("timeout_s", "float", 1800, "seconds the process group's collectives wait for a slow rank",
            env="NBDDP_TIMEOUT_S", set_by="launch (its default, unless set); the user",
            read_by="runtime (the process group)"),
    Setting("hang_s", "float", 300, "seconds a worker may go without a heartbeat before launch kills it as hung; "
            "0: never", env="NBDDP_HANG_S", set_by="the user", read_by="launch (hang_watch)"),
    Setting("heartbeat_dir", "path", None, "the folder where each worker's heartbeat file is touched",
            env="NBDDP_HEARTBEAT_DIR", set_by="launch (a private folder)", read_by="runtime (reporting.heartbeat)"),
    Setting("min_free_gib", "float", 1.0, "GiB the output_dir's disk must have free before training; 0: not checked",
            env="NBDDP_MIN_FREE_GIB", set_by="the user", read_by="runtime (inputs.preflight)"),
    Setting("smoke_dir", "path", None, "the smoke run's folder: what the notebook saves lands there, nothing is "
            "pushed", env="NBDDP_SMOKE_DIR", set_by="smoke", read_by="runtime (smoke_sandbox, working_directory)"),
    Setting("progress_file", "path", None, "where a smoke run's kernel writes its training progress lines",
            env="NBDDP_PROGRESS_FILE", set_by="smoke (notebook_run)", read_by="runtime (reporting.progress)"),
    Setting("per_process", "NAME=VALUE", None, "the batch keywords the command line gave, per process",
            env="NBDDP_PER_PROCESS", set_by="smoke; the script's flags", read_by="runtime (memory.batch_plan)"),
    Setting("plan_processes", "int", None, "lay the batch out for this many processes on one (the layout check)",
            env="NBDDP_PLAN_PROCESSES", set_by="smoke's layout check", read_by="runtime (memory.batch_plan)"),
    Setting("layout_check", "path", None, "train the smoke steps in both layouts, their metrics into this file",
            env="NBDDP_LAYOUT_CHECK", set_by="smoke's layout check", read_by="runtime (memory.smoke_layout_check)"),
    Setting("cuda_graphs", "bool", False, "under --batch_layout auto with checkpointing off, Unsloth's decoder layers "
            "replay from CUDA graphs, each micro batch padded to a 256-token bucket (experimental: 1.8x a step on "
            "an 8B notebook, about 1 s to capture each bucket; docs/performance.md)", env="NBDDP_CUDA_GRAPHS",
            set_by="the user; the layout bench's LAYOUT_B_ENV",
            read_by="runtime (graphed_layers)"),
    Setting("one_launch_optimizer", "bool", False, "bitsandbytes' 8-bit AdamW updates the tensors whose sizes are "
            "multiples of 256 in one launch a step over flat copies, the same arithmetic as one launch a tensor "
            "(experimental: bit for bit equal and 10x less host time on a GPU bench, not yet seen in a training "
            "run; docs/performance.md)", env="NBDDP_ONE_LAUNCH_OPTIMIZER",
            set_by="the user; the layout bench's LAYOUT_B_ENV", read_by="runtime (trainer.one_launch_optimizer)"),
    Setting("cache", "path", "~/.cache/nbddp/models", "where the example notebooks' tiny model weights are built",
            env="NBDDP_CACHE", set_by="the user", read_by="nbddp.examples.tiny_model"),
    Setting("sweep_urls", "JSON", None, "the notebook sweep's URL stand-ins: {url: [local file, content type]}",
            env="NBDDP_SWEEP_URLS", set_by="tools/notebook_sweep.py (standin_urls)",
            read_by="tools/standin_hook/sitecustomize.py"),
)

_BY_NAME = {entry.name: entry for entry in SETTINGS}
ON, OFF = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")  # a bool setting's values (`switch`)
# ENV.MAX_STEPS == "NBDDP_MAX_STEPS": every variable's name, for the modules that set or read it
ENV = SimpleNamespace(**{entry.env.removeprefix(PREFIX): entry.env for entry in SETTINGS if entry.env})


def setting(name: str) -> Setting:
    """The setting called `name`; KeyError for one the table lacks."""
    return _BY_NAME[name]


def env_name(name: str) -> str:
    """The NBDDP_ variable that carries setting `name`."""
    return setting(name).env


def switch(name: str) -> bool:
    """Whether the bool setting `name` is on in this process's environment (1, true, yes, on; unset, 0, false, no,
    off: off); any other value is a UsageError that names the variable and the setting."""
    from nbddp.errors import UsageError

    variable = env_name(name)
    text = os.environ.get(variable, "").strip().lower()
    if text not in ON + OFF:
        raise UsageError(f"{variable}={text!r}: expected 1 or 0 (on or off): the run setting `{name}`, "
                         f"{setting(name).help.split(' (')[0]}")
    return text in ON


def for_command(command: str) -> tuple:
    """The settings `command` (one of COMMANDS) takes, in the table's order."""
    return tuple(entry for entry in SETTINGS if command in entry.commands)


def script_parameters() -> tuple:
    """The parameters nbddp adds to every generated script: the SCRIPT settings that no variable carries (`--set`
    is a flag of the script's too, but goes to its variable, never into the script's globals)."""
    return tuple(entry for entry in for_command(SCRIPT) if not entry.env)


def script_parameter_lines(workdir: str) -> tuple:
    """The lines export appends to a script's parameters cell: `# nbddp`, then `name = default  # comment` for each
    of `script_parameters`; `workdir`: the default of `workdir`, a JSON string (the notebooks' folder from the
    script's)."""
    lines = ["# nbddp"]
    for entry in script_parameters():
        value = workdir if entry.name == "workdir" else _literal(entry.default)
        lines.append(f"{entry.name} = {value}  # {entry.comment or entry.help}")
    return tuple(lines)


def _literal(value) -> str:
    return f'"{value}"' if isinstance(value, str) else repr(value)


def markdown() -> str:
    """docs/settings.md: the settings that are options, then the environment variables."""
    lines = ["# Run settings and environment variables", "",
             "Generated from `nbddp/formats/run_settings.py` (`markdown()`); tests/formats/test_run_settings.py "
             "checks this page is what it renders. `script`: a flag of the generated script "
             "(`python generated/train.py --strategy fsdp`), a parameter of its parameters cell.", "",
             "## Options", "",
             "| setting | type | default | taken by | option | what it does |",
             "| --- | --- | --- | --- | --- | --- |"]
    for entry in SETTINGS:
        if entry.commands:
            flags = ", ".join(f"`{flag}`" for flag in entry.option_strings())
            lines.append(f"| `{entry.name}` | {_type(entry)} | {_default(entry.default)} | "
                         f"{', '.join(entry.commands)} | {flags} | {entry.help} |")
    lines += ["", "## Environment variables", "",
              "| variable | type | default | set by | read by | what it does |",
              "| --- | --- | --- | --- | --- | --- |"]
    for entry in SETTINGS:
        if entry.env:
            lines.append(f"| `{entry.env}` | {_type(entry)} | {_default(entry.default)} | {entry.set_by} | "
                         f"{entry.read_by} | {entry.help} |")
    return "\n".join(lines) + "\n"


def _type(entry: Setting) -> str:
    return " \\| ".join(entry.choices) if entry.choices else entry.type


def _default(value) -> str:
    return "unset" if value in (None, ()) else f"`{value!r}`"
