"""What the whole suite shares: the tier and the number of xdist workers a command line gets, the reference DDP runs
(tests/fixtures/e2e/reference_runs.py) that the default tier's end-to-end tests read, and the tiny Llama that the
runtime's and the fallback's tests load (tests/runtime, tests/fallback). The runs take about a minute of CPU, so they
start in the background as soon as the first test of a session that selected such a test begins, and overlap with the
rest of the suite; the tests wait for them. Under pytest-xdist every worker shares one set (the first worker to ask
starts it)."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

# One thread a process: xdist's workers share the cores, and each test's children (papermill kernels, torchrun's
# ranks) run beside the other worker's, so a thread a core in every process oversubscribes them (PyTorch's CPU
# threads then wait on each other). Measured on 2 cores: 17 e2e tests, 128 s with PyTorch's default, 80 s with this
# (tests/TIMINGS.md). On 2 cores it is what `nbddp launch` gives each of 2 ranks anyway (cores / processes); a value
# set already wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def names_single_tests(config):
    """The command line names tests (`path::name`), not files, folders or the whole suite."""
    return bool(config.args) and all("::" in arg for arg in config.args)


def pytest_configure(config):
    """A test named on the command line runs whatever its tier: pyproject.toml's `-m "not e2e"` picks the default
    tier of the whole suite, a file or a folder."""
    if names_single_tests(config) and config.option.markexpr == "not e2e":
        config.option.markexpr = ""


def pytest_xdist_auto_num_workers(config):
    """Workers for `-n auto` (pyproject.toml's addopts): none for tests named on the command line, whose run the
    workers' start-up (seconds) would only slow; otherwise xdist's own count, a worker per core."""
    return 0 if names_single_tests(config) else None


def pytest_collection_modifyitems(items):
    """The slowest first, so that xdist's workers finish together rather than one waiting on a long test at the end:
    e2e tests, then the rest, then those reading the reference runs, which have run in the background meanwhile.
    (A stable sort: each group keeps pytest's order.)"""
    def group(item):
        if item.get_closest_marker("e2e"):
            return 0
        return 2 if "ddp_reference_runs" in getattr(item, "fixturenames", ()) else 1

    items.sort(key=group)


REFERENCE_RUNS = Path(__file__).parent / "fixtures" / "e2e" / "reference_runs.py"
REFERENCE_RUNS_BOUND_S = 1200  # export and two short trainings, on a 2-core machine shared with other work


def reference_runs_dir(tmp_path_factory):
    """A folder every worker of this session sees: the session's base temporary folder (xdist: the folder above
    the workers' own)."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "ddp-reference-runs"


@pytest.fixture(autouse=True)
def forget_batch_plans():
    """Each test starts with no batch plans made: nbddp.runtime.memory.batch_plan keeps the plans a process made (a
    trainer that rebuilds its config finds its plan there by layout), so a test would otherwise find an earlier
    test's plan of the same layout in the same worker. Nothing to do where no test imported it."""
    yield
    module = sys.modules.get("nbddp.runtime.memory.batch_plan")
    if module is not None:
        module._built.clear()


@pytest.fixture(scope="session", autouse=True)
def start_reference_runs(request, tmp_path_factory):
    """Start the reference runs once per session, if a selected test reads them."""
    if not any("ddp_reference_runs" in getattr(item, "fixturenames", ()) for item in request.session.items):
        return
    out = reference_runs_dir(tmp_path_factory)
    try:
        out.mkdir()  # atomic: the first worker to get here starts them
    except FileExistsError:
        return
    # The run that outlives them all: xdist's controller (the workers' parent), or this process.
    session_pid = os.getppid() if os.environ.get("PYTEST_XDIST_WORKER") else os.getpid()
    with open(out / "driver.log", "w") as log:
        driver = subprocess.Popen([sys.executable, str(REFERENCE_RUNS), str(out), str(session_pid)], stdout=log,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    (out / "driver.pid").write_text(str(driver.pid))


def running(pid):
    """The process exists and has not exited (a zombie, not yet reaped by its parent, has)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture(scope="session")
def ddp_reference_runs(tmp_path_factory):
    """The reference runs' folder once they have finished: results.json ({step: {returncode, stdout, stderr}}),
    generated/, one/, two/, saves.log, trained_logits.pt. Fails if a step failed."""
    out = reference_runs_dir(tmp_path_factory)
    results_path = out / "results.json"
    deadline = time.monotonic() + REFERENCE_RUNS_BOUND_S
    while not results_path.exists():
        driver_pid = (out / "driver.pid").read_text() if (out / "driver.pid").exists() else ""
        if time.monotonic() > deadline or (driver_pid and not running(int(driver_pid))):
            if not results_path.exists():  # it may have written them just now
                log = (out / "driver.log").read_text() if (out / "driver.log").exists() else ""
                pytest.fail(f"the reference runs ended or took {REFERENCE_RUNS_BOUND_S} s without results; "
                            f"{out / 'driver.log'}:\n{log}")
        time.sleep(0.2)
    results = json.loads(results_path.read_text())
    for step, result in results.items():
        output = result["stdout"][-3000:] + result["stderr"][-6000:]
        assert result["returncode"] == 0, f"{step}: {result['command']}\n{output}"
    assert set(results) == {"export", "one", "two"}
    return out


# The tiny Llama of tests/runtime and tests/fallback. It ships only its config and tokenizer, as models/tiny-llama
# does (models/build_tiny_llama.py); `ensure_weights` builds its weights in the test's model cache on first load.

TINY_LLAMA_WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran", "far", "away"]


def write_tiny_llama(directory):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{word: index + 3 for index, word in enumerate(TINY_LLAMA_WORDS)}}
    word_level = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    word_level.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=word_level, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                        model_input_names=["input_ids", "attention_mask"])  # as Llama's: no token_type_ids
    tokenizer.save_pretrained(directory)
    LlamaConfig(
        vocab_size=100,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        bos_token_id=1,
        eos_token_id=2,
    ).save_pretrained(directory)
    return directory


@pytest.fixture
def tiny_llama_dir(tmp_path):
    return write_tiny_llama(tmp_path / "tiny-llama")


@pytest.fixture
def model_cache(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("NBDDP_CACHE", str(cache))
    return cache


@pytest.fixture
def tiny_model_path(tiny_llama_dir, model_cache):
    """The tiny Llama with its weights built, as `FastLanguageModel.from_pretrained` takes it."""
    from nbddp.examples.tiny_model import ensure_weights

    return ensure_weights(str(tiny_llama_dir))


@pytest.fixture
def backend_patches_undone_after():
    """Every patch nbddp applied (nbddp/patches.py), during the test or before it, undone after it: a later
    test must meet the libraries' own classes."""
    yield
    from nbddp import patches

    patches.undo()
