"""What `launch` (and `run`, `regress`) print when torchrun fails: which rank failed and how, the notebook cell it
failed in, how far training got and the checkpoint to resume from.

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
worker's rank, exit code and error file, "Root Cause (first observed failure)" first), the error files,
`<output_dir>/metrics.jsonl` and the checkpoint markers. torchrun's first observed failure is not always the
cause: when rank 1 is killed, rank 0's gloo call fails at once ("Connection closed by peer"), and either can be
observed first. So ranks stopped by torchrun (SIGTERM) or by a lost peer are named after the rank that failed.
"""

import json
import re
import signal
from dataclasses import dataclass
from pathlib import Path

from nbddp.checkpoint_markers import latest_complete
from nbddp.errors import NotebookError
from nbddp.orchestration import notebook_run, parameters
from nbddp.orchestration.metrics import METRICS_FILE

SUMMARY_START = "Root Cause (first observed failure):"
# What a surviving rank's collective raises when its peer process died (gloo's tcp transport, pair.cc).
LOST_PEER = ("Connection closed by peer", "Connection reset by peer")
SIGNAL_CAUSES = {
    "SIGKILL": "the out-of-memory killer, or kill -9",
    "SIGTERM": "torchrun stops every rank once one fails",
}
_ENTRY = re.compile(r"\[\d+\]:")
_FIELD = re.compile(r"  (\w+)\s*: (.*)")
_RANK = re.compile(r"(\d+) \(local_rank: (\d+)\)")
_EXITCODE = re.compile(r"(-?\d+) \(pid: (\d+)\)")
_RANK_PREFIX = re.compile(r"^\[rank \d+\] ")


@dataclass(frozen=True)
class RankFailure:
    """One failed worker as torchrun's summary lists it, with what its error file says (if it wrote one)."""

    rank: int
    local_rank: int
    exitcode: int  # negative: killed by that signal
    pid: int
    message: str | None = None  # "ValueError: bad value", from the error file
    origin: str | None = None  # "generated/train.py line 237 comes from notebooks/...", from the error file

    @property
    def signal_name(self) -> str | None:
        if self.exitcode >= 0:
            return None
        try:
            return signal.Signals(-self.exitcode).name
        except ValueError:
            return f"signal {-self.exitcode}"

    @property
    def followed_another(self) -> bool:
        """Stopped because another rank failed: torchrun's SIGTERM, or a collective that lost its peer."""
        return self.signal_name == "SIGTERM" or any(text in (self.message or "") for text in LOST_PEER)

    def how(self) -> str:
        if self.signal_name:
            cause = SIGNAL_CAUSES.get(self.signal_name)
            return f"killed by {self.signal_name} ({cause + '; ' if cause else ''}pid {self.pid})"
        return self.message or f"exited with status {self.exitcode} (pid {self.pid})"


def describe(status, torchrun_stderr, script=None, script_args=()):
    """The report for a torchrun that exited with `status`; `torchrun_stderr` is (the end of) its stderr."""
    lines = [f"nbddp: training failed (torchrun exit status {status})"]
    failures = parse_summary(torchrun_stderr)
    if not failures:
        lines.append("  torchrun printed no per-rank failure summary; its output above says why")
    culprit = next((failure for failure in failures if not failure.followed_another), failures[0] if failures else None)
    if culprit is not None:
        lines.append(f"  rank {culprit.rank} failed: {culprit.how()}")
        if culprit.origin:
            lines.append(f"    {culprit.origin}")
    for failure in failures:
        if failure is not culprit:
            lines.append(f"  rank {failure.rank} {'stopped after it' if failure.followed_another else 'failed too'}: "
                         f"{failure.how()}")
    output_dir = find_output_dir(script, script_args) if script else None
    if output_dir is not None:
        lines += progress_lines(Path(output_dir))
    return "\n".join(lines)


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
    message, origin = read_error_file(fields.get("error_file"))
    return RankFailure(int(rank[1]), int(rank[2]), int(exitcode[1]), int(exitcode[2]), message, origin)


def read_error_file(path):
    """(message, origin line) from a worker's error file (torch.distributed.elastic's JSON); Nones when absent."""
    if not path or path == "<N/A>":
        return None, None
    try:
        record = json.loads(Path(path).read_text(encoding="utf-8"))["message"]
    except (OSError, ValueError, KeyError, TypeError):  # gone, or not the format torch writes
        return None, None
    if not isinstance(record, dict):
        return str(record), None
    callstack = record.get("extraInfo", {}).get("py_callstack", "")
    return record.get("message"), _origin_line(callstack)


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
        defaults = parameters.read_defaults(notebook_run.to_notebook(script), script)
    except (OSError, NotebookError):
        return None
    return defaults.get("output_dir")


def progress_lines(output_dir):
    """How far training got: the last step metrics.jsonl logged, and the last complete checkpoint."""
    metrics = output_dir / METRICS_FILE
    step = last_logged_step(metrics)
    lines = [f"  last logged step: {step} ({metrics})" if step is not None else f"  last logged step: none in {metrics}"]
    checkpoint = latest_complete(output_dir)
    if checkpoint is None:
        lines.append(f"  last complete checkpoint: none in {output_dir}")
    else:
        lines.append(f"  last complete checkpoint: {checkpoint.path} (step {checkpoint.step}); "
                     "rerun with --resume true to continue from it")
    return lines


def last_logged_step(path):
    """The step of the last training-loss line of a metrics.jsonl, or None (no file, no step yet)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    step = None
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # the last line of a rank 0 killed while writing it
            continue
        if "event" not in record and "step" in record:
            step = record["step"]
    return step
