"""nbddp command line: turn the stage notebooks into one DDP-safe script and run it.

`nbddp` once installed (`python -m nbddp`), `python pipeline.py` in a clone; the same subcommands:

    python pipeline.py export [--notebooks notebooks] [--out generated] [--check] [--force]
    python pipeline.py smoke [-p NAME VALUE]... [-f params.yaml] [--set NAME=VALUE]... [--batch-layout L]
                             [--strategy S] [--device N|cpu] [--timeout S] [-q|-v]
    python pipeline.py launch [--nproc-per-node N|auto] [--nnodes M --node-rank R --rdzv-endpoint HOST:PORT]
                              [--max-restarts N] [--set NAME=VALUE]... [--batch-layout L] [--dry-run] [-q|-v]
                              [-- SCRIPT FLAGS]
    python pipeline.py launch --slurm [--nodes N] [--gpus-per-node G] [--cpus-per-node C] [--job-name NAME]
                              [--time T] [--partition P] [--max-restarts N] [-o train.sbatch] [-- SCRIPT FLAGS]
    python pipeline.py run [launch options] [-p NAME VALUE]... [-f params.yaml] [--set NAME=VALUE]... [--batch-layout L]
                           [--strategy S] [-q|-v]
    python pipeline.py regress [--suite regress.yaml] [--only NAME] [--set NAME=VALUE]... [--update-baseline]

Each subcommand parses its flags and calls the library; bad input exits 2 with the error's message. The options
that are run settings (every option but export's, new's, launch's --dry-run and SLURM group, and regress's own)
come from nbddp.formats.run_settings, the table that says which command takes which.
"""
import argparse
import importlib.metadata
import logging
import os
import sys
import textwrap

from nbddp import log
from nbddp.errors import NbddpError, UsageError
from nbddp.formats import run_settings
from nbddp.orchestration import flag_spelling
from nbddp.orchestration.launch.launch import LaunchOptions, job_script_args, launch
from nbddp.orchestration.launch.slurm import DEFAULT_JOB_SCRIPT, SlurmOptions, write_job_script
from nbddp.orchestration.project.new_project import new_project
from nbddp.orchestration.regress.regress import regress
from nbddp.orchestration.run import run
from nbddp.orchestration.smoke.smoke import smoke


DEFAULT_SCRIPT = run_settings.setting("script").default


class HelpFormatter(argparse.HelpFormatter):
    """argparse's, but an option's help never breaks inside a flag or a value (`--batch-` / `layout`, `1e-` / `4`),
    and a description's or epilog's line that starts with two spaces (a table's row) is kept as it is."""

    def _split_lines(self, text, width):
        return textwrap.wrap(self._whitespace_matcher.sub(" ", text).strip(), width, break_on_hyphens=False)

    def _fill_text(self, text, width, indent):
        fill = super()._fill_text
        return "\n".join(indent + line if line.startswith("  ") else fill(line, width, indent)
                         for line in text.splitlines())


class ArgumentParser(argparse.ArgumentParser):
    """argparse's, but a mistake is one paragraph (UsageError, exit 2) that names the command's --help, not its usage
    block."""

    def error(self, message):
        raise UsageError(f"{message} (see `{command_prog(self.prog)} --help`)")


def command_prog(prog) -> str:
    """How a user types the command argparse calls `prog`: `python pipeline.py run`, `nbddp run`."""
    return f"python {prog}" if prog.split()[0].endswith(".py") else prog


def add_new_command(subcommands) -> None:
    command = subcommands.add_parser(
        "new",
        formatter_class=HelpFormatter,
        help="write a starter project (stage notebooks, data, a tiny model) into a new folder",
        description="Write nbddp's default job into DIR, a new or empty folder, as a project to run and then make "
                    "your own: notebooks/ (three stage notebooks with their jupytext .py pairs), data/, "
                    "models/tiny-llama/ and generated/train.py exported from them.",
        epilog="then: cd DIR && nbddp run   (about a minute on two CPU cores; nothing is downloaded). Put your own "
               "notebooks in notebooks/ as stages 01_<name>.ipynb, 02_<name>.ipynb, ... and run `nbddp export`.",
    )
    command.add_argument("directory", metavar="DIR", help="the folder to create (or an empty one)")
    command.set_defaults(run=run_new)


def run_new(args) -> int:
    script = new_project(args.directory)
    print(f"wrote the starter project into {args.directory}: notebooks/, data/, models/tiny-llama/, {script.parent.name}/"
          f"\nnext: cd {args.directory} && nbddp run")
    return 0


class ExportHelp(argparse._HelpAction):
    """export's -h: its epilog lists every rewrite, which loads the export room (libcst, jupytext: seconds), so it is
    built only when asked for, not for every command's parser."""

    def __call__(self, parser, namespace, values, option_string=None):
        from nbddp.export.help import export_epilog

        parser.epilog = export_epilog()
        super().__call__(parser, namespace, values, option_string)


def add_export_command(subcommands) -> None:
    command = subcommands.add_parser(
        "export",
        help="write generated/train.py (and its source map) from the stage notebooks",
        description="Export notebooks/NN_*.ipynb, in name order, to one DDP-safe script for torchrun.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        add_help=False,
    )
    command.add_argument("-h", "--help", action=ExportHelp, help="show this help message, every cell tag and rewrite, "
                                                                 "and exit")
    command.add_argument("--notebooks", default="notebooks", help="folder of the stage notebooks (default: notebooks)")
    command.add_argument("--out", default="generated", help="folder to write train.py into (default: generated)")
    command.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if the generated files are not what export writes"
    )
    command.add_argument("--force", action="store_true", help="overwrite a train.py that was edited by hand")
    command.set_defaults(run=run_export)


def run_export(args) -> int:
    from nbddp.export import export  # the export room: libcst and jupytext, for this command only

    result = export(args.notebooks, args.out, check=args.check, force=args.force)
    if not args.check:
        print(result.report.text(result.script_path.as_posix()))
        return 0
    if result.stale:
        stale = "\n".join(f"  {line}" for line in result.stale)
        print(f"generated files are stale; run `python pipeline.py export`:\n{stale}", file=sys.stderr)
        return 1
    print(f"{args.out} is up to date with {args.notebooks}")
    return 0


def add_settings(command, verb, skip=()) -> None:
    """The options `verb` takes from the table of run settings (run_settings.for_command), in its order: each one
    not added yet, but those named in `skip`. A script parameter's option defaults to None: the script's own default
    then applies (a script exported by an older nbddp may lack the parameter)."""
    added = {action.dest for action in command._actions}
    parameters = run_settings.script_parameters()
    for entry in run_settings.for_command(verb):
        if entry.name in skip or entry.destination() in added:
            continue
        if entry.name == "log_level":
            add_log_options(command)
            continue
        default = None if entry in parameters else list(entry.default) if entry.action == "append" else entry.default
        command.add_argument(*entry.option_strings(), dest=entry.destination(), action=entry.action, nargs=entry.nargs,
                             type=int if entry.type == "int" else None, metavar=entry.metavar, default=default,
                             help=entry.help_for(verb))


def add_log_options(command) -> None:
    """-q/-v: the level of nbddp's own messages, here and in the processes it starts (the run setting `log_level`)."""
    levels = command.add_mutually_exclusive_group()
    levels.add_argument("-q", "--quiet", dest="log_level", action="store_const", const=logging.WARNING,
                        help="warnings, errors and the result only: no progress or info lines (run: the "
                             "workers' stdout goes to its logs/ only)")
    levels.add_argument("-v", "--verbose", dest="log_level", action="store_const", const=logging.DEBUG,
                        help="more: a progress line for every logged training step")


def launch_options(args) -> LaunchOptions:
    return LaunchOptions(args.nproc_per_node, args.nnodes, args.node_rank, args.rdzv_endpoint, args.rdzv_id,
                         args.max_restarts)


# Flags that only torchrun on this machine uses, and flags that only the SLURM job script uses: their defaults,
# so that a flag given in the wrong mode is refused rather than ignored.
TORCHRUN_ONLY = {name: run_settings.setting(name).default
                 for name in ("nproc_per_node", "node_rank", "rdzv_endpoint", "rdzv_id")} | {"dry_run": False}
SLURM_ONLY = {"gpus_per_node": None, "cpus_per_node": None, "job_name": None, "time": None, "partition": None,
              "output": None}


def refuse_flags(args, defaults, why) -> None:
    given = [f"--{name.replace('_', '-')}" for name, default in defaults.items() if getattr(args, name) != default]
    if given:
        raise UsageError(f"{', '.join(given)}: not used {why}")


def slurm_options(args) -> SlurmOptions:
    given = {name: getattr(args, name) for name in SLURM_ONLY if name != "output" and getattr(args, name) is not None}
    return SlurmOptions(nodes=args.nnodes, max_restarts=args.max_restarts, **given)


def add_smoke_command(subcommands) -> None:
    command = subcommands.add_parser(
        "smoke",
        formatter_class=HelpFormatter,
        help="run the generated script once as a notebook (papermill), a few steps on one device",
        description="Smoke-run the generated script through papermill; results in runs/<UTC time>-smoke/.",
        epilog="The run directory holds train.ipynb (the executed notebook, outputs included; named after the "
               "script), train.html, "
               "params.json (the injected parameters), metrics.jsonl, cells.stdout.log / cells.stderr.log (what "
               "the cells printed) and papermill.stderr.log. A failing cell is reported at its source notebook, "
               "cell and line; exit status 1, or 2 for bad input nbddp caught (a missing data file, say).\n"
               + flag_spelling.parameters_help(DEFAULT_SCRIPT, "smoke"),
    )
    add_settings(command, "smoke")
    command.set_defaults(run=run_smoke)


def run_smoke(args) -> int:
    smoke(args.script, args.param, args.params_file, args.device, args.timeout, overrides=args.overrides,
          batch_layout=args.batch_layout, strategy=args.strategy)
    return 0


def add_launch_command(subcommands) -> None:
    command = subcommands.add_parser(
        "launch",
        formatter_class=HelpFormatter,
        help="run the generated script under torchrun",
        description="Launch the generated script with torchrun (gloo on CPU, NCCL on GPUs); exits with its status.",
        epilog=flag_spelling.parameters_help(DEFAULT_SCRIPT, "launch"),
    )
    add_settings(command, "launch", skip=("log_level",))
    command.add_argument("--dry-run", action="store_true", help="print the command and environment, run nothing")
    add_settings(command, "launch")
    slurm = command.add_argument_group("SLURM", "write an sbatch script instead of running (one torchrun per node)")
    slurm.add_argument("--slurm", action="store_true", help="write the job script; --nodes sets the node count")
    slurm.add_argument("--gpus-per-node", type=int, metavar="G", help="GPUs, and so workers, per node (default: 1)")
    slurm.add_argument("--cpus-per-node", type=int, metavar="C", help="CPUs for each node's workers (default: SLURM's, often 1)")
    slurm.add_argument("--job-name", metavar="NAME", help="the job's name (default: nbddp)")
    slurm.add_argument("--time", metavar="T", help="time limit, e.g. 04:00:00 (default: the partition's)")
    slurm.add_argument("--partition", metavar="P", help="partition to run in (default: the cluster's)")
    slurm.add_argument("-o", "--output", metavar="PATH", help=f"where to write the script; never overwritten (default: {DEFAULT_JOB_SCRIPT})")
    command.add_argument("script_args", nargs="*", metavar="-- SCRIPT FLAGS", help="flags for the script, after --")
    command.set_defaults(run=run_launch)


def run_launch(args) -> int:
    if args.slurm:
        refuse_flags(args, TORCHRUN_ONLY, "with --slurm (SLURM places the processes: use --nodes and --gpus-per-node)")
        script_args = job_script_args(args.script_args, args.overrides, args.batch_layout, args.strategy)
        write_job_script(args.script, script_args, slurm_options(args), args.output or DEFAULT_JOB_SCRIPT)
        return 0
    refuse_flags(args, SLURM_ONLY, "without --slurm")
    return launch(args.script, args.script_args, launch_options(args), dry_run=args.dry_run, overrides=args.overrides,
                  batch_layout=args.batch_layout, strategy=args.strategy)


def add_run_command(subcommands) -> None:
    command = subcommands.add_parser(
        "run",
        formatter_class=HelpFormatter,
        help="export check, smoke run, then torchrun, and a summary",
        description="Check generated/ is fresh, smoke-run it, launch it with torchrun, summarise; "
                    "stops at the first failure. Results in runs/<UTC time>-run/.",
        epilog=flag_spelling.parameters_help(DEFAULT_SCRIPT, "run"),
    )
    add_settings(command, "run")
    command.set_defaults(run=run_pipeline)


def run_pipeline(args) -> int:
    run(args.script, args.param, args.params_file, launch_options(args), args.device, args.timeout,
        overrides=args.overrides, batch_layout=args.batch_layout, strategy=args.strategy)
    return 0


def add_regress_command(subcommands) -> None:
    command = subcommands.add_parser(
        "regress",
        formatter_class=HelpFormatter,
        help="run the regression suite and compare with its baseline",
        description="Run the suite's cases, compare with <suite>_baseline.json, report in runs/<UTC time>-regress/.",
    )
    command.add_argument("--suite", default="regress.yaml", help="suite file (default: %(default)s)")
    command.add_argument("--only", metavar="NAME", help="run only this case")
    command.add_argument("--update-baseline", action="store_true", help="store this run's figures as the baseline")
    add_settings(command, "regress")
    command.set_defaults(run=run_regress)


def run_regress(args) -> int:
    regress(args.suite, args.only, args.update_baseline, overrides=args.overrides)
    return 0


WORKFLOW = """\
install (a clone's path, or git+URL):
  CPU: pip install --extra-index-url https://download.pytorch.org/whl/cpu /path/to/nbddp-clone
                                              torch's CPU build, no CUDA packages
  GPU: pip install '/path/to/nbddp-clone[unsloth]'
                                              with Unsloth (PyPI's Linux torch wheels are CUDA builds)

the usual flow:
  nbddp new DIR                               a starter project to try it on: notebooks, data, a tiny model
  python pipeline.py export                   notebooks/ -> generated/train.py, with a report of every rewrite
  python pipeline.py smoke -p max_steps 3     run that script once as a notebook on one device (papermill)
  python pipeline.py launch -- --max_steps 500
                                              the same script under torchrun, one process per GPU (2 on CPU)
  python pipeline.py run                      export check -> smoke -> launch -> summary and loss plot
  python pipeline.py run --set learning_rate=1e-4 --batch-layout per-device
                                              any training argument, and how N processes share the batch
  python pipeline.py regress                  the regression suite against its committed baseline
  torchrun --nproc_per_node 4 generated/train.py --help
                                              every notebook parameter as a typed flag

Each subcommand has its own --help. Bad input exits 2 and names the notebook, cell and line (or the flag)."""


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog=os.path.basename(sys.argv[0]) if sys.argv[0].endswith("pipeline.py") else "nbddp",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=WORKFLOW,
    )
    parser.add_argument("--version", action="version", version=f"nbddp {version()}")
    subcommands = parser.add_subparsers(dest="command", required=True)
    add_new_command(subcommands)
    add_export_command(subcommands)
    add_smoke_command(subcommands)
    add_launch_command(subcommands)
    add_run_command(subcommands)
    add_regress_command(subcommands)
    return parser


def version() -> str:
    """The installed distribution's version (an editable install counts)."""
    try:
        return importlib.metadata.version("nbddp")
    except importlib.metadata.PackageNotFoundError:  # the source tree on sys.path, not installed
        return "unknown (not installed)"


def parse(parser, argv) -> argparse.Namespace:
    """argparse's reading of `argv`; an option the command does not take is a UsageError saying what it probably
    meant (flag_spelling), the command corrected in it."""
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        words = list(argv)
        words.remove(args.command)
        command = flag_spelling.Command(command_prog(parser.prog), args.command, words)
        raise UsageError(flag_spelling.unknown_options(command, unknown, verb_options(parser),
                                                       getattr(args, "script", DEFAULT_SCRIPT)))
    return args


def verb_options(parser) -> dict:
    """{verb: the option strings it takes} for each subcommand of `parser`."""
    verbs = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction)).choices
    return {verb: [option for action in command._actions for option in action.option_strings]
            for verb, command in verbs.items()}


def main(argv=None) -> int:
    """Run one subcommand; returns the exit status: 2 for a bad flag (one paragraph, the command corrected in it)."""
    level = log.logger.level
    try:
        args = parse(build_parser(), sys.argv[1:] if argv is None else argv)
        if getattr(args, "log_level", None) is not None:
            log.set_level(args.log_level)
        return args.run(args)
    except NbddpError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_status
    finally:
        log.set_level(level)  # main() called again in this process (tests) starts from the same level

