"""Sweep Unsloth's own notebooks through nbddp, as a new user would take each one: export, compile, run on 2 ranks.

    .venv/bin/python -m tools.notebook_sweep --notebooks ~/notebooks/nb --sample 3   # --help: how, how long

Each notebook of unslothai/notebooks' nb/ (outside its AMD, Kaggle and Desktop copies) is classified from its code
(tools/categories.py), copied alone into WORK/<name>/01_nb.ipynb, exported with `pipeline.py export` and compiled
with `py_compile`; the chosen ones then run under torchrun, where links beside the notebook (its cells run there)
named like every hub id the notebook loads lead to local stand-ins (tools/standins.py, tools/standin_datasets.py)
and the URLs it fetches files from are answered from local files (tools/standin_urls.py), with the hub offline and
training capped by NBDDP_MAX_STEPS. One line per notebook as it finishes, then the table;
the same goes to RESULTS/summary.json and summary.md, with each run's stdout and stderr under RESULTS/logs/.
"""
import argparse
import dataclasses
import datetime
import hashlib
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from nbddp.errors import UsageError
from nbddp.formats.run_settings import ENV
from tools import standin_datasets, standin_urls, standins
from tools.categories import CATEGORIES, classify
from tools.notebook_facts import PINNED, read_facts
from tools.sweep_report import Outcome, after_failed_download, first_error, merge, read, slug, table, write

REPO = Path(__file__).resolve().parent.parent
DEFAULT_NOTEBOOKS = Path("/tmp/unb/nb")  # unslothai/notebooks' nb/ at bdda2efc on the machine this was written on
COPIES = re.compile(r"^(AMD|Kaggle|Desktop)")  # per-platform copies of the other notebooks
LOG_LIMIT = 200_000  # characters of each run's stdout and stderr kept in the results (the end of them)
# A --stack value: "transformers==5.15.0 trl==0.22.2=PYTHON", pins (no `=` in a version) then `=` and the interpreter.
STACK = re.compile(r"^\s*(?P<pins>(?:[\w.-]+==[^\s=]+\s+)*[\w.-]+==[^\s=]+)\s*=\s*(?P<python>\S.*?)\s*$")

EPILOG = """\
examples (from the repository root):
  python -m tools.notebook_sweep --notebooks ~/notebooks/nb --notebooks-commit bdda2efc --sample 3
  python -m tools.notebook_sweep --only "Llama3.1_(8B)-Alpaca" "Qwen3_(4B)-GRPO"     # export and run just these
  python -m tools.notebook_sweep --run-all --nbddp-commit HEAD                     # every notebook, committed nbddp
  python -m tools.notebook_sweep --run-all --notebooks-python .venv-nb/bin/python  # each on the stack it pins
  python -m tools.notebook_sweep --only "Muse_Glimmer_(30B)-GRPO" --stack "transformers==5.15.0 trl==1.9.2=VENV/python"
  python -m tools.notebook_sweep --only "Gemma3_(4B)-Vision" --update   # rerun one, keep the other results

how long, on 2 CPU cores: all 177 exported and compiled with --sample 3 (26 runs) took 16 min; --run-all
46 min (a run took 7-35 s: most stop early, the Alpaca ones train their capped steps; --timeout caps each).

needs: this repository's virtual environment (torch, transformers, trl, peft, datasets, IPython) and the tiny
models' folders models/tiny-chat (or models/tiny-llama), models/tiny-vision and models/tiny-video. Nothing is downloaded: the hub
is offline (HF_HUB_OFFLINE=1), every model and dataset id a notebook names is a local stand-in, and so is each
URL it names of a kind tools/standin_urls.py knows (a book's .txt, an image, a sound, a CSV whose columns it
has), answered to urllib, requests, httpx and datasets in the run's Python (a `!wget` of it still finds no
network); any other URL fails as without network. So a run checks nbddp's rewrites and runtime on the
notebook's own code, not the model's quality. Each sweep replaces
RESULTS' summary and logs.

unsloth_zoo: the GRPO notebooks that run model-written code do it through Unsloth's sandbox helpers
(`from unsloth import create_locked_down_function`), which the fallback loads from unsloth_zoo's own file; without a
GPU, install it alone and put it on the path: pip install --no-deps --target DIR unsloth-zoo==2026.10.9, then
PYTHONPATH=DIR python -m tools.notebook_sweep ... (the sweep's commands inherit PYTHONPATH).

audio: the audio notebooks decode their datasets' WAVs with torchcodec, which needs FFmpeg's libraries; none is
installed, so take the ones PyAV's wheel bundles. Unpack (python -m zipfile -e WHEEL DIR, no pip install) into
CODEC: torchcodec==0.13.0 and av==16.1.0; into AUDIO: torchaudio==2.11.1 with its torchaudio/lib/*.so deleted
(built for torch 2.11, they refuse 2.13; the pure-Python transforms.Resample is what the notebooks use), snac,
soundfile, cffi, pycparser, einops, evaluate, jiwer, rapidfuzz. Link CODEC/av.libs' mangled libraries under their
own names in FFMPEG (ln -s CODEC/av.libs/libavcodec-*.so.62 FFMPEG/libavcodec.so.62, and so for libavformat,
libavutil, libavdevice, libavfilter, libswresample, libswscale), then
PYTHONPATH=/tmp/zoo-site:AUDIO:CODEC LD_LIBRARY_PATH=FFMPEG:CODEC/av.libs python -m tools.notebook_sweep ...
(the runs inherit both). Orpheus_(3B)-TTS pins datasets<4 and asks `"array" in row["audio"]`, which datasets 4's
decoders fail: sweep it with DS3 first on PYTHONPATH, holding datasets==3.6.0 and librosa with lazy_loader, soxr,
audioread, scipy, numba, llvmlite, joblib, threadpoolctl, cloudpickle, decorator, msgpack, pooch, standard-aifc,
standard-sunau, standard-chunk (not scikit-learn: 1.9 wants narwhals, and TRL's import then fails). Whisper's
pipeline() reads its .flac through the ffmpeg program (Debian's ffmpeg). Stand-ins: models/tiny-whisper,
tiny-orpheus, tiny-csm; evaluate's "wer" metric and a tiny SNAC codec (tools/standin_datasets.py).

video: a notebook that reads a processor's video token or video processor, or writes video parts (Muse Glimmer's
Vision and Multimodal), gets models/tiny-video, a Qwen2-VL whose processor Transformers 5 builds only with
torchvision; its dataset's clips are MP4s written and read with torchcodec (the audio recipe's CODEC and FFMPEG).
PyPI's torchvision==0.28.0 is a CUDA build that the CPU torch refuses at import (operator torchvision::nms does
not exist): unpack it into TV (python -m zipfile -e), delete TV/torchvision/_C.so and image.so and the two
`@torch.library.register_fake("torchvision::nms")` and `("torchvision::qnms")` lines of _meta_registrations.py,
and put TV on PYTHONPATH beside CODEC (a CPU build of torchvision from PyTorch's own index needs none of this).

--notebooks-python: most of the notebooks pin transformers==4.56.2 and trl==0.22.2 in the install cell that export
drops, as a researcher running one has installed. With the interpreter of a virtual environment made from
requirements-notebooks.txt, every notebook whose install cell pins Transformers 4.x or TRL 0.x exports and runs
with it, the others with --python; the tables say which stack ran each.

--stack "PINS=PYTHON" (repeatable): the interpreter for the notebooks whose install cell pins these versions, as
--stack "transformers==5.15.0 trl==0.22.2=/tmp/venv-muse-a/bin/python" for the Muse Glimmer notebooks that pin
both (a venv of requirements-notebooks.txt with those pins and a huggingface_hub that Transformers 5 takes). PINS
are transformers and trl pins, the ones the sweep reads from an install cell (NotebookFacts.pins). A notebook
matches a stack when each of the stack's pins equals the notebook's pin of that package (transformers==5.15.0
alone matches every notebook pinning 5.15.0, whatever its trl); of the stacks a notebook matches, the one with the
most pins runs it (on a tie, the first given), ahead of --notebooks-python and --python. The sweep refuses a
stack whose interpreter has other versions than its pins; the tables name each notebook's stack by its pins and
the summary's environment gives each stack's versions ("stack PINS").

--gpu, on a CUDA host with Unsloth installed (docs/guide.md, "GPU install"): the same flow with the scripts'
--backend unsloth (or --backend auto) on --nproc-per-node 1 or 2 GPUs, the GPUs left visible. Not run on the
machine that wrote this tool, which has none."""


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return sweep(args)
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return error.exit_status


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tools.notebook_sweep", description=__doc__.split("\n\n")[0],
                                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--notebooks", type=Path, default=DEFAULT_NOTEBOOKS,
                        help="the nb/ folder of a checkout of unslothai/notebooks (default: %(default)s)")
    parser.add_argument("--notebooks-commit", help="the checkout's commit, when the folder is not a git checkout")
    parser.add_argument("--only", nargs="+", metavar="NAME",
                        help="just these notebooks (file names, .ipynb optional): export, compile and run each")
    parser.add_argument("--sample", type=int, default=0, metavar="N",
                        help="run N notebooks of each category, the same ones every time (default: 0, run none)")
    parser.add_argument("--run-all", action="store_true", help="run every notebook that compiles")
    parser.add_argument("--no-run", action="store_true", help="export and compile only, also with --only")
    parser.add_argument("--steps", type=int, default=3, help=f"{ENV.MAX_STEPS} for each run (default: %(default)s)")
    parser.add_argument("--timeout", type=int, default=600, help="seconds each run may take (default: %(default)s)")
    parser.add_argument("--nproc-per-node", type=int, default=2, help="torchrun processes (default: %(default)s)")
    parser.add_argument("--jobs", type=int, default=1, metavar="N",
                        help="notebooks exported and run at the same time (default: %(default)s); a GPU host with "
                             "more memory and cores than one stand-in run uses takes several")
    parser.add_argument("--gpu", action="store_true", help="run on this host's GPUs (see below)")
    parser.add_argument("--pipeline", action="store_true",
                        help="run each as a user does, `pipeline.py run --script`: a smoke run in a Jupyter kernel "
                             "on one device, then torchrun, with the scripts' --backend auto (default: torchrun "
                             "alone)")
    parser.add_argument("--backend", choices=("auto", "unsloth", "hf"),
                        help="the scripts' --backend (default: hf, or unsloth with --gpu)")
    parser.add_argument("--nbddp-commit", metavar="REV",
                        help="export and run with nbddp as committed at REV (git archive into WORK), not with this "
                             "working tree, which may be half-edited; e.g. --nbddp-commit HEAD")
    parser.add_argument("--python", type=interpreter, default=sys.executable,
                        help="the interpreter that exports and runs (default: this one, %(default)s)")
    parser.add_argument("--notebooks-python", type=interpreter, metavar="PYTHON",
                        help="the interpreter for the notebooks that pin Transformers 4.x or TRL 0.x (see below)")
    parser.add_argument("--stack", type=parse_stack, action="append", default=[], metavar="PINS=PYTHON",
                        help="repeatable: the interpreter for the notebooks whose install cell pins all of PINS, "
                             "e.g. \"transformers==5.15.0 trl==0.22.2=/tmp/venv/bin/python\" (see below)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/nbddp-sweep"),
                        help="where the notebooks' copies, scripts, stand-ins and outputs go (default: %(default)s)")
    parser.add_argument("--update", action="store_true",
                        help="keep RESULTS' other notebooks and replace only the ones run now (with --only)")
    parser.add_argument("--results", type=Path,
                        help="where summary.json, summary.md and logs/ go (default: tools/sweep_results/cpu or gpu)")
    return parser


def interpreter(value: str) -> str:
    """An interpreter as given (a path, or a name on PATH), absolute: the sweep runs commands from other folders."""
    found = shutil.which(value)
    if found is None:
        raise argparse.ArgumentTypeError(f"{value}: no such interpreter; give the python of a virtual environment, "
                                         "e.g. .venv-nb/bin/python (README.md, \"Run the tests\")")
    return os.path.abspath(found)


@dataclasses.dataclass
class Stack:
    """A --stack: the versions a notebook's install cell must pin (package -> version) and the interpreter."""
    pins: dict[str, str]
    python: str

    @property
    def name(self) -> str:
        """How the tables name it: its pins, "transformers==5.15.0 trl==0.22.2"."""
        return " ".join(f"{package}=={version}" for package, version in self.pins.items())


def parse_stack(value: str) -> Stack:
    """A --stack value "PACKAGE==VERSION ...=PYTHON" (transformers and trl pins only, each once)."""
    found = STACK.match(value)
    if found is None:
        raise argparse.ArgumentTypeError(f"{value!r}: give the pins, then = and the interpreter that has them "
                                         "installed, e.g. \"transformers==5.15.0 trl==0.22.2=/tmp/venv/bin/python\"")
    pins = [pin.split("==") for pin in found["pins"].split()]
    others = sorted({package for package, _ in pins} - set(PINNED))
    if others:
        raise argparse.ArgumentTypeError(f"{value!r}: {', '.join(others)}: the sweep matches only the "
                                         f"{' and '.join(PINNED)} pins of a notebook's install cell")
    twice = sorted({package for package, _ in pins if [p for p, _ in pins].count(package) > 1})
    if twice:
        raise argparse.ArgumentTypeError(f"{value!r}: {', '.join(twice)} pinned twice; give each package once")
    return Stack(dict(pins), interpreter(found["python"]))


def sweep(args) -> int:
    notebooks = select_notebooks(args.notebooks, args.only)
    facts = {path: read_facts(path) for path in notebooks}
    categories = {path: classify(facts[path]) for path in notebooks}
    tally = Counter(categories.values())
    print("notebooks per category: " + ", ".join(f"{c} {tally[c]}" for c in CATEGORIES if tally[c])
          + f" (all {len(notebooks)})", flush=True)
    to_run = chosen_to_run(args, categories)
    results = args.results or REPO / "tools" / "sweep_results" / ("gpu" if args.gpu else "cpu")
    previous = read(results) if args.update else None
    stale_logs = [results / "logs" / slug(path.stem) for path in notebooks] if args.update else [results / "logs"]
    for folder in stale_logs:
        shutil.rmtree(folder, ignore_errors=True)
    args.work.mkdir(parents=True, exist_ok=True)
    args.nbddp = snapshot(args.nbddp_commit, args.work) if args.nbddp_commit else REPO
    environment = describe_environment(args)
    if to_run:
        print(f"building the stand-ins of the {len(to_run)} notebooks to run in {args.work}", flush=True)
    runner = Runner(args, results / "logs", [facts[path] for path in to_run]) if to_run else None
    commit = environment["nbddp"].split()[0]  # this run's, also when --update keeps the sweep's environment
    if previous:  # the sweep's environment as it was; the rerun's commit is on each notebook it ran
        environment = {**previous[0], "updated": f"{environment['date']}: {len(notebooks)} notebooks rerun with nbddp "
                                                 f"{environment['nbddp']}"}
    done = {}  # path -> outcome, in the order they finish
    lock = threading.Lock()

    def one(path: Path) -> None:
        outcome = process(path, categories[path], facts[path], args, runner if path in to_run else None)
        outcome.nbddp = commit
        with lock:
            done[path] = outcome
            print(f"[{len(done)}/{len(notebooks)}] {progress_line(outcome)}", flush=True)
            outcomes = [done[p] for p in notebooks if p in done]
            written[:] = merge(previous[1], outcomes) if previous else outcomes
            write(results, written, environment)  # an interrupted sweep keeps what it did

    written = []
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for finished in [pool.submit(one, path) for path in notebooks]:
            finished.result()
    json_path, markdown_path = results / "summary.json", results / "summary.md"
    print("\n" + table(written))
    print(f"\nwrote {json_path} and {markdown_path}")
    return 0


def snapshot(revision: str, work: Path) -> Path:
    """This repository's files at `revision`, extracted into WORK/nbddp-<commit> (once per commit)."""
    commit = _git(REPO, "rev-parse", "--short", "--verify", f"{revision}^{{commit}}")
    if commit is None:
        raise UsageError(f"--nbddp-commit {revision}: not a commit of {REPO}; give a commit, a branch or HEAD")
    folder = work / f"nbddp-{commit}"
    if not folder.is_dir():
        staging = work / f".nbddp-{commit}.partial"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        archive = subprocess.run(["git", "-C", str(REPO), "archive", commit], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(staging)], input=archive.stdout, check=True)
        staging.rename(folder)
    return folder


def nbddp_environment(args) -> dict:
    """The environment of every command the sweep starts: nbddp imported from the checkout it sweeps."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(args.nbddp), os.environ.get("PYTHONPATH")]))}


def select_notebooks(folder: Path, only: list[str] | None) -> list[Path]:
    """The folder's notebooks outside the AMD/Kaggle/Desktop copies, by name; `only` picks some of them."""
    if not folder.is_dir():
        raise UsageError(f"--notebooks {folder}: no such folder; give the nb/ folder of a checkout of "
                         "unslothai/notebooks (git clone https://github.com/unslothai/notebooks)")
    notebooks = sorted(path for path in folder.glob("*.ipynb") if not COPIES.match(path.name))
    if not only:
        return notebooks
    by_name = {path.stem: path for path in notebooks}
    wanted = [name.removesuffix(".ipynb") for name in only]
    unknown = [name for name in wanted if name not in by_name]
    if unknown:
        import difflib

        hints = [f"{name!r} (closest: {', '.join(difflib.get_close_matches(name, by_name, 2, 0.4)) or 'none'})"
                 for name in unknown]
        raise UsageError(f"--only: no notebook named {'; '.join(hints)} in {folder}; name notebooks by their file "
                         "name, with or without .ipynb")
    return [by_name[name] for name in dict.fromkeys(wanted)]


def chosen_to_run(args, categories: dict[Path, str]) -> set[Path]:
    """None with --no-run; every notebook with --only or --run-all; else --sample N of each category."""
    if args.no_run:
        return set()
    if args.only or args.run_all:
        return set(categories)
    return set(sample(categories, args.sample))


def sample(categories: dict[Path, str], per_category: int) -> list[Path]:
    """`per_category` notebooks of each category, ordered by a hash of their names: the same choice every time."""
    chosen = []
    for category in CATEGORIES:
        members = sorted((p for p, c in categories.items() if c == category),
                         key=lambda p: hashlib.sha256(p.name.encode()).hexdigest())
        chosen += members[:per_category]
    return chosen


def stack_for(facts, args) -> tuple[str, str]:
    """(the stack's name in the tables, its interpreter) for a notebook: of the --stack whose pins its install cell
    all pins, the one with the most (the first given, on a tie); else --notebooks-python ("notebooks") for a
    notebook that pins Transformers 4.x or TRL 0.x, when given; else --python ("main")."""
    fitting = [stack for stack in args.stack if facts.pins_all(stack.pins)]
    if fitting:
        chosen = max(fitting, key=lambda stack: len(stack.pins))  # the first of the longest
        return chosen.name, chosen.python
    if args.notebooks_python and facts.pins_old_stack():
        return "notebooks", args.notebooks_python
    return "main", args.python


def process(path: Path, category: str, facts, args, runner) -> Outcome:
    stack, python = stack_for(facts, args)
    outcome = Outcome(path.stem, category, stack=stack)
    folder = args.work / slug(path.stem)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    shutil.copy(path, folder / "01_nb.ipynb")
    script = folder / "out" / "train.py"
    export = subprocess.run([python, str(args.nbddp / "pipeline.py"), "export", "--notebooks", str(folder),
                             "--out", str(folder / "out")], cwd=folder, capture_output=True, text=True,
                            env=nbddp_environment(args))
    outcome.exported = export.returncode == 0 and script.is_file()
    if not outcome.exported:
        outcome.stage = "export"
        outcome.error = first_error(export.stderr or export.stdout).replace(f"{folder}/", "")
        return outcome
    compiled = subprocess.run([python, "-m", "py_compile", str(script)], capture_output=True, text=True)
    outcome.compiled = compiled.returncode == 0
    if not outcome.compiled:
        outcome.stage, outcome.error = "compile", first_error(compiled.stderr)
        return outcome
    if runner is not None:
        runner.run(outcome, facts, folder, script, python)
    return outcome


class Runner:
    """Runs exported scripts under torchrun from a folder of stand-ins; builds the stand-ins they share once."""

    def __init__(self, args, logs: Path, facts: list):
        import datasets
        import transformers

        datasets.disable_progress_bars()
        transformers.utils.logging.disable_progress_bar()
        self.args, self.logs = args, logs
        self.backend = args.backend or ("unsloth" if args.gpu else "hf")
        ids = sorted({i for f in facts for i in f.dataset_ids} | {i for i in standin_datasets.LAYOUTS
                                                                   if any(f.mentions(i) for f in facts)})
        datasets_root = args.work / "datasets"
        # datasets' cache can hand out an older stand-in's rows for the rebuilt files: every sweep starts without it
        shutil.rmtree(args.work / "hf-home", ignore_errors=True)
        self.datasets = {i: folder for i in ids if (folder := standin_datasets.build(datasets_root, i))}
        self.urls = standin_urls.build(args.work / "urls", [u for f in facts for u in f.urls])
        self._weights = {}  # (python, model folder) -> the folder with weights
        self._building = threading.Lock()

    def weights(self, python: str, source: Path) -> Path:
        """`source` with weights written by `python`'s Transformers (their layouts differ), built once."""
        if (python, source) not in self._weights:
            code = ("from nbddp.examples.tiny_model import ensure_weights; "
                    f"print(ensure_weights({str(source)!r}))")
            built = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True,
                                   env=nbddp_environment(self.args))
            self._weights[python, source] = Path(built.stdout.strip().splitlines()[-1])
        return self._weights[python, source]

    def run(self, outcome: Outcome, facts, folder: Path, script: Path, python: str) -> None:
        with self._building:  # the stand-ins' folders are shared: built one run at a time, run side by side
            self.assemble(facts, folder, python, outcome)
        if outcome.stage == "standins":
            return
        log_dir = self.logs / slug(outcome.notebook)
        outcome.ran = True
        started = time.monotonic()
        status = run_with_timeout(self.command(script, python), folder, self.environment(facts), log_dir,
                                  self.args.timeout)
        outcome.seconds = round(time.monotonic() - started, 1)
        outcome.passed = status == 0
        if not outcome.passed:
            output = (log_dir / "run.stderr").read_text(errors="replace")
            outcome.stage = "run"
            outcome.error = after_failed_download(first_error(output) if status is not None else (
                f"timed out after {self.args.timeout} s; last: {first_error(output)}"), output)
        for name in ("run.stdout", "run.stderr"):
            keep_tail(log_dir / name, LOG_LIMIT)

    def assemble(self, facts, folder: Path, python: str, outcome: Outcome) -> None:
        """The notebook's stand-ins beside it, or outcome.stage "standins" with the reason."""
        vision = facts.loads_vision_model()
        source = standins.model_source(REPO, vision, facts.model_ids, facts.uses_video())
        if source is None:
            outcome.stage = "standins"
            outcome.error = "no stand-in model: its folder in models/ is missing"
            return
        image_token = standins.image_token(facts.chat_templates) if vision else None
        own_template = standins.own_vision_template(facts.model_ids) if vision else None
        family = standins.family_template(facts.model_ids) if not vision and source.name == "tiny-chat" else None
        muse_glimmer = not vision and source.name == "tiny-chat" and standins.is_muse_glimmer(facts.model_ids)
        if image_token:
            source = standins.vision_variant(source, image_token, self.args.work / "models")
        elif own_template:
            name, template, token = own_template
            source = standins.vision_variant(source, token, self.args.work / "models", (name, template))
        elif muse_glimmer:
            source = standins.muse_glimmer_variant(source, self.args.work / "models")
        elif family:
            source = standins.text_variant(source, family, self.args.work / "models",
                                           standins.takes_text_parts(facts.model_ids))
        if vision and "AutoModelForCausalLM" in facts.auto_models:  # a remote-code vision model's own class
            source = standins.remote_code_variant(source, "AutoModelForCausalLM", self.args.work / "models")
        model = self.weights(python, source)
        if source.name == "tiny-orpheus":
            model = standins.speaking_orpheus_variant(model, self.args.work / "models")
        datasets = {i: self.datasets[i] for i in self.datasets if i in facts.dataset_ids or facts.mentions(i)}
        # beside the notebook, where its cells run (the script's workdir), as a user's data would be
        standins.assemble(folder, standins.model_standin_names(facts.model_ids), model, datasets)
        (self.logs / slug(outcome.notebook)).mkdir(parents=True, exist_ok=True)

    def command(self, script: Path, python: str) -> list[str]:
        """`pipeline.py run --script` with --pipeline, else torchrun of the script alone."""
        if self.args.pipeline:
            device = [] if self.args.gpu else ["--device", "cpu"]
            return [python, str(self.args.nbddp / "pipeline.py"), "run", "--script", str(script),
                    "--nproc-per-node", str(self.args.nproc_per_node), *device]
        return [python, "-m", "torch.distributed.run", "--standalone",
                "--nproc_per_node", str(self.args.nproc_per_node), str(script), "--backend", self.backend]

    def environment(self, facts) -> dict:
        """The run's variables: the hub offline, training capped, the URLs the notebook names answered locally."""
        environment = {**nbddp_environment(self.args), "HF_HUB_OFFLINE": "1", "HF_HOME": str(self.args.work / "hf-home"),
                       ENV.MAX_STEPS: str(self.args.steps), ENV.TIMEOUT_S: str(self.args.timeout),
                       "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1"}
        urls = {url: self.urls[url] for url in facts.urls if url in self.urls}
        environment.update(standin_urls.environment(urls, environment["PYTHONPATH"]))
        if not self.args.gpu:
            environment["CUDA_VISIBLE_DEVICES"] = ""
        return environment


def run_with_timeout(command, cwd: Path, environment: dict, log_dir: Path, timeout: int) -> int | None:
    """The command's exit status, or None when it ran past `timeout` (then its whole process group is ended)."""
    with open(log_dir / "run.stdout", "w") as stdout, open(log_dir / "run.stderr", "w") as stderr:
        process = subprocess.Popen(command, cwd=cwd, env=environment, stdout=stdout, stderr=stderr,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            return process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            return None


def keep_tail(path: Path, limit: int) -> None:
    text = path.read_text(errors="replace")
    if len(text) > limit:
        path.write_text(f"[nbddp sweep: first {len(text) - limit} characters cut]\n" + text[-limit:])


def progress_line(outcome: Outcome) -> str:
    steps = [("export", outcome.exported), ("compile", outcome.compiled)]
    done = " ".join(f"{name} ok" for name, ok in steps if ok)
    if outcome.ran:
        done += f" run {'passed' if outcome.passed else 'failed'} {outcome.seconds:.0f}s"
    failure = f" -- {outcome.stage}: {outcome.error}" if outcome.error else ""
    return f"{outcome.notebook} [{outcome.category}] {done}{failure}"


def describe_environment(args) -> dict:
    """When, what, where, how; the versions of each stack the sweep runs with ("versions", "notebooks' stack",
    "stack PINS" for each --stack). UsageError for two --stack of the same pins, or one whose interpreter has other
    versions than its pins."""
    described = _describe(args, args.python)
    if args.notebooks_python:
        described["notebooks' stack"] = _describe(args, args.notebooks_python)["versions"]
    names = [stack.name for stack in args.stack]
    if len(set(names)) < len(names):
        twice = sorted({name for name in names if names.count(name) > 1})
        raise UsageError(f"--stack {', '.join(map(repr, twice))} given twice; give each set of pins once, with the "
                         "one interpreter that runs its notebooks")
    for stack in args.stack:
        versions = _versions(args, stack.python)
        check_stack(stack, versions)
        described[f"stack {stack.name}"] = ", ".join(f"{name} {version}" for name, version in versions.items()
                                                     if name != "device")
    return described


def check_stack(stack: Stack, versions: dict[str, str]) -> None:
    """UsageError unless `versions` (installed package -> version) has each of the stack's pins."""
    wrong = [f"{package} {versions.get(package, 'not installed')}, not {version}"
             for package, version in stack.pins.items() if versions.get(package) != version]
    if wrong:
        raise UsageError(f"--stack \"{stack.name}={stack.python}\": {stack.python} has {'; '.join(wrong)}; give the "
                         "interpreter of a virtual environment with exactly those pins installed")


def _versions(args, python: str) -> dict[str, str]:
    """The versions of torch, transformers, trl, peft, datasets (and unsloth, unsloth_zoo) that `python` imports,
    and "device": what torch sees."""
    probe = ("import json, importlib.metadata as m, torch\n"
             "v = {p: m.version(p) for p in ('torch', 'transformers', 'trl', 'peft', 'datasets')}\n"
             "for p in ('unsloth', 'unsloth_zoo'):\n"
             "    try: v[p] = m.version(p)\n"
             "    except m.PackageNotFoundError: pass\n"
             "v['device'] = torch.cuda.get_device_name(0) + f' x{torch.cuda.device_count()}' "
             "if torch.cuda.is_available() else 'CPU'\n"
             "print(json.dumps(v))")
    environment = {} if args.gpu else {"CUDA_VISIBLE_DEVICES": ""}
    return json.loads(subprocess.run([python, "-c", probe], capture_output=True, text=True, check=True,
                                     env={**os.environ, **environment}).stdout)


def _describe(args, python: str) -> dict:
    versions = _versions(args, python)
    device = versions.pop("device")
    if device == "CPU":
        device = f"CPU ({platform.machine()}, {os.cpu_count()} cores)"
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "notebooks": f"unslothai/notebooks {notebooks_commit(args)} ({args.notebooks})",
            "nbddp": nbddp_commit(args), "device": device,
            "run": (f"pipeline.py run --script (smoke, then torchrun) --nproc-per-node {args.nproc_per_node}, "
                    "--backend auto" if args.pipeline else
                    f"torchrun --nproc_per_node {args.nproc_per_node}, --backend "
                    f"{args.backend or ('unsloth' if args.gpu else 'hf')}") + f", {ENV.MAX_STEPS}={args.steps}, "
                   f"timeout {args.timeout} s, HF_HUB_OFFLINE=1",
            "versions": ", ".join(f"{name} {version}" for name, version in versions.items())}


def notebooks_commit(args) -> str:
    if args.notebooks_commit:  # also for a folder inside another checkout, whose HEAD is not the notebooks'
        return args.notebooks_commit
    return _git(args.notebooks, "rev-parse", "--short", "HEAD") or "unknown commit"


def nbddp_commit(args) -> str:
    if args.nbddp_commit:
        return args.nbddp.name.removeprefix("nbddp-") + " (committed)"
    commit = _git(REPO, "rev-parse", "--short", "HEAD") or "unknown"
    changed = _git(REPO, "status", "--porcelain", "--untracked-files=no", "--", "nbddp", "pipeline.py")
    return commit + (" and the working tree's uncommitted changes to nbddp/" if changed else "")


def _git(folder: Path, *arguments) -> str | None:
    result = subprocess.run(["git", "-C", str(folder), *arguments], capture_output=True, text=True)
    return result.stdout.strip() if result.returncode == 0 else None


if __name__ == "__main__":
    sys.exit(main())
