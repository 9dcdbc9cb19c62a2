"""How a run on N processes lays out the batch the notebook's training arguments describe.

A notebook's arguments describe the run it trains on one device: micro batch B (`per_device_train_batch_size`)
times accumulation A (`gradient_accumulation_steps`), B x A rows per optimizer step. `--batch_layout`:

    notebook     (default) the same B x A rows per step on N processes: B x A/N x N when N divides A, else the
                 fullest exact split b x a x N = B x A with b <= B, else the nearest global batch, with a warning
    per-device   classic DDP: every process runs B x A, so the global batch is N times the notebook's
    auto         as notebook, then the fullest micro batch that fits the GPU (fuller_batch.py, at train())
    <b>          as auto, with micro batch b per process (accumulation B x A / (N x b)): the layout a smoke run
                 proved (`pipeline.py run --batch-layout auto`)

Values given on the command line (the script's `--per_device_train_batch_size 2` and `--gradient_accumulation_steps
2` flags, or `--set`) are per-process values, as in every Hugging Face script: they are kept on each process
under any layout (`auto` and `<b>` still make the micro batch fuller at train(), keeping the rows per process),
and the plan line says "(command line)". Only values the notebook wrote describe its one-device run. The script
learns which values came from its command line through the run setting `per_process` (`NAME=VALUE` lines: its flags'
parser sets it, and `pipeline.py` for the kernel of a smoke run); a `--set` line always comes from it.

A one-process run can lay out the batch for N processes (the run setting `plan_processes`, N: what the smoke run's
layout check sets): it runs each of its optimizer steps as the N processes would, its one device taking all N shares
in turn (accumulation x N), so its losses are the N-process run's.

The learning rate and schedule are never changed: under `per-device` they apply to an N times larger batch.
No torch here: planning is arithmetic, tested without a process group.
"""
import dataclasses
import os

from nbddp.errors import UsageError
from nbddp.formats.run_settings import ENV

LAYOUTS = ("notebook", "per-device", "auto")
BATCH_KEYWORDS = ("per_device_train_batch_size", "gradient_accumulation_steps")
PER_PROCESS = ENV.PER_PROCESS  # the batch keywords the command line gave, as `NAME=VALUE` lines (module)


@dataclasses.dataclass(frozen=True)
class BatchPlan:
    """One config's layout: what this run does per process, and what the notebook wrote."""

    layout: str  # "notebook" | "per-device" | "auto" | "<b>" (the --batch_layout value)
    micro_batch: int
    accumulation: int  # per process, as `processes` processes run it
    processes: int  # that the layout is for
    notebook_micro_batch: int  # as the config was given them: the notebook's, or the command line's (below)
    notebook_accumulation: int
    warning: str | None = None  # set when the global batch differs from the notebook's without being asked to
    running: int | None = None  # processes that run it, when fewer than `processes` (plan_processes)
    command_line: tuple[str, ...] = ()  # the BATCH_KEYWORDS given on the command line: per-process values

    @property
    def accumulation_here(self) -> int:
        """The accumulation each running process uses: its share of the planned processes' micro batches."""
        return self.accumulation * self.processes // (self.running or self.processes)

    @property
    def fuller(self) -> bool:
        """The layout is made fuller at train() (fuller_batch): auto, or a micro batch given."""
        return self.layout == "auto" or self.layout.isdigit()

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.accumulation * self.processes

    @property
    def notebook_global_batch(self) -> int:
        return self.notebook_micro_batch * self.notebook_accumulation

    def describe(self) -> str:
        """`global batch 8 rows = 2 per device x 2 accumulation x 2 processes (the notebook: 2 x 4 x 1)`."""
        processes = f"{self.processes} process{'es' if self.processes != 1 else ''}"
        text = (f"global batch {self.global_batch} rows = {self.micro_batch} per device x {self.accumulation} "
                f"accumulation x {processes}")
        notebook = (self.notebook_micro_batch, self.notebook_accumulation)
        if self.command_line:
            text += f" ({self._command_line_source()})"
        elif notebook == (self.micro_batch, self.accumulation) and self.processes == 1 and not self.fuller:
            text += " (as the notebook)"
        else:
            text += f" (the notebook: {notebook[0]} x {notebook[1]} x 1; --batch_layout {self.layout})"
        if self.running and self.running != self.processes:
            text += (f", run here by {self.running} as {self.micro_batch} x {self.accumulation_here} "
                     f"({ENV.PLAN_PROCESSES}={self.processes})")
        return text

    def _command_line_source(self) -> str:
        """`command line`, or `gradient_accumulation_steps from the command line`, and what a fuller layout made of
        the given per-process values."""
        source = ("command line" if len(self.command_line) == len(BATCH_KEYWORDS)
                  else f"{self.command_line[0]} from the command line")
        given = (self.notebook_micro_batch, self.notebook_accumulation)
        if self.fuller or given != (self.micro_batch, self.accumulation):
            source += f": {given[0]} x {given[1]} per process; --batch_layout {self.layout}"
        return source

    def as_record(self) -> dict:
        """The plan as metrics.jsonl's `{"event": "batch_plan", ...}` line holds it."""
        return {"layout": self.layout, "micro_batch": self.micro_batch, "accumulation": self.accumulation,
                "processes": self.processes, "global_batch": self.global_batch,
                "notebook_micro_batch": self.notebook_micro_batch,
                "notebook_accumulation": self.notebook_accumulation, "warning": self.warning,
                "running": self.running or self.processes, "command_line": list(self.command_line)}


_built: list[BatchPlan] = []  # the plans ddp.training_args made in this process, newest last


def remember(plan_: BatchPlan) -> None:
    """Record `plan_` for `of`: trainers may rebuild the config they are given (below)."""
    _built.append(plan_)


def of(args) -> BatchPlan | None:
    """The plan of training arguments `args`: the one ddp.training_args kept on them, else (args rebuilt from
    `to_dict()`: Unsloth's trainers and nbddp's hf backend do so to take `max_seq_length=` and friends) the
    newest plan made whose per-process layout `args` has; None for arguments nbddp did not build. Kept on `args`."""
    found = getattr(args, "nbddp_batch_plan", None)
    if found is None and hasattr(args, "gradient_accumulation_steps"):
        layout = (getattr(args, "per_device_train_batch_size", None), args.gradient_accumulation_steps)
        found = next((p for p in reversed(_built) if (p.micro_batch, p.accumulation_here) == layout), None)
        if found is not None:
            args.nbddp_batch_plan = found
    return found


def parse_layout(value) -> str | int:
    """"notebook", "per-device", "auto", or a micro batch (an int) for a `--batch_layout` value."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    word = value.strip().lower() if isinstance(value, str) else None
    if word in LAYOUTS:
        return word
    if word is not None and word.isdigit() and int(word) >= 1:
        return int(word)
    raise UsageError(f"--batch_layout must be one of {', '.join(LAYOUTS)} or a micro batch size (a whole number "
                     f"from 1), not {value!r}")


def command_line_values(environ=None) -> dict[str, str]:
    """{batch keyword: its text} that the run setting `per_process` holds: the values the command line gave (see the
    module)."""
    environ = os.environ if environ is None else environ
    lines = (line.partition("=") for line in environ.get(PER_PROCESS, "").splitlines())
    return {name.strip(): text.strip() for name, equals, text in lines if equals and name.strip() in BATCH_KEYWORDS}


def per_process_environment(values: dict, environ=None) -> str:
    """The run setting `per_process` for this process or a child: what `environ` holds, with the BATCH_KEYWORDS among
    `values` (the command line's: flags or parameters given) set."""
    environ = os.environ if environ is None else environ
    given = command_line_values(environ) | {name: str(values[name]) for name in BATCH_KEYWORDS if name in values}
    return "\n".join(f"{name}={text}" for name, text in given.items())


def plan(micro_batch: int, accumulation: int, processes: int, layout, running: int | None = None,
         command_line=()) -> BatchPlan:
    """The layout of the notebook's `micro_batch` x `accumulation` on `processes` processes (see the module), run by
    `running` processes (default: as many); a micro batch `layout` is checked here and applied at train().
    `command_line`: the BATCH_KEYWORDS whose values the command line gave: then both are per-process values."""
    layout = parse_layout(layout)
    command_line = tuple(name for name in BATCH_KEYWORDS if name in command_line)
    if running is not None and (running < 1 or processes % running):
        raise UsageError(f"{ENV.PLAN_PROCESSES}={processes}: {running} running processes cannot take equal shares")
    for name, value in (("per_device_train_batch_size", micro_batch), ("gradient_accumulation_steps", accumulation)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise UsageError(f"{name}={value!r}: nbddp lays out the batch from whole numbers from 1")
    notebook = dict(processes=processes, notebook_micro_batch=micro_batch, notebook_accumulation=accumulation,
                    running=running if running != processes else None, command_line=command_line)
    if layout == "per-device":
        return BatchPlan("per-device", micro_batch, accumulation, **notebook)
    if command_line:  # per-process values, as in Hugging Face's scripts
        if isinstance(layout, int) and (micro_batch * accumulation) % layout:
            raise UsageError(f"--batch_layout {layout}: the command line's {micro_batch} x {accumulation} rows per "
                             f"process are not a whole number of micro batches of {layout}")
        return BatchPlan(str(layout), micro_batch, accumulation, **notebook)
    rows = micro_batch * accumulation
    if isinstance(layout, int):
        if rows % (processes * layout):
            raise UsageError(f"--batch_layout {layout}: the notebook's global batch of {rows} rows ({micro_batch} x "
                             f"{accumulation}) is not a whole number of micro batches of {layout} on {processes} "
                             f"process{'es' if processes != 1 else ''}; use --batch_layout notebook or auto")
        layout = str(layout)  # the notebook's split now; fuller_batch takes micro batch `layout` at train()
    if accumulation % processes == 0:
        return BatchPlan(layout, micro_batch, accumulation // processes, **notebook)
    if rows % processes == 0:
        per_process = rows // processes
        fullest = max(b for b in range(1, min(micro_batch, per_process) + 1) if per_process % b == 0)
        return BatchPlan(layout, fullest, per_process // fullest, **notebook)
    b, a = min(((b, max(1, round(rows / (processes * b)))) for b in range(1, micro_batch + 1)),
               key=lambda split: (abs(split[0] * split[1] * processes - rows), -split[0]))
    nearest = b * a * processes
    warning = (f"the notebook's global batch of {rows} rows ({micro_batch} x {accumulation}) does not split over "
               f"{processes} processes; training with {nearest} rows per step ({b} x {a} x {processes}) under the "
               f"notebook's learning rate and schedule. For the notebook's training, make "
               "per_device_train_batch_size x gradient_accumulation_steps a multiple of the process count "
               "(--set NAME=VALUE) or run on a process count that divides it; --batch_layout per-device keeps the "
               "notebook's per-device settings instead")
    return BatchPlan(layout, b, a, **notebook, warning=warning)


def one_gpu_grpo_micro_batch(micro_batch: int, accumulation: int, num_generations: int | None,
                             generation_batch_size: int | None, steps_per_generation: int | None) -> int:
    """The micro batch a GRPO notebook trains with on one GPU: Unsloth's GRPOConfig raises it to num_generations
    when micro x accumulation is not a multiple of it and neither generation setting is given
    (unsloth/models/rl.py, `check_num_generations`); the notebook's own otherwise."""
    if not num_generations or generation_batch_size or steps_per_generation:
        return micro_batch
    return micro_batch if (micro_batch * accumulation) % num_generations == 0 else num_generations


def generation_batch_problem(plan_: BatchPlan, num_generations: int | None, generation_batch_size: int | None,
                             steps_per_generation: int | None) -> str | None:
    """What to say when GRPO's generation batch under `plan_` is not a multiple of `num_generations` (TRL refuses
    it); None when it is, or when the config is not GRPO's."""
    if not num_generations:
        return None
    per_step = plan_.micro_batch * plan_.processes
    generation = generation_batch_size or per_step * (steps_per_generation or plan_.accumulation)
    if generation % num_generations == 0:
        return None
    if plan_.layout == "per-device":
        advice = "or use --batch_layout notebook, which keeps the notebook's generation batch"
    else:  # only a nearest split changes the generation batch: the notebook's did not divide over the processes
        advice = (f"or make per_device_train_batch_size x gradient_accumulation_steps a multiple of the "
                  f"{plan_.processes} processes (--set NAME=VALUE), or use --batch_layout per-device")
    return (f"GRPO's generation batch would be {generation} completions ({plan_.describe()}), not a multiple of "
            f"num_generations={num_generations}: set num_generations to a divisor of {generation}, {advice}")
