"""The sweep's results: each notebook's outcome, its first error, and the tables printed and written.

    outcome = Outcome("Llama3.1_(8B)-Alpaca", "alpaca-sft", exported=True, compiled=True, ran=True, passed=True)
    print(table([outcome]))
    write(results_dir, [outcome], environment)  # summary.json and summary.md

`limit(error)` says when that error is the sandbox's, not nbddp's: what a CPU machine without network lacks (a GPU,
a package outside the stacks, a hub or web download, an audio codec, a model's own code); the tables count those
apart, so "passed" can be read against what could run here.

`python -m tools.sweep_report RESULTS` writes RESULTS' summary.md (and the counts of summary.json) again from the
outcomes in summary.json (and the runs' logs), with this module's rules.

`first_error(text)` is the line a reader needs from a failing command's output: nbddp's one-paragraph error (its
first line, with the notebook cell it came from), else the exception line of the first rank's traceback with
that cell (a rank that lost its peer in a collective comes last), else the last exception line, else the last line;
an AssertionError's line with the `assert` the traceback shows above it.
"""
import dataclasses
import json
import re
from collections import defaultdict
from pathlib import Path

from tools.categories import CATEGORIES

RANK_PREFIX = re.compile(r"^\s*(traceback : )?\[rank \d+\]:? ?")  # a rank's lines, also as torchrun repeats them
ORIGIN = re.compile(r"comes from (?P<where>.+, cell \d+, line \d+)$")
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Failure)(: .*)?$")
NOT_THE_CAUSE = ("torch.distributed.elastic", "ChildFailedError")  # torchrun's summary of a failed rank
PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "remote worker crashing")
MAX_ERROR = 300
# A notebook's own download command that failed (nbddp's warning for a `!command`), which a later error follows from.
FAILED_DOWNLOAD = re.compile(r"nbddp: warning: `!(?P<command>[^`]*\b(git clone|wget|curl|hf download|"
                             r"huggingface-cli download)\b[^`]*)` exited with status")
NO_NETWORK = "failed: no network"
# What a CPU machine with no network lacks, by a pattern of the first error: (pattern, what is missing).
LIMITS = (
    (r"No module named '(?!nbddp|unsloth)", "a package outside the tested stacks"),  # the notebook's own pip install
    (r"install 'torchcodec'|torchaudio|soundfile|librosa", "an audio decoder"),
    (r"vLLM is not available|vllm exited with", "a package outside the tested stacks"),
    (r"syntax error: f-string: ", "Python 3.12's grammar (this machine's Python is older)"),
    (re.escape(NO_NETWORK) + r"|LocalEntryNotFoundError|outgoing traffic has been disabled|Failed to resolve|"
     r"NameResolutionError|Max retries exceeded|ConnectionError|Temporary failure in name resolution|Network is unreachable|"
     r"URLError|Name or service not known|Unable to find .https?://|Command '\['git', 'clone'|"
     r"No such file or directory: 'ollama'",  # the notebook's `curl https://ollama.com/install.sh | sh`
     "the network (a hub or web download)"),
    (r"needs an NVIDIA GPU|Torch not compiled with CUDA|CUDA is not available|No CUDA GPUs|nvidia-smi|"
     r"CUDA-enabled PyTorch required|No GPU visible|serves the model with vLLM \(a CUDA GPU\)",
     "a GPU"),
    (r"save_pretrained_gguf|push_to_hub_gguf|llama\.cpp|save_pretrained_torchao", "Unsloth's GPU-only export"),
    (r"trust_remote_code|add_image_preprocess|Processor' object has no attribute 'eval'", "the model's own code"),
    # unsloth_zoo absent, or present and refusing to import without Unsloth (which needs a GPU)
    (r"No module named 'unsloth_zoo'|Please install Unsloth via `pip install unsloth`",
     "Unsloth itself (unsloth_zoo, which needs a GPU)"),
    # `assert transformers.__version__ == "5.15.0"` (first_error shows the assert): a release the stack lacks
    (r"^AssertionError\b.* \(`assert (?P<package>[\w.]+)\.__version__ == [\"'](?P<version>[^\"']+)[\"']",
     r"\g<package> \g<version> (the exact version the notebook asserts)"),
)


@dataclasses.dataclass
class Outcome:
    notebook: str  # file name without .ipynb
    category: str
    exported: bool = False
    compiled: bool = False
    ran: bool = False  # the script was started (chosen to run, compiled, stand-ins ready)
    passed: bool = False  # ... and exited 0
    stage: str | None = None  # where it stopped: export, compile, standins, run
    error: str | None = None
    seconds: float = 0.0  # of the run
    stack: str = "main"  # main: --python's; notebooks: --notebooks-python's; else the pins of the --stack that ran it
    nbddp: str = ""  # the commit it ran with


def slug(notebook: str) -> str:
    """A folder name for the notebook (its file name without .ipynb) without spaces, which shell commands trip on:
    its work folder, and its logs' folder in the results."""
    return re.sub(r"[^\w.()+-]+", "_", notebook)


def limit(error: str | None) -> str | None:
    """What the sandbox lacks that stopped the run, when the first error says so; None for nbddp's own failures."""
    for pattern, missing in LIMITS:
        if error and (found := re.search(pattern, error)):
            return found.expand(missing)
    return None


def after_failed_download(error: str, output: str) -> str:
    """`error`, saying which of the notebook's download commands failed before it, if one did."""
    found = FAILED_DOWNLOAD.search(output)
    return f"{error} (after `!{_short(found['command'])[:80]}` {NO_NETWORK})" if found else error


def first_error(text: str) -> str:
    lines = [RANK_PREFIX.sub("", line.rstrip()) for line in text.splitlines()]
    lines = [line for line in lines if line.strip()]
    if not lines:
        return "no output"
    reports = []  # (message, origin line) of each report a rank made, in order
    for index, line in enumerate(lines):
        following = lines[index + 1] if index + 1 < len(lines) else ""
        if line.startswith(("nbddp: error: ", "error: ")):  # the script's paragraph; pipeline.py's
            reports.append((line.split("error: ", 1)[1], following))
        elif line.startswith("nbddp: ") and ORIGIN.search(line):
            cause = next((i for i in reversed(range(index)) if EXCEPTION_LINE.match(lines[i])
                          and not _torchrun(lines[i])), None)
            if cause is not None:
                reports.append((_with_assertion(lines, cause), line))
    if reports:
        # A rank that waited in a collective for a rank that died reports the lost connection: not the cause.
        message, origin = next((r for r in reports if not any(m in r[0] for m in PEER_LOST)), reports[0])
        return _short(_with_origin(message, origin))
    causes = [i for i, line in enumerate(lines) if EXCEPTION_LINE.match(line) and not _torchrun(line)]
    return _short(_with_assertion(lines, causes[-1]) if causes else lines[-1])


def _torchrun(line: str) -> bool:
    return any(marker in line for marker in NOT_THE_CAUSE)


def _with_assertion(lines: list[str], index: int) -> str:
    """The exception line `lines[index]`; an AssertionError's with the `assert` its traceback shows above it, which
    says what was asserted (`AssertionError: 4.56.2` alone does not)."""
    if not lines[index].startswith("AssertionError"):
        return lines[index]
    source = next((line.strip() for line in reversed(lines[:index]) if line.strip(" ^~")), "")
    return f"{lines[index]} (`{source}`)" if re.match(r"assert\b", source) else lines[index]


def _with_origin(message: str, origin_line: str) -> str:
    origin = ORIGIN.search(origin_line.strip())
    if origin is None:
        return message
    where = origin["where"]
    return f"{message} [{Path(where.split(',')[0]).name}{where[len(where.split(',')[0]):]}]"


def _short(text: str) -> str:
    return text if len(text) <= MAX_ERROR else text[:MAX_ERROR - 3] + "..."


def cause(error: str) -> str:
    """The error without where it happened, so the same failure in several notebooks groups together."""
    return re.sub(r" \[[^\]]*, cell \d+, line \d+\]$", "", error)


def counts(outcomes: list[Outcome]) -> dict[str, dict[str, int]]:
    """category -> {notebooks, exported, compiled, ran, passed, limited}, categories in CATEGORIES order, then "all".

    limited: failed on what the sandbox lacks (`limit`)."""
    rows = {}
    for category in (*CATEGORIES, "all"):
        chosen = [o for o in outcomes if category in ("all", o.category)]
        if chosen:
            rows[category] = {"notebooks": len(chosen), **{field: sum(getattr(o, field) for o in chosen)
                                                            for field in ("exported", "compiled", "ran", "passed")},
                              "limited": sum(limit(o.error) is not None for o in chosen)}
    return rows


def table(outcomes: list[Outcome]) -> str:
    """The counts per category, then each failing notebook's stage and first error (plain text)."""
    lines = [f"{'category':<22} {'N':>4} {'exported':>9} {'compiled':>9} {'ran':>5} {'passed':>7} {'limited':>8}"]
    for category, row in counts(outcomes).items():
        lines.append(f"{category:<22} {row['notebooks']:>4} {row['exported']:>9} {row['compiled']:>9} "
                     f"{row['ran']:>5} {row['passed']:>7} {row['limited']:>8}")
    failures = [o for o in outcomes if o.error]
    if failures:
        lines += ["", "first error of each notebook that did not pass:"]
        lines += [f"  {o.notebook} ({o.category}, {o.stage}): {o.error}" for o in failures]
    return "\n".join(lines)


def markdown(outcomes: list[Outcome], environment: dict) -> str:
    lines = ["# nbddp sweep of Unsloth's notebooks", ""]
    lines += [f"- {key}: {value}" for key, value in environment.items()]
    lines += ["", "limited: stopped by what this machine lacks (`limit` in tools/sweep_report.py: a GPU, the network, a "
              "package outside the tested stacks, a model's own code), not by nbddp.",
              "", "| category | N | exported | compiled | ran | passed | limited |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for category, row in counts(outcomes).items():
        lines.append(f"| {category} | {row['notebooks']} | {row['exported']} | {row['compiled']} | {row['ran']} "
                     f"| {row['passed']} | {row['limited']} |")
    by_cause = defaultdict(list)
    for outcome in outcomes:
        if outcome.error:
            by_cause[(outcome.stage, cause(outcome.error))].append(outcome.notebook)
    if by_cause:
        lines += ["", "## Failures by first error", "", "| stage | first error | lacking | notebooks |",
                  "| --- | --- | --- | --- |"]
        for (stage, error), notebooks in sorted(by_cause.items(), key=lambda item: (-len(item[1]), item[0])):
            lines.append(f"| {stage} | {_cell(error)} | {limit(error) or '-'} | {len(notebooks)}: "
                         f"{_cell(', '.join(notebooks))} |")
    lines += ["", "## Every notebook", "",
              "| notebook | category | stack | nbddp | exported | compiled | ran | passed | run s | first error |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for o in outcomes:
        marks = " | ".join("yes" if getattr(o, f) else "-" for f in ("exported", "compiled", "ran", "passed"))
        seconds = f"{o.seconds:.0f}" if o.ran else ""
        lines.append(f"| {_cell(o.notebook)} | {o.category} | {o.stack} | {o.nbddp} | {marks} | {seconds} "
                     f"| {_cell(o.error or '')} |")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def read(results_dir: Path) -> tuple[dict, list[Outcome]] | None:
    """The environment and outcomes of results_dir/summary.json, or None when there is none."""
    path = results_dir / "summary.json"
    if not path.is_file():
        return None
    summary = json.loads(path.read_text(encoding="utf-8"))
    return summary["environment"], [Outcome(**row) for row in summary["notebooks"]]


def merge(previous: list[Outcome], new: list[Outcome]) -> list[Outcome]:
    """`previous` with each notebook of `new` in its place (new ones at the end)."""
    by_name = {outcome.notebook: outcome for outcome in new}
    kept = [by_name.pop(outcome.notebook, outcome) for outcome in previous]
    return kept + list(by_name.values())


def write(results_dir: Path, outcomes: list[Outcome], environment: dict) -> tuple[Path, Path]:
    """summary.json (environment, counts, outcomes) and summary.md in `results_dir`."""
    results_dir.mkdir(parents=True, exist_ok=True)
    summary = {"environment": environment, "counts": counts(outcomes),
               "notebooks": [dataclasses.asdict(o) for o in outcomes]}
    json_path, markdown_path = results_dir / "summary.json", results_dir / "summary.md"
    json_path.write_text(json.dumps(summary, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    markdown_path.write_text(markdown(outcomes, environment), encoding="utf-8")
    return json_path, markdown_path


if __name__ == "__main__":
    import sys

    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "sweep_results" / "cpu"
    environment, outcomes = read(folder)
    for outcome in outcomes:  # a sweep run before after_failed_download: its logs say what failed before
        log = folder / "logs" / slug(outcome.notebook) / "run.stderr"
        if outcome.stage == "run" and NO_NETWORK not in outcome.error and log.is_file():
            outcome.error = after_failed_download(outcome.error, log.read_text(errors="replace"))
    print(table(outcomes))
    print("\nwrote " + " and ".join(map(str, write(folder, outcomes, environment))))
