"""An excepthook for generated scripts: the usual traceback, then the notebook cell the failing line came from.

    [rank 1] Traceback (most recent call last):
    [rank 1]   File "generated/train.py", line 57, in <module>
    ...
    [rank 1] nbddp: generated/train.py line 57 comes from notebooks/03_train.ipynb, cell 4, line 2

Bad input the runtime detects (an `NbddpError`: a data row missing a field, a model that is not there)
is the user's to fix, not a bug: it is reported as one paragraph without a traceback, and the process
exits with the error's status (2):

    nbddp: error: data/x.jsonl row 17: missing "output"
      generated/train.py line 61 comes from notebooks/01_data_prep.ipynb, cell 9, line 3

A rank whose collective failed because another rank's process ended (it stopped on bad input in a
`main_process_first` block, say) reports where it waited, in one line, not a traceback through the barrier:

    nbddp: stopped: another rank ended while this one waited for it (RuntimeError: [...] Connection closed by peer ...)

An error whose cause under DDP (or on an offline machine) is known gets a line saying what to do (`HINTS`), and so
does a missing package (`missing_module_hint`: export leaves out the notebook's `!pip install` cell):

    nbddp: hint: under DDP every trainable parameter must get a gradient in every step; ...

The `[rank R]` prefix appears only when torchrun started more than one process, so interleaved reports
from several ranks stay readable. Under torchrun the same report also goes to this rank's error file
(`TORCHELASTIC_ERROR_FILE`), which torchrun's failure summary and nbddp's failure report read.
"""
import atexit
import builtins
import json
import os
import sys
import time
import traceback

from nbddp import patches
from nbddp.errors import NbddpError, lost_peer
from nbddp.formats.sourcemap import SourceMap, SourceMapError, sourcemap_path

# (text of the exception, what to do): causes that DDP, or the machine a script is moved to, adds to a notebook.
HINTS = (
    ("Expected to have finished reduction in the prior iteration",
     "under DDP every trainable parameter must get a gradient in every step, and some of this model's get none "
     "(nbddp already wraps the model for a vision or audio tower's adapters: static_graph=True, or "
     "find_unused_parameters=True with gradient accumulation). Leave them out of "
     "get_peft_model's target_modules, or let DDP look for them in every step (--set "
     "ddp_find_unused_parameters=true; slower, and re-entrant gradient checkpointing may refuse it)"),
    ("outgoing traffic has been disabled",
     "the Hugging Face hub is offline here (HF_HUB_OFFLINE) and the file is not in its cache: fetch the model or "
     "dataset where the hub can be reached (`hf download <repo id>`, or run the notebook's loading cell there once), "
     "point the notebook at a local folder, or unset HF_HUB_OFFLINE"),
)


# Import names of packages that run on CUDA GPUs alone, and what the notebook asked of them.
GPU_ONLY = {"vllm": "vLLM (Unsloth's fast_inference=True, TRL's use_vllm, vllm.SamplingParams for "
                    "vllm_sampling_params)"}


def missing_module_hint(exc) -> str | None:
    """What to do about a ModuleNotFoundError: install the package where the script runs (a notebook installs its
    packages in a `!pip install` cell, which export leaves out), or, for a GPU-only one, where it can run."""
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return None
    package = exc.name.split(".")[0]
    if package in GPU_ONLY:
        return (f"{GPU_ONLY[package]} runs on CUDA GPUs only: pip install {package} on a GPU host that runs "
                f"Unsloth; without one, leave the notebook's {package} lines out (fast_inference=False, no "
                f"{package} import)")
    return (f"`{package}` is not installed where this script runs. The notebook's install cell (`!pip install ...`), "
            f"which export leaves out of the script, may have installed it: pip install it in this environment "
            f"(its name on PyPI can differ from `{package}`)")


_started_in = [None]  # the working directory `install` found, before `runtime.setup` changed it


def _shown(path) -> str:
    return os.path.relpath(path, _started_in[0] or os.getcwd())


def install(script: str) -> None:
    """Report uncaught exceptions of this process against the source map that sits beside `script`; paths in the
    reports are shown from the working directory it was started in (the cells change into the notebooks')."""
    script = os.path.abspath(script)
    _started_in[0] = os.getcwd()

    def report_with_origin(exc_type, exc, tb):
        report = format_report(exc_type, exc, tb, script)
        sys.stderr.write(report)
        sys.stderr.flush()
        write_error_file(exc_type, exc, report)
        status = exc.exit_status if issubclass(exc_type, NbddpError) else 1
        if _gloo_group_exists():
            # gloo's workers can abort this rank during finalization (SIGABRT instead of this status): end as
            # ddp.shutdown() ends a gloo run (see nbddp.runtime.ddp_core.exit_without_finalization).
            from nbddp.runtime.ddp_core import exit_without_finalization

            exit_without_finalization(status)
        if issubclass(exc_type, NbddpError):
            # SystemExit raised by the excepthook sets the exit status; the interpreter still shuts down normally.
            raise SystemExit(status)

    patches.set_attribute("cell-tracebacks", sys, "excepthook", report_with_origin)
    install_exits(script)


def install_exits(script: str) -> None:
    """Make `sys.exit()`, `exit()` and `quit()` in a script that torchrun runs on several processes say which rank
    ends, with what status, and where (the notebook cell), and end that rank once it has unwound (atexit), before
    finalization, whose wait for gloo's threads kept it alive until torchrun stopped it: the failure report then
    blamed another rank's lost connection and called this one killed by SIGTERM."""
    if int(os.environ.get("WORLD_SIZE", "1")) < 2:
        return

    def exit_here(status=None):
        code = 0 if status is None else status if isinstance(status, int) else 1
        origin = _origin_of(traceback.walk_stack(sys._getframe(1)), script, innermost_first=True)
        where = f"; {origin.removeprefix('nbddp: ')}" if origin else ""
        sys.stderr.write(f"[rank {os.environ.get('RANK', '?')}] nbddp: this rank ends here with status {code} while "
                         f"the other ranks go on (they stop at their next collective){where}\n")
        _exiting[0] = code
        raise SystemExit(status)

    for owner, name in ((sys, "exit"), (builtins, "exit"), (builtins, "quit")):
        patches.set_attribute("rank-exits", owner, name, exit_here)
    atexit.register(_end_before_finalization)


_exiting = [None]  # the status a rank's own sys.exit() asked for


def _end_before_finalization():
    # Registered at setup, so run last of the atexit callbacks: what exit_without_finalization does after them.
    if _exiting[0] is not None and _gloo_group_exists():
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(_exiting[0])


def _gloo_group_exists() -> bool:
    dist = sys.modules.get("torch.distributed")  # not imported: no group (and no torch import here)
    return dist is not None and dist.is_available() and dist.is_initialized() and dist.get_backend() == "gloo"


def format_report(exc_type, exc, tb, script: str) -> str:
    if issubclass(exc_type, NbddpError):
        text = _bad_input_paragraph(exc, tb, script)
    elif lost_peer(str(exc)):
        text = _lost_peer_paragraph(exc_type, exc, tb, script)
    else:
        lines = traceback.format_exception(exc_type, exc, tb)
        origin_line = _origin_line(tb, script)
        if origin_line:
            lines.append(origin_line + "\n")
        hints = [hint for text, hint in HINTS if text in str(exc)] + [missing_module_hint(exc)]
        lines += [f"nbddp: hint: {hint}\n" for hint in hints if hint]
        text = "".join(lines)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        prefix = f"[rank {os.environ.get('RANK', '?')}] "
        text = "".join(prefix + line for line in text.splitlines(keepends=True))
    return text


def write_error_file(exc_type, exc, report: str) -> None:
    """Under torchrun, record the failure in the file its agent reads for this process.

    The format is torch.distributed.elastic's (`ErrorHandler.record_exception`, what `@record` writes), with our
    report, origin line included, as the call stack; torchrun's summary then shows it instead of `<N/A>`.
    """
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    message = f"{exc_type.__name__}: {exc}"
    record = {"message": {"message": message, "extraInfo": {"py_callstack": report, "timestamp": str(int(time.time()))}}}
    try:
        with open(path, "w", encoding="utf-8") as file:
            json.dump(record, file)
    except OSError:  # the report is already on stderr; the error file only repeats it
        pass


def _bad_input_paragraph(exc, tb, script: str) -> str:
    """The error's own message, then where the script raised it (no traceback: the message says what to fix)."""
    text = f"nbddp: error: {exc}\n"
    origin_line = _origin_line(tb, script)
    if origin_line:
        text += "  " + origin_line.removeprefix("nbddp: ") + "\n"
    return text


def _lost_peer_paragraph(exc_type, exc, tb, script: str) -> str:
    """A rank whose collective failed because another rank's process ended: where it waited, not a traceback (the
    other rank's report says why; `pipeline.py launch` names that rank first)."""
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    text = f"nbddp: stopped: another rank ended while this one waited for it ({exc_type.__name__}: {message})\n"
    origin_line = _origin_line(tb, script)
    if origin_line:
        text += "  " + origin_line.removeprefix("nbddp: ") + "\n"
    return text


def _origin_line(tb, script: str) -> str | None:
    """One sentence locating the innermost frame of `script` in the notebooks, or saying that the source map
    could not be read; None when nothing is known."""
    return _origin_of(traceback.walk_tb(tb), script)


def _origin_of(frames, script: str, innermost_first=False) -> str | None:
    """`_origin_line` for (frame, line) pairs, outermost first (a traceback's) or innermost first (a stack's)."""
    script_lines = [line for frame, line in frames if os.path.abspath(frame.f_code.co_filename) == script]
    if innermost_first:
        script_lines.reverse()
    if not script_lines:
        return None
    try:
        found = SourceMap.for_script(script).lookup(script_lines[-1])
    except (OSError, SourceMapError) as error:
        # The report must still come out: an excepthook that raises buries the user's error under its own.
        return f"nbddp: could not read the source map {_shown(sourcemap_path(script))}: {error}"
    if found is None:
        return None
    where = f"nbddp: {_shown(script)} line {script_lines[-1]}"
    if found.origin is None:
        return f"{where} was written by nbddp (cell {found.cell_title!r})"
    return f"{where} comes from {found.origin}"
