"""What `launch` (and `run`, `regress`) print when torchrun fails: which rank failed first and how, the notebook
cell it failed in, how far training got and the checkpoint to resume from.

    nbddp: training failed (torchrun exit status 1)
      rank 1 failed: killed by SIGKILL (the out-of-memory killer, or kill -9; pid 4242)
      rank 0 stopped after it: RuntimeError: [...] Connection closed by peer [127.0.0.1]:18825. [...]
      last logged step: 11 (outputs/metrics.jsonl)
      last complete checkpoint: outputs/checkpoint-8 (step 8); rerun with --resume true to continue from it

A rank that raised an exception gets its notebook cell from its error file, where the runtime's excepthook
writes its report (`nbddp: generated/train.py line L comes from <notebook>, cell C, line N`):

      rank 1 failed: ValueError: bad value
        generated/train.py line 237 comes from notebooks/03_train.ipynb, cell 6, line 1

Sources: torchrun's failure summary (the `ChildFailedError` text its agent prints last on stderr: each failed
worker's rank, exit code and error file, "Root Cause (first observed failure)" first), the error files, the lines
torchrun's agent logs for each worker it signals itself (`Sending process P closing signal SIGTERM`, `Unable to
shutdown process P ..., forcefully exiting`), `<output_dir>/metrics.jsonl`, the checkpoint markers and the free
space of output_dir's disk. torchrun's first observed failure is not always the cause: when rank 1 is killed,
rank 0's gloo call fails at once ("Connection closed by peer"), and either can be observed first. So ranks stopped
by torchrun or by a lost or silent peer are named after the rank that stopped first, chosen in this order: one
that failed by itself (an exception, a signal from outside torchrun: SIGKILL, a SIGTERM it did not send), one that
hung (torchrun's SIGTERM did not end it), one that ended early with status 0 (torchrun lists none: it is the
rank of this node missing from the summary), one that exited with a bare status.
"""

import json
import re
import shutil
import signal
from dataclasses import dataclass, field
from pathlib import Path

from nbddp.formats.checkpoint_markers import DAMAGED, damaged_dirs, latest_complete
from nbddp.errors import NotebookError, lost_peer
from nbddp.formats import metrics
from nbddp.orchestration import parameters
from nbddp.orchestration.script_notebook import to_notebook

SUMMARY_START = "Root Cause (first observed failure):"
# ... and when a peer never came within the process group's timeout (gloo; NCCL's watchdog).
TIMED_OUT = ("Timed out waiting", "collective operation timeout")
# torchrun's agent (torch/distributed/elastic/multiprocessing/api.py, SubprocessContext._close), once a worker failed.
_TORCHRUN_TERMINATES = re.compile(r"Sending process (\d+) closing signal SIGTERM")
_TORCHRUN_KILLS = re.compile(r"Unable to shutdown process (\d+) via \S+, forcefully exiting")
# errno ENOSPC as Python words it (`[Errno 28] No space left on device: 'path'`), with the path when it has one.
_NO_SPACE = re.compile(r"No space left on device(?:: '([^']+)')?|\bENOSPC\b")
# torch.save on a full disk fails with "unexpected pos N vs M", which does not say why: so little free space does.
NEARLY_FULL_BYTES = 100 * 2**20
_ENTRY = re.compile(r"\[\d+\]:")
_FIELD = re.compile(r"  (\w+)\s*: (.*)")
_RANK = re.compile(r"(\d+) \(local_rank: (\d+)\)")
_EXITCODE = re.compile(r"(-?\d+) \(pid: (\d+)\)")
_RANK_PREFIX = re.compile(r"^\[rank \d+\] ")


@dataclass(frozen=True)
class RankFailure:
    """One failed worker as torchrun's summary lists it, with what its error file says (if it wrote one); or, with
    exit code 0 and no pid, a worker that ended early (torchrun lists no such worker)."""

    rank: int
    local_rank: int
    exitcode: int  # negative: killed by that signal
    pid: int | None
    message: str | None = None  # "ValueError: bad value", from the error file
    origin: str | None = None  # "generated/train.py line 237 comes from notebooks/...", from the error file
    report: str | None = field(default=None, compare=False, repr=False)  # the error file's whole traceback

    @property
    def signal_name(self) -> str | None:
        if self.exitcode >= 0:
            return None
        try:
            return signal.Signals(-self.exitcode).name
        except ValueError:
            return f"signal {-self.exitcode}"

    @property
    def waited_for_a_peer(self) -> bool:
        """Its collective failed because a peer died or never came."""
        message = self.message or ""
        return lost_peer(message) or any(text in message for text in TIMED_OUT)


@dataclass(frozen=True)
class TorchrunSignals:
    """The pids of the workers torchrun's agent signalled itself, from its log: `terminated` (SIGTERM, once another
    failed), `killed` (SIGKILL, once they outlived its shutdown timeout); `logged`: whether it logged either."""

    terminated: frozenset
    killed: frozenset

    @classmethod
    def read(cls, text):
        return cls(*(frozenset(map(int, pattern.findall(text))) for pattern in (_TORCHRUN_TERMINATES, _TORCHRUN_KILLS)))

    @property
    def logged(self) -> bool:
        return bool(self.terminated or self.killed)


# How a rank stopped, in the order the report looks for the one that stopped first.
FAILED, HUNG, ENDED_EARLY, BARE_STATUS, FOLLOWED = range(5)
VERBS = {FAILED: "failed", HUNG: "hung", ENDED_EARLY: "ended early", BARE_STATUS: "failed"}


def _kind(failure, failures, signals):
    if failure.pid is None:
        return ENDED_EARLY
    if failure.signal_name == "SIGKILL" and failure.pid in signals.killed:
        return HUNG
    if failure.signal_name == "SIGTERM":
        if signals.logged:
            return FOLLOWED if failure.pid in signals.terminated else FAILED
        # No log lines (LOGLEVEL hides them): torchrun's, unless every rank was terminated (from outside, then).
        return FAILED if all(other.signal_name == "SIGTERM" for other in failures if other.pid) else FOLLOWED
    if failure.waited_for_a_peer:
        return FOLLOWED
    return FAILED if failure.signal_name or failure.message else BARE_STATUS


def _how(failure, kind):
    pid = f"pid {failure.pid}"
    if kind == ENDED_EARLY:
        return "exited with status 0 while the other ranks still ran (its script ended early)"
    if kind == HUNG:
        return f"torchrun's SIGTERM did not end it, so torchrun killed it (stopped, or stuck in the kernel or a " \
               f"driver; {pid})"
    if failure.signal_name == "SIGKILL":
        return f"killed by SIGKILL (the out-of-memory killer, or kill -9; {pid})"
    if failure.signal_name == "SIGTERM":
        if kind == FOLLOWED:
            return f"killed by SIGTERM (torchrun stops every rank once one fails; {pid})"
        return f"killed by SIGTERM from outside torchrun (kill, a scheduler's time limit or preemption; {pid})"
    if failure.signal_name:
        return f"killed by {failure.signal_name} ({pid})"
    return failure.message or f"exited with status {failure.exitcode} ({pid})"


def describe(status, torchrun_stderr, output_dir=None, processes=None, hung=None):
    """The report for a torchrun that exited with `status`; `torchrun_stderr` is (the end of) its stderr,
    `output_dir` the training's, `processes` how many workers torchrun ran on this node (None: unknown), `hung` the
    rank the hang watch killed (`hang_watch.Hung`), which is then the cause."""
    lines = [f"nbddp: training failed (torchrun exit status {status})"]
    if hung is not None:
        lines.append(f"  {hung.describe()}; torchrun then stopped the other ranks")
        if output_dir is not None:
            lines += progress_lines(Path(output_dir))
        return "\n".join(lines)
    failures = parse_summary(torchrun_stderr)
    if not failures:
        lines.append("  torchrun printed no per-rank failure summary; its output above says why")
    failures += ended_early(failures, processes)
    signals = TorchrunSignals.read(torchrun_stderr)
    kinds = [_kind(failure, failures, signals) for failure in failures]
    # Within a kind, torchrun's order (first observed first), except that ranks which raised the same error (a
    # non-finite loss stops every rank at once) are named lowest rank first: which of them torchrun saw first is
    # chance.
    first_seen = {}
    for index, failure in enumerate(failures):
        first_seen.setdefault((kinds[index], failure.message), index)
    order = sorted(range(len(failures)), key=lambda index: (
        kinds[index], first_seen[kinds[index], failures[index].message] if failures[index].message else index,
        failures[index].rank))
    first_how = None
    for position, index in enumerate(order):
        failure, kind = failures[index], kinds[index]
        how = _how(failure, kind)
        if position == 0:
            first_how = how
            lines.append(f"  rank {failure.rank} {VERBS.get(kind, 'failed')}: {how}")
            if failure.origin:
                lines.append(f"    {failure.origin}")
        else:
            verb = "stopped after it" if kind == FOLLOWED else f"{VERBS[kind]} too"
            same = failure.message is not None and how == first_how  # every rank raised it (a non-finite loss)
            lines.append(f"  rank {failure.rank} {verb}: {'the same error' if same else how}")
    texts = [torchrun_stderr, *(text for failure in failures for text in (failure.message, failure.report))]
    disk = disk_full_line(texts, output_dir)
    if disk:
        lines.append(disk)
    if output_dir is not None:
        lines += progress_lines(Path(output_dir))
    return "\n".join(lines)


def ended_early(failures, processes):
    """The workers of this node that torchrun's summary does not list, although others failed: they exited with
    status 0 (torchrun lists every other worker, those it stopped included)."""
    if not failures or not processes:
        return []
    offset = failures[0].rank - failures[0].local_rank  # torchrun numbers a node's workers consecutively
    listed = {failure.local_rank for failure in failures}
    return [RankFailure(offset + local_rank, local_rank, 0, None) for local_rank in range(processes)
            if local_rank not in listed]


def disk_full_line(texts, output_dir=None):
    """`  disk full: ...` when a text of the failure says No space left on device (ENOSPC), with the path it names
    and the space left on output_dir's disk; or when that disk has less than NEARLY_FULL_BYTES left. Else None."""
    found = next((match for text in texts if text and (match := _NO_SPACE.search(text))), None)
    free = free_bytes(output_dir) if output_dir is not None else None
    left = f"{free / 2**20:.0f} MiB free on the disk of {output_dir}" if free is not None else None
    if found:
        return "  disk full: No space left on device" + (f" writing {found[1]}" if found[1] else "") + \
            (f"; {left}" if left else "")
    if free is not None and free < NEARLY_FULL_BYTES:
        return f"  disk full: only {left}"
    return None


def free_bytes(path):
    """Bytes free on the disk of `path`, or of its deepest folder that exists; None when not even that."""
    for folder in (Path(path), *Path(path).absolute().parents):
        if folder.exists():
            try:
                return shutil.disk_usage(folder).free
            except OSError:
                return None
    return None


def parse_summary(text):
    """The failures in torchrun's last failure summary in `text`, root cause first; [] when there is none."""
    start = text.rfind(SUMMARY_START)
    if start < 0:
        return []
    others_start = text.rfind("Failures:", 0, start)
    root = _parse_entries(text[start:].splitlines())[:1]
    others = _parse_entries(text[others_start:start].splitlines()) if others_start >= 0 else []
    return root + others


def _parse_entries(lines):
    """Entries `[i]:` followed by `  key : value` lines; the traceback value (which may run over many lines)
    comes last in each entry and is not read: the error file holds it whole."""
    entries, fields = [], None
    for line in lines:
        if _ENTRY.fullmatch(line.strip()):
            fields = {}
            entries.append(fields)
        elif fields is not None and "traceback" not in fields and (match := _FIELD.fullmatch(line.rstrip())):
            fields[match[1]] = match[2].strip()
    return [failure for failure in map(_failure, entries) if failure is not None]


def _failure(fields):
    rank, exitcode = _RANK.match(fields.get("rank", "")), _EXITCODE.match(fields.get("exitcode", ""))
    if rank is None or exitcode is None:
        return None
    record = _error_record(fields.get("error_file"))
    message, origin = _message_and_origin(record)
    return RankFailure(int(rank[1]), int(rank[2]), int(exitcode[1]), int(exitcode[2]), message, origin,
                       _callstack(record))


def read_error_file(path):
    """(message, origin line) from a worker's error file (torch.distributed.elastic's JSON); Nones when absent."""
    return _message_and_origin(_error_record(path))


def _error_record(path):
    """The `message` record of a worker's error file; None when it has none."""
    if not path or path == "<N/A>":
        return None
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))["message"]
    except (OSError, ValueError, KeyError, TypeError):  # gone, or not the format torch writes
        return None


def _message_and_origin(record):
    if record is None:
        return None, None
    if not isinstance(record, dict):
        return str(record), None
    message, callstack = record.get("message"), _callstack(record)
    return None if message is None else str(message), _origin_line(callstack) if callstack else None


def _callstack(record):
    """The report (traceback) of an error file's `message` record; None when it has none (or not as text)."""
    extra = record.get("extraInfo") if isinstance(record, dict) else None
    callstack = extra.get("py_callstack") if isinstance(extra, dict) else None
    return callstack if isinstance(callstack, str) else None


def _origin_line(report):
    """`generated/train.py line L comes from ...` (or `... was written by nbddp ...`) from an excepthook report."""
    for line in reversed(report.splitlines()):
        text = _RANK_PREFIX.sub("", line).strip().removeprefix("nbddp: ")
        if " comes from " in text or " was written by nbddp" in text:
            return text
    return None


def find_output_dir(script, script_args):
    """The training output_dir: `--output_dir` among the script's flags, else the script's default; None when the
    script has no such parameter (not a generated script, or one without an output_dir)."""
    value = None
    for index, argument in enumerate(script_args):
        if argument == "--output_dir" and index + 1 < len(script_args):
            value = script_args[index + 1]
        elif argument.startswith("--output_dir="):
            value = argument.split("=", 1)[1]
    if value is not None:
        return value
    try:
        defaults = parameters.read_defaults(to_notebook(script), script)
    except (OSError, ValueError, NotebookError):  # ValueError: a script that is not UTF-8 text
        return None
    return defaults.get("output_dir")


def progress_lines(output_dir):
    """How far training got: the last step metrics.jsonl logged, and the last complete checkpoint; or that
    output_dir is no folder (the workers said so), so that there is neither."""
    if output_dir.exists() and not output_dir.is_dir():
        return [f"  output_dir {output_dir}: not a folder, so no steps were logged and no checkpoint written there"]
    path = output_dir / metrics.METRICS_FILE
    step = metrics.last_step(path)
    lines = [f"  last logged step: {step} ({path})" if step is not None else f"  last logged step: none in {path}"]
    return lines + [f"  {resume_hint(output_dir)}"]


def resume_hint(output_dir):
    """Where a rerun goes on from: the last complete checkpoint in `output_dir`, and the flag that resumes from it;
    before it, the damaged checkpoints that a resume sets aside (never the one proposed)."""
    damaged = "".join(f"{path} would not load ({why}), and --resume true moves it to {DAMAGED}/; "
                      for path, why in damaged_dirs(output_dir))
    checkpoint = latest_complete(output_dir)
    if checkpoint is None:
        return f"{damaged}last complete checkpoint: none in {output_dir}"
    return f"{damaged}last complete checkpoint: {checkpoint.path} (step {checkpoint.step}); rerun with --resume " \
           "true to continue from it"
