"""A real Unsloth notebook's exported script on one GPU, as written (A) vs `--batch_layout auto` (B).

    python -m bench.layout_notebook run --out $OUT --parts alpaca_8b,alpaca_1b,conversational_3b --deadline-s 540
    python -m bench.layout_notebook summarize --out FILES_AT --json layout_1gpu.json   # again, here, afterwards

Run by bench/layout_1gpu.sh (one device call, kind nvidia-h200, carry .gpu-site). Nothing downloads: each
part copies a notebook of unslothai/notebooks from `.gpu-site/notebooks/` (git-ignored and carried, never
committed: fetched material; `SOURCE.txt` there names the commit), unmodified or with the one line its `edit`
names changed, into `<work>/<part>/nb/01_nb.ipynb`,
exports it with `pipeline.py export`, and runs `<work>/<part>/nb/out/train.py` from `<work>/<part>/`, where
stand-ins sit under the hub ids the notebook names:

- the model id (and the names Unsloth's mapper turns it into under `load_in_4bit`, e.g. `unsloth/Llama-3.1-8B` ->
  `unsloth/Llama-3.1-8B-unsloth-bnb-4bit`): folders of symlinks to a random-init bf16 model of the part's shape
  (bench/materialize.py, once per machine under `<work>/models/<shape>`; Unsloth quantizes it to 4 bits as it
  loads), with a word-level tokenizer of LAYOUT_VOCAB entries (default 32,000, a real tokenizer's size: the tiny
  one's 120 ids grown with made-up words; 0 keeps the tiny one); the conversational part adds the Llama-3 header
  tokens and role words;
- the dataset id: a folder with `train.jsonl` of seeded rows in the notebook's columns. LAYOUT_LENGTHS=heavy (the
  default on a GPU): 2,000 rows (LAYOUT_ROWS) whose lengths follow alpaca-cleaned's under the Llama-3.1 tokenizer
  (p10/p50/p90/max 69/163/354/955 tokens); uniform: 1,024 rows of L tokens, L uniform on 256..512. Alpaca rows
  (instruction/input/output; 60% with an empty input as in alpaca-cleaned) whose formatted training text (the
  notebook's own alpaca_prompt + EOS, BOS from the tokenizer) is exactly L tokens; ShareGPT rows (`conversations`
  of from/value turns, 1 or 2 exchanges, plus `source` and `score` as FineTome's) aimed at the same lengths after
  the llama-3.1 chat template (within about 10 tokens: the template is Unsloth's).

LAYOUT_PROFILE_STEPS=FIRST-LAST runs every trial through bench/timed_run.py: its device step times and a
torch.profiler trace of those steps, summarised per step (bench.profile_summary: kernel-busy and idle time, kernel
launches, host<->device copies, checkpoint function calls), come back as the trial's `rank0*.json`.

Each round runs A (`LAYOUT_A_FLAGS`, default none: the notebook as written) then B (`LAYOUT_B_FLAGS`, default
`--batch_layout auto`), with `LAYOUT_A_ENV` / `LAYOUT_B_ENV` (`NAME=VALUE ...`, e.g. the run setting
`cuda_graphs` as NBDDP_CUDA_GRAPHS=1) added to that variant's environment, each a fresh `torchrun --nproc_per_node
1` (`LAYOUT_LAUNCH=python`: plain python) with NBDDP_OUTPUT_DIR set to the trial's folder, so every trial keeps its
metrics.jsonl and checkpoint. The notebook's own 60 steps and 2 x 4 layout unless LAYOUT_MAX_STEPS is set. A part
starts only if its preparation and first pair fit before the deadline, a trial only if it is expected to end before
it (a pair's A only if its B fits too; before a part's first trial each is guessed at the part's `first_trial_s`,
or LAYOUT_FIRST_TRIAL_S seconds where set, for shortened trials); one running at the deadline is stopped. After
every trial `<out>/layout_1gpu.json` is rewritten (`summarize`).

CPU check (no GPU, no Unsloth): LAYOUT_TINY=1 puts the tiny model (nbddp.examples.tiny_model.ensure_weights of
models/tiny-llama; its embeddings grown, seeded, where the tokenizer is larger: the conversational part's chat
tokens, LAYOUT_VOCAB) under every stand-in name and shortens the rows (LAYOUT_MIN_TOKENS/LAYOUT_MAX_TOKENS, default
128..256 with it; uniform lengths and the tiny tokenizer unless LAYOUT_LENGTHS/LAYOUT_VOCAB say otherwise); the
script then runs on the Transformers+PEFT backend.
"""
import argparse
import dataclasses
import datetime
import gzip
import hashlib
import importlib.metadata
import importlib.util
import json
import math
import os
import random
import re
import runpy
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench import stats
from nbddp.formats import metrics
from nbddp.formats.run_settings import ENV

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO / ".gpu-site" / "notebooks"
TINY_MODEL = REPO / "models" / "tiny-llama"
SUMMARY = "layout_1gpu.json"
PACKAGES = ("torch", "transformers", "trl", "peft", "unsloth", "unsloth_zoo", "accelerate", "datasets",
            "bitsandbytes", "triton")
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "UNSLOTH_DISABLE_STATISTICS": "1", "PYTHONUNBUFFERED": "1"}
# Never let a process use NVLink multicast (it can take the host's shared GPUs down).
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
DATA_ROWS = 1024
HEAVY_ROWS = 2000  # rows of alpaca-cleaned-shaped data (LAYOUT_LENGTHS=heavy)
LOG_GZ_LIMIT = 1 << 20  # bytes of a trial's gzipped console that come back (a device call returns < 16 MiB)
SEED = 3407
# Llama-3 chat tokens (special) and role words (plain) the llama-3.1 template writes; train_on_responses_only
# finds the answers by `<|start_header_id|>assistant<|end_header_id|>\n\n`, which the tiny vocabulary lacks.
CHAT_SPECIAL = ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                "<|eom_id|>", "<|python_tag|>")
CHAT_WORDS = ("system", "user", "assistant", "ipython")
# Tokens the llama-3.1 template adds with this tokenizer: BOS(es) and the system block (its date lines are <unk>s),
# then per message the header, blank line and eot. Checked on CPU against Unsloth's template text: rows land within
# a few tokens of their target.
CHAT_OVERHEAD = (24, 6)


@dataclasses.dataclass(frozen=True)
class Part:
    notebook: str  # file name under .gpu-site/notebooks/
    shape: str  # bench/configs/<shape>
    data: str  # "alpaca" | "sharegpt"
    chat_tokens: bool  # add the Llama-3 chat tokens to the tokenizer
    first_trial_s: int  # guess before a trial of the part has run (trials then count their slowest)
    prepare_s: int  # guess for materialization when the model is not there yet
    max_trial_s: int  # a trial still running then is hung
    edit: tuple[str, str] | None = None  # (old, new): the one line of the notebook a researcher would change


PARTS = {
    "alpaca_8b": Part("Llama3.1_(8B)-Alpaca.ipynb", "llama3-8b", "alpaca", False, 150, 45, 330),
    "alpaca_1b": Part("Llama3.1_(8B)-Alpaca.ipynb", "llama-1.1b", "alpaca", False, 80, 15, 240),
    # bf16 LoRA: the line the notebook's own comment offers ("Use 4bit quantization to reduce memory usage. Can be
    # False."); Unsloth's text notebooks that train in 16 bits as written are not Llama (Gemma, LFM2, Qwen3 MoE)
    "alpaca_1b_bf16": Part("Llama3.1_(8B)-Alpaca.ipynb", "llama-1.1b", "alpaca", False, 80, 15, 240,
                           edit=("load_in_4bit = True", "load_in_4bit = False")),
    "conversational_3b": Part("Llama3.2_(1B_and_3B)-Conversational.ipynb", "llama3.2-3b", "sharegpt", True, 110,
                              25, 270),
}
VARIANTS = ("A", "B")
TINY_FIRST_TRIAL_S, TINY_MAX_TRIAL_S = 30, 300


def log(text):
    print(f"[layout] {text}", flush=True)


def tiny_mode():
    return os.environ.get("LAYOUT_TINY", "") not in ("", "0")


# ---------------------------------------------------------------------------------------------------------------
# What the notebook names


def code_source(notebook_path):
    cells = json.loads(Path(notebook_path).read_text(encoding="utf-8"))["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


def notebook_facts(source):
    """The hub ids and settings a notebook's code names: the model of its first from_pretrained, load_in_4bit, the
    dataset of its first load_dataset, its Alpaca template and the folder of its first `model.save_pretrained` (None
    without one)."""
    model = re.search(r"from_pretrained\(\s*model_name\s*=\s*[\"']([^\"']+)[\"']", source)
    dataset = re.search(r"load_dataset\(\s*[\"']([^\"']+)[\"']", source)
    four_bit = re.search(r"^load_in_4bit\s*=\s*(True|False)", source, re.M)
    prompt = re.search(r'alpaca_prompt\s*=\s*"""(.*?)"""', source, re.S)
    saved = re.search(r"^\s*model\.save_pretrained\(\s*[\"']([^\"']+)[\"']\s*\)", source, re.M)
    if not model or not dataset:
        raise ValueError("the notebook names no from_pretrained(model_name=...) or no load_dataset(...)")
    return {"model_id": model.group(1), "dataset_id": dataset.group(1),
            "load_in_4bit": four_bit is None or four_bit.group(1) == "True",
            "alpaca_prompt": prompt.group(1) if prompt else None, "adapter_dir": saved.group(1) if saved else None}


def unsloth_names(model_id, load_in_4bit):
    """The model id, and what Unsloth's own mapper (read, not imported: importing Unsloth needs a GPU) loads
    instead, plus the plain `-bnb-4bit` name: every name a stand-in must answer to."""
    names = [model_id]
    if load_in_4bit:
        names += [model_id + "-bnb-4bit", model_id + "-unsloth-bnb-4bit"]
        spec = importlib.util.find_spec("unsloth")
        if spec is not None and spec.submodule_search_locations:
            mapper = Path(list(spec.submodule_search_locations)[0]) / "models" / "mapper.py"
            try:
                table = runpy.run_path(str(mapper)).get("FLOAT_TO_INT_MAPPER", {})
                mapped = table.get(model_id.lower()) or table.get(model_id)
                if mapped:
                    names.append(mapped)
            except Exception as error:  # the extra names above cover the usual mappings
                log(f"could not read Unsloth's mapper {mapper}: {error}")
    names += [n.lower() for n in names]  # hub ids are case-insensitive; a lowercased one must find a folder too
    return list(dict.fromkeys(names))


# ---------------------------------------------------------------------------------------------------------------
# Stand-ins


def chat_tokenizer(out_dir, max_length, base_dir=TINY_MODEL):
    """The tokenizer in `base_dir` (the tiny one: ids from 120 up) with the Llama-3 chat tokens and role words added."""
    from transformers import AutoTokenizer

    out_dir = Path(out_dir)
    if (out_dir / "tokenizer.json").exists():
        return out_dir
    tokenizer = AutoTokenizer.from_pretrained(str(base_dir))
    tokenizer.add_special_tokens({"additional_special_tokens": list(CHAT_SPECIAL)})
    tokenizer.add_tokens(list(CHAT_WORDS))
    tokenizer.model_max_length = max_length
    partial = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    tokenizer.save_pretrained(str(partial))
    config_path = partial / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"  # as the tiny tokenizer's config names it
    for key in ("is_local", "local_files_only"):  # where it was loaded from: not the stand-in's business
        config.pop(key, None)
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(partial, out_dir)
    return out_dir


def syllable_words(count, seed=SEED):
    """`count` distinct made-up lowercase words of two to four syllables, seeded."""
    consonants, vowels = "bcdfghjklmnprstvwz", "aeiou"
    syllables = [c + v for c in consonants for v in vowels]
    rng = random.Random(seed)
    words = set()
    while len(words) < count:
        words.add("".join(rng.choice(syllables) for _ in range(rng.randint(2, 4))))
    return sorted(words)


def large_tokenizer(out_dir, size, base_dir=TINY_MODEL):
    """The tiny word-level tokenizer grown to `size` entries with made-up words (each one token with and without a
    leading space, so bench.make_data.vocabulary_words finds them), as large as a real model's tokenizer (32,000 and
    more): the rows then spread over as many embedding rows as real text does."""
    out_dir = Path(out_dir)
    if (out_dir / "tokenizer.json").exists():
        return out_dir
    tokenizer = json.loads((Path(base_dir) / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    fresh = [w for w in syllable_words(size) if w not in vocab and " " + w not in vocab]
    for word in fresh:
        if len(vocab) + 2 > size:
            break
        vocab[word] = len(vocab)
        vocab[" " + word] = len(vocab)
    partial = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    (partial / "tokenizer.json").write_text(json.dumps(tokenizer))
    for name in TOKENIZER_FILES[1:]:
        if (Path(base_dir) / name).exists():
            shutil.copyfile(Path(base_dir) / name, partial / name)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(partial, out_dir)
    return out_dir


def place_standin(model_dir, dest, tokenizer_dir=None):
    """`dest`: symlinks to the model folder's files, the tokenizer's files copied from `tokenizer_dir` if given."""
    dest = Path(dest)
    if dest.is_symlink() or dest.is_file():
        dest.unlink()
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for path in sorted(Path(model_dir).iterdir()):
        if path.is_file() and not (tokenizer_dir and path.name in TOKENIZER_FILES):
            (dest / path.name).symlink_to(path.resolve())
    if tokenizer_dir:
        for path in sorted(Path(tokenizer_dir).iterdir()):
            if path.is_file():
                shutil.copyfile(path, dest / path.name)


def target_lengths(count, low, high, seed):
    rng = random.Random(seed)
    return [rng.randint(low, high) for _ in range(count)]


# Tokens per row of yahma/alpaca-cleaned under the Llama-3.1 tokenizer, formatted as the notebook does (p10/p50/p90
# 69/163/354, max 955): a lognormal with that median and p90, cut at that max and at the shortest row a template
# leaves room for.
HEAVY_MEDIAN, HEAVY_P90, HEAVY_MAX = 163, 354, 955


def heavy_tail_lengths(count, low, seed):
    """`count` row lengths drawn from alpaca-cleaned's distribution (above), none under `low`."""
    rng = random.Random(seed)
    sigma = math.log(HEAVY_P90 / HEAVY_MEDIAN) / 1.2816  # the 90th percentile of a standard normal
    return [min(HEAVY_MAX, max(low, round(rng.lognormvariate(math.log(HEAVY_MEDIAN), sigma)))) for _ in range(count)]


def quantiles(values):
    """p10/p50/p90 (bench.stats.quantile), min, max and mean of the row lengths."""
    return {"p10": stats.quantile(values, 0.1), "p50": stats.quantile(values, 0.5), "p90": stats.quantile(values, 0.9),
            "max": max(values), "min": min(values), "mean": sum(values) / len(values)}


def _words(tokenizer):
    from bench.make_data import vocabulary_words

    words = vocabulary_words(tokenizer)
    vocab = tokenizer.get_vocab()
    starts = [w for w in ("Copy", "Give", "Reverse", "Sort") if w in vocab] or words
    return words, starts


def alpaca_row(tokenizer, prompt, eos, words, starts, target, rng):
    """A row in alpaca-cleaned's columns whose `prompt.format(...) + eos` tokenizes to exactly `target` tokens."""
    budget = target - len(tokenizer.encode(prompt.format("", "", "") + eos).ids)  # tokens the three fields get
    if budget < 8:
        raise ValueError(f"target {target} leaves {budget} tokens after the template")
    instruction = " ".join([rng.choice(starts)] + [rng.choice(words)
                                                   for _ in range(rng.randint(3, min(11, budget // 4)))]) + "."
    row_input = "" if rng.random() < 0.6 else " ".join(rng.choice(words)
                                                        for _ in range(rng.randint(1, min(80, budget // 3))))
    count, length = 1, None
    for _ in range(8):
        output = " ".join(rng.choice(words) for _ in range(count)) + "."
        row = {"instruction": instruction, "input": row_input, "output": output}
        length = len(tokenizer.encode(prompt.format(instruction, row_input, output) + eos).ids)
        if length == target:
            return row
        count += target - length
        if count < 1:
            raise ValueError(f"target {target} is shorter than the row without an output ({length} tokens)")
    raise ValueError(f"could not reach exactly {target} tokens (last try {length})")


def sharegpt_row(words, target, rng):
    """A row in FineTome-100k's columns aimed at `target` tokens after the llama-3.1 chat template."""
    exchanges = 1 if rng.random() < 0.7 else 2
    budget = target - CHAT_OVERHEAD[0] - CHAT_OVERHEAD[1] * 2 * exchanges
    questions = [rng.randint(10, 60) for _ in range(exchanges)]
    answer_total = max(exchanges, budget - sum(questions) - 2 * exchanges)  # each message ends with "."
    answers = [answer_total // exchanges] * exchanges
    answers[-1] += answer_total - sum(answers)
    turns = []
    for asked, answered in zip(questions, answers):
        turns.append({"from": "human", "value": " ".join(rng.choice(words) for _ in range(asked)) + "."})
        turns.append({"from": "gpt", "value": " ".join(rng.choice(words) for _ in range(answered)) + "."})
    return {"conversations": turns, "source": "nbddp-bench-standin", "score": 5.0}


def write_dataset(dest, kind, tokenizer_json, prompt, eos, low, high, rows=DATA_ROWS, seed=SEED, heavy=False):
    """`dest/train.jsonl`; returns what it holds (row count, target token lengths: uniform on low..high, or
    alpaca-cleaned's heavy tail from `low` up)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    words, starts = _words(tokenizer)
    rng = random.Random(seed)
    if heavy:  # the shortest row the template leaves room for (ShareGPT: two exchanges of the longest questions)
        low = max(low, len(tokenizer.encode(prompt.format("", "", "") + eos).ids) + 12 if kind == "alpaca" else 180)
    lengths = heavy_tail_lengths(rows, low, seed) if heavy else target_lengths(rows, low, high, seed)
    dest = Path(dest)
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    with open(dest / "train.jsonl", "w", encoding="utf-8") as out:
        for target in lengths:
            if kind == "alpaca":
                row = alpaca_row(tokenizer, prompt, eos, words, starts, target, rng)
            else:
                row = sharegpt_row(words, target, rng)
            out.write(json.dumps(row) + "\n")
    return {"kind": kind, "rows": rows, "seed": seed, "exact_lengths": kind == "alpaca",
            "target_tokens": {"low": low, "high": HEAVY_MAX if heavy else high,
                              "distribution": "alpaca-cleaned's heavy tail" if heavy else "uniform integers",
                              "median": statistics.median(lengths), **quantiles(lengths)}}


# ---------------------------------------------------------------------------------------------------------------
# Preparing a part


def trial_env(part_dir, output_dir=None):
    env = dict(os.environ)
    env.update(OFFLINE_ENV)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    if not tiny_mode():
        env["CUDA_VISIBLE_DEVICES"] = "0"
    if output_dir is not None:
        env[ENV.OUTPUT_DIR] = str(output_dir)
    if os.environ.get("LAYOUT_MAX_STEPS"):
        env[ENV.MAX_STEPS] = os.environ["LAYOUT_MAX_STEPS"]
    env.update(SAFE_ENV)
    return env


def materialize_model(shape, work):
    """The model folder of `shape` (once per machine: bench.materialize keeps an identical one) and seconds spent."""
    started = time.monotonic()
    if tiny_mode():
        sys.path.insert(0, str(REPO))
        from nbddp.examples.tiny_model import ensure_weights

        return Path(ensure_weights(str(TINY_MODEL))), time.monotonic() - started
    for ready in model_candidates(shape, work):
        if ready is not None:
            return ready, time.monotonic() - started
    out = Path(work) / "models" / shape
    subprocess.run([sys.executable, "-m", "bench.materialize", "--shape", shape, "--out", str(out)], check=True,
                   cwd=REPO, env={**os.environ, **SAFE_ENV, "CUDA_VISIBLE_DEVICES": "0"})
    return out, time.monotonic() - started


def grown_tiny_model(model_dir, out_dir, vocab_size):
    """The tiny model in `model_dir` with its embeddings grown to `vocab_size` rows (seeded), once, in `out_dir`: a
    stand-in for a tokenizer larger than its 120 ids."""
    out_dir = Path(out_dir)
    if (out_dir / "config.json").exists():
        return out_dir
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    model.resize_token_embeddings(vocab_size, mean_resizing=False)
    partial = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(str(partial))
    for name in TOKENIZER_FILES:
        if (Path(model_dir) / name).is_file():
            shutil.copyfile(Path(model_dir) / name, partial / name)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(partial, out_dir)
    return out_dir


def model_candidates(shape, work):
    """Model folders of `shape` already on this machine (ours, or bench.harness's in /tmp/bench), None for each
    folder that is not there or was made from another config or seed."""
    from bench.materialize import STAMP, shape_config, stamp_for

    expected = stamp_for(shape, 0, shape_config(shape))
    found = []
    for folder in (Path(work) / "models" / shape, Path("/tmp/bench/models") / shape):
        try:
            found.append(folder if json.loads((folder / STAMP).read_text()) == expected else None)
        except (OSError, ValueError):
            found.append(None)
    return found


def model_ready(shape, work):
    return tiny_mode() or any(model_candidates(shape, work))


def prepare_part(name, part, work):
    """Export the notebook and lay out its stand-ins under `<work>/<name>/`; returns the part's facts."""
    started = time.monotonic()
    part_dir = Path(work) / name
    notebook = NOTEBOOKS / part.notebook
    facts = {"part": name, "notebook": part.notebook, "shape": "tiny-llama" if tiny_mode() else part.shape,
             "dir": str(part_dir)}
    if not notebook.is_file():
        return {**facts, "status": "blocked", "blocker": f"{notebook} is missing (carry .gpu-site)"}
    facts["notebook_sha256"] = hashlib.sha256(notebook.read_bytes()).hexdigest()
    text = notebook.read_text(encoding="utf-8")
    if part.edit:
        if text.count(part.edit[0]) != 1:
            return {**facts, "status": "blocked", "blocker": f"the notebook has not exactly one {part.edit[0]!r}"}
        text = text.replace(*part.edit)
        facts["edit"] = list(part.edit)
    nb_dir = part_dir / "nb"
    shutil.rmtree(nb_dir, ignore_errors=True)
    nb_dir.mkdir(parents=True)
    (nb_dir / "01_nb.ipynb").write_text(text, encoding="utf-8")
    named = notebook_facts(code_source(nb_dir / "01_nb.ipynb"))
    prompt = named.pop("alpaca_prompt")
    facts.update(named)
    export = subprocess.run([sys.executable, "pipeline.py", "export", "--notebooks", str(nb_dir), "--out",
                             str(nb_dir / "out")], cwd=REPO, capture_output=True, text=True)
    facts["export_returncode"] = export.returncode
    facts["export_tail"] = (export.stdout + export.stderr).strip().splitlines()[-3:]
    script = nb_dir / "out" / "train.py"
    if export.returncode != 0 or not script.is_file():
        return {**facts, "status": "blocked", "blocker": "pipeline.py export failed"}
    facts["script"] = str(script)
    help_run = subprocess.run([sys.executable, str(script), "--help"], cwd=part_dir, env=trial_env(part_dir),
                              capture_output=True, text=True)
    facts["help_has_batch_layout"] = "--batch_layout" in help_run.stdout
    facts["help_batch_layout"] = [line.strip() for line in help_run.stdout.splitlines() if "batch_layout" in line
                                  or "per-device" in line][:4]
    flags = variant_flags()
    if "--batch_layout" in " ".join(flags["A"] + flags["B"]) and not facts["help_has_batch_layout"]:
        return {**facts, "status": "blocked",
                "blocker": "the exported script has no --batch_layout flag yet (train.py --help); set LAYOUT_B_FLAGS "
                           "to run without it"}
    model_dir, facts["materialize_s"] = materialize_model(part.shape, work)
    facts["model_dir"] = str(model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    vocab = int(os.environ.get("LAYOUT_VOCAB", "0" if tiny_mode() else "32000"))  # 0: the tiny tokenizer's 120
    tokenizer_dir = large_tokenizer(Path(work) / "tokenizers" / f"wordlevel-{vocab}", vocab) if vocab else None
    if part.chat_tokens:
        tokenizer_dir = chat_tokenizer(
            Path(work) / "tokenizers" / f"llama3-chat-{vocab}-{config['max_position_embeddings']}",
            config["max_position_embeddings"], base_dir=tokenizer_dir or TINY_MODEL)
    tokenizer_json = (tokenizer_dir or model_dir) / "tokenizer.json"
    tokenizer_config = json.loads(((tokenizer_dir or model_dir) / "tokenizer_config.json").read_text())
    from tokenizers import Tokenizer

    size = Tokenizer.from_file(str(tokenizer_json)).get_vocab_size(with_added_tokens=True)
    if tiny_mode() and size > config["vocab_size"]:  # the tiny model's 120 ids: the chat tokens or LAYOUT_VOCAB's
        model_dir = grown_tiny_model(model_dir, Path(work) / "models" / f"tiny-llama-{size}", size)
        config = json.loads((model_dir / "config.json").read_text())
        facts["model_dir"] = str(model_dir)
    facts["standin_names"] = unsloth_names(facts["model_id"], facts["load_in_4bit"])
    for standin in facts["standin_names"]:
        place_standin(model_dir, part_dir / standin, tokenizer_dir)
    facts["tokenizer"] = {"size": size, "model_vocab_size": config["vocab_size"], "chat_tokens": part.chat_tokens}
    heavy = os.environ.get("LAYOUT_LENGTHS", "uniform" if tiny_mode() else "heavy") == "heavy"
    low, high = ((int(os.environ.get("LAYOUT_MIN_TOKENS", 128)), int(os.environ.get("LAYOUT_MAX_TOKENS", 256)))
                 if tiny_mode() else
                 (int(os.environ.get("LAYOUT_MIN_TOKENS", 0 if heavy else 256)),
                  int(os.environ.get("LAYOUT_MAX_TOKENS", 512))))
    rows = int(os.environ.get("LAYOUT_ROWS", HEAVY_ROWS if heavy else DATA_ROWS))
    facts["data"] = write_dataset(part_dir / facts["dataset_id"], part.data, tokenizer_json, prompt,
                                  tokenizer_config.get("eos_token", "</s>"), low, high, rows=rows, heavy=heavy)
    facts["prepare_s"] = time.monotonic() - started
    facts["status"] = "ready"
    return facts


# ---------------------------------------------------------------------------------------------------------------
# Trials


def variant_flags():
    return {"A": shlex.split(os.environ.get("LAYOUT_A_FLAGS", "")),
            "B": shlex.split(os.environ.get("LAYOUT_B_FLAGS", "--batch_layout auto"))}


def variant_env():
    """{variant: the variables LAYOUT_<variant>_ENV adds to its trials' environment}."""
    return {variant: dict(item.split("=", 1) for item in shlex.split(os.environ.get(f"LAYOUT_{variant}_ENV", "")))
            for variant in VARIANTS}


def launch_command(script, flags, profiled=False):
    """The trial's command; `profiled`: through bench/timed_run.py, which times the steps and profiles
    LAYOUT_PROFILE_STEPS (handed on as BENCH_PROFILE_STEPS)."""
    program = [str(REPO / "bench" / "timed_run.py"), str(script)] if profiled else [str(script)]
    if os.environ.get("LAYOUT_LAUNCH", "torchrun") == "python":
        return [sys.executable, *program, *flags]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", *program, *flags]


def clean_lines(text):
    """Console lines with progress-bar redraws (carriage returns) split apart."""
    return [line.rstrip() for line in text.replace("\r", "\n").splitlines()]


def log_facts(text):
    """What a trial's console says about the plan, the checkpointing choice, Unsloth's own batch line, memory."""
    lines = clean_lines(text)
    nbddp = list(dict.fromkeys(line.strip() for line in lines if line.strip().startswith("nbddp:")))
    unsloth_batch = list(dict.fromkeys(line.strip() for line in lines
                                       if re.search(r"Batch size per device|Total batch size", line)))
    peak = re.findall(r"Peak reserved memory = ([\d.]+) GB", text)
    runtime = re.findall(r"([\d.]+) seconds used for training", text)
    return {
        "nbddp_lines": nbddp,
        "plan_lines": [line for line in nbddp if "global batch" in line],
        "checkpointing_lines": [line for line in nbddp if re.search(r"checkpointing", line, re.I)],
        "batch_layout_lines": [line for line in nbddp if "--batch_layout" in line],
        "graphs_lines": [line for line in nbddp if "CUDA graphs" in line or "one_launch_optimizer" in line],
        "unsloth_batch_lines": unsloth_batch,
        "notebook_peak_reserved_gb": float(peak[-1]) if peak else None,
        "notebook_train_runtime_s": float(runtime[-1]) if runtime else None,
        "errors": [line.strip() for line in lines if re.search(r"Error|Traceback|nbddp: error", line)][-12:],
    }


def excerpt(text, tail=80):
    """The lines worth keeping from a trial's console: every nbddp/Unsloth/error line, and the last `tail`."""
    lines = clean_lines(text)
    keep = [i for i, line in enumerate(lines)
            if re.search(r"nbddp|Unsloth|Error|Traceback|Warning|warning|batch size|Batch size", line)]
    chosen = sorted(set(keep) | set(range(max(0, len(lines) - tail), len(lines))))
    out, last = [], -1
    for i in chosen:
        if i != last + 1:
            out.append(f"[... {i - last - 1} lines ...]")
        out.append(lines[i][:2000])
        last = i
    return "\n".join(out) + "\n"


def latest_trainer_state(output_dir):
    states = sorted(Path(output_dir).glob("checkpoint-*/trainer_state.json"),
                    key=lambda p: int(p.parent.name.split("-")[-1]) if p.parent.name.split("-")[-1].isdigit() else -1)
    return states[-1] if states else None


def run_logged(command, cwd, env, log_path, timeout_s):
    """`(returncode, timed_out, wall_s)` of `command`, its console in `log_path`; stopped (its whole process
    group: torchrun's workers too) after `timeout_s`."""
    started = time.monotonic()
    with open(log_path, "w", encoding="utf-8") as console:
        process = subprocess.Popen(command, cwd=cwd, env=env, stdout=console, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        try:
            returncode = process.wait(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            returncode = process.returncode
    return returncode, timed_out, time.monotonic() - started


def run_trial(facts, variant, round_, timeout_s, work, out):
    """One fresh run of the part's script; its files go to `<out>/trials/<part>/<NN>_<variant>/`."""
    name = facts["part"]
    label = f"{round_:02d}_{variant}"
    trial_work = Path(work) / name / "trials" / label
    shutil.rmtree(trial_work, ignore_errors=True)
    trial_work.mkdir(parents=True)
    output_dir = trial_work / "output"
    # the cells run where the stand-ins are (the script's default is the notebook's folder, as in Jupyter)
    flags = ["--workdir", facts["dir"], *variant_flags()[variant]]
    profile_steps = os.environ.get("LAYOUT_PROFILE_STEPS", "")
    command = launch_command(facts["script"], flags, profiled=bool(profile_steps))
    env = {**trial_env(facts["dir"], output_dir), **variant_env()[variant]}
    if profile_steps:
        env.update(BENCH_RESULT_DIR=str(trial_work / "timed"), BENCH_PROFILE_STEPS=profile_steps,
                   BENCH_T0=str(time.time()))
    returncode, timed_out, wall = run_logged(command, facts["dir"], env, trial_work / "log.txt", timeout_s)
    text = (trial_work / "log.txt").read_text(encoding="utf-8", errors="replace")
    dest = Path(out) / "trials" / name / label
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    if (output_dir / metrics.METRICS_FILE).exists():
        shutil.copyfile(output_dir / metrics.METRICS_FILE, dest / metrics.METRICS_FILE)
    state = latest_trainer_state(output_dir)
    if state:
        shutil.copyfile(state, dest / "trainer_state.json")
    (dest / "log_excerpt.txt").write_text(excerpt(text), encoding="utf-8")
    for name in ("rank0.json", "rank0_profile.json", "rank0_ops.txt"):  # timed_run's step times and profile
        if (trial_work / "timed" / name).exists():
            shutil.copyfile(trial_work / "timed" / name, dest / name)
    compressed = gzip.compress(text.encode("utf-8", errors="replace"))
    if len(compressed) <= LOG_GZ_LIMIT:  # the whole console, for a trial that went wrong in a way the excerpt misses
        (dest / "log.txt.gz").write_bytes(compressed)
    record = {"part": name, "round": round_, "variant": variant, "flags": flags, "env": variant_env()[variant],
              "command": shlex.join(command), "cwd": facts["dir"], "output_dir": str(output_dir),
              "max_steps_env": os.environ.get("LAYOUT_MAX_STEPS"), "returncode": returncode, "timed_out": timed_out,
              "timeout_s": timeout_s, "wall_s": wall, "log": log_facts(text),
              "profile": _read_json(dest / "rank0_profile.json"), "step_times": _step_times(dest / "rank0.json")}
    (dest / "trial.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return record


def _read_json(path):
    return json.loads(path.read_text()) if path.exists() else None


def _step_times(path):
    """From timed_run's record: the device and host step times (ms) and the peak memory."""
    record = _read_json(path)
    if record is None:
        return None
    return {key: record.get(key) for key in ("step_ms", "host_step_ms", "gc_ms", "batch_shapes", "peak_allocated_gib",
                                             "peak_reserved_gib", "row_tokens", "per_device_train_batch_size",
                                             "gradient_accumulation_steps", "gradient_checkpointing_arg")}


RESUME_STEPS, RESUME_AT = 10, 5


def resume_check(facts, flags, timeout_s, work, out):
    """Under `flags` (B's): RESUME_STEPS steps with a checkpoint every RESUME_AT ("full"), then a run given only
    its checkpoint-RESUME_AT, as a run stopped there leaves it, with --resume true ("resumed"): its later steps'
    losses against the full run's, and the adapter each run's notebook saved (its `adapter_dir`) reloaded with
    plain PEFT (bench.adapters). Returns the record, also `<out>/trials/<part>/resume.json`."""
    name = facts["part"]
    root = Path(work) / name / "resume"
    shutil.rmtree(root, ignore_errors=True)
    dest = Path(out) / "trials" / name / "resume"
    shutil.rmtree(dest, ignore_errors=True)
    record = {"flags": flags, "steps": RESUME_STEPS, "checkpoint_step": RESUME_AT, "runs": {}}
    started = time.monotonic()
    for run_name in ("full", "resumed"):
        run_dir = root / run_name
        output_dir = run_dir / "output"
        output_dir.mkdir(parents=True)
        extra = ["--set", f"save_steps={RESUME_AT}"]
        if run_name == "resumed":
            checkpoint = root / "full" / "output" / f"checkpoint-{RESUME_AT}"
            if not checkpoint.is_dir():
                record["error"] = f"the full run left no checkpoint-{RESUME_AT}"
                break
            shutil.copytree(checkpoint, output_dir / checkpoint.name)
            extra += ["--resume", "true"]
        saved = Path(facts["dir"]) / (facts["adapter_dir"] or "no-adapter-saved")
        shutil.rmtree(saved, ignore_errors=True)
        env = {**trial_env(facts["dir"], output_dir), ENV.MAX_STEPS: str(RESUME_STEPS)}
        command = launch_command(facts["script"], ["--workdir", facts["dir"], *flags, *extra])
        left = timeout_s - (time.monotonic() - started)
        returncode, timed_out, wall = run_logged(command, facts["dir"], env, run_dir / "log.txt", max(left, 1))
        text = (run_dir / "log.txt").read_text(encoding="utf-8", errors="replace")
        (dest / run_name).mkdir(parents=True)
        (dest / run_name / "log_excerpt.txt").write_text(excerpt(text), encoding="utf-8")
        steps, _, _ = read_metrics(output_dir / metrics.METRICS_FILE)
        if saved.is_dir():
            shutil.copytree(saved, run_dir / "lora_model")
        record["runs"][run_name] = {
            "command": shlex.join(command), "returncode": returncode, "timed_out": timed_out, "wall_s": wall,
            "checkpoints": sorted(p.name for p in output_dir.glob("checkpoint-*")),
            "loss_by_step": {r["step"]: r["loss"] for r in steps}, "saved_adapter": saved.is_dir(),
            "resume_lines": [line for line in clean_lines(text) if "resum" in line.lower() and "nbddp" in line],
            "errors": log_facts(text)["errors"]}
        if returncode != 0:
            break
    full, resumed = (record["runs"].get(n, {}).get("loss_by_step", {}) for n in ("full", "resumed"))
    later = sorted(step for step in resumed if step > RESUME_AT and step in full)
    record["resumed_steps"] = sorted(resumed)
    record["max_abs_loss_diff_after_resume"] = max((abs(resumed[s] - full[s]) for s in later), default=None)
    if all(record["runs"].get(n, {}).get("saved_adapter") for n in ("full", "resumed")):
        compared = subprocess.run([sys.executable, "-m", "bench.adapters",
                                   str(Path(facts["dir"]) / facts["model_id"]), str(root / "full" / "lora_model"),
                                   str(root / "resumed" / "lora_model")], cwd=REPO, env=trial_env(facts["dir"]),
                                  capture_output=True, text=True)
        record["adapters_full_vs_resumed"] = (json.loads(compared.stdout.splitlines()[-1]) if compared.returncode == 0
                                              else compared.stderr.strip().splitlines()[-3:])
    (dest.parent / "resume.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return record


# ---------------------------------------------------------------------------------------------------------------
# Summary (pure functions of $OUT's files)


def read_metrics(path):
    """(per-step records, end record or None, batch_plan record or None) of a metrics.jsonl."""
    path = Path(path)
    if not path.exists():
        return [], None, None
    records = metrics.read(path, strict=False)
    ends, plans = metrics.events(records, "end"), metrics.events(records, "batch_plan")
    return ([record for record in metrics.steps(records) if "loss" in record], ends[-1] if ends else None,
            plans[-1] if plans else None)


def warmup_steps(count):
    """Steps left out of the steady-state figures: 5 of a 20-step-or-longer run, else 1 (of 3 or more)."""
    return 5 if count >= 20 else 1 if count >= 3 else 0


def trial_figures(steps, end, plan, state=None):
    """Per-trial numbers from its metrics.jsonl records (and trainer_state.json's log_history when no metrics)."""
    if not steps and state:
        history = [h for h in state.get("log_history", []) if "loss" in h]
        steps = [{"step": h["step"], "loss": h["loss"]} for h in history]
        end = end or next((h for h in state.get("log_history", []) if "train_runtime" in h), None)
    skip = warmup_steps(len(steps))
    steady = steps[skip:]
    rates = [s["tokens_per_s"] for s in steady if s.get("tokens_per_s")]
    tokens = [s["tokens"] for s in steps if s.get("tokens") is not None]
    # Tokens of the steady steps over the time from the end of the last warm-up step (or of step 1) to the end.
    overall = None
    base, counted = (steps[skip - 1], steady) if skip else (steps[0] if steps else None, steps[1:])
    if counted and base.get("time_s") is not None and counted[-1].get("time_s") is not None \
            and all(s.get("tokens") is not None for s in counted):
        elapsed = counted[-1]["time_s"] - base["time_s"]
        overall = sum(s["tokens"] for s in counted) / elapsed if elapsed > 0 else None
    peaks = [s["peak_mem_gib"] for s in steps if s.get("peak_mem_gib") is not None]
    splits = [s["step_split"] for s in steady if isinstance(s.get("step_split"), dict)]
    return {
        "steps": len(steps),
        "warmup_steps": skip,
        "losses": [s["loss"] for s in steps],
        "loss_steps": [s["step"] for s in steps],
        "median_tokens_per_s": statistics.median(rates) if rates else None,
        "tokens_per_s_overall": overall,
        "tokens_per_step_median": statistics.median(tokens) if tokens else None,
        "peak_mem_gib": max(peaks) if peaks else None,
        "train_runtime_s": end.get("train_runtime") if end else None,
        "train_loss": end.get("train_loss") if end else None,
        "batch_plan": plan,
        # ms a step in each phase (metrics.jsonl's step_split): the median over the steady records, so that a
        # profiler's dump or a save between two steps does not count as every step's
        "step_split_ms": {phase: statistics.median(split[f"{phase}_s"] / split["steps"] for split in splits) * 1e3
                          for phase in metrics.STEP_PHASES} if splits else None,
    }


def max_relative_difference(a_steps, a_losses, b_steps, b_losses):
    """max over the steps both have of |b - a| / |a|, and the step where it is; (None, None) without common steps."""
    a = dict(zip(a_steps, a_losses))
    b = dict(zip(b_steps, b_losses))
    common = [s for s in a if s in b]
    if not common:
        return None, None
    diffs = [(abs(b[s] - a[s]) / max(abs(a[s]), 1e-12), s) for s in common]
    worst = max(diffs)
    return worst[0], worst[1]


def ratio(numerator, denominator):
    return numerator / denominator if numerator is not None and denominator else None


def trial_status(record, figures):
    if record.get("timed_out"):
        return "timeout"
    if record.get("returncode") == 0 and figures["steps"]:
        return "ok"
    if figures["train_runtime_s"] is not None:
        return "trained"  # training ended; a later cell failed
    return "failed"


def summarize_part(part_facts, trials):
    """A part's trials with their figures, the per-round A/B pairs, and their medians."""
    rows = []
    for record, figures in trials:
        rows.append({**{k: record[k] for k in ("round", "variant", "flags", "command", "returncode", "timed_out",
                                                "wall_s")},
                     "env": record.get("env", {}), "status": trial_status(record, figures), **figures, **record["log"],
                     "profile": record.get("profile"), "step_times": record.get("step_times")})
    pairs = []
    by_key = {(r["round"], r["variant"]): r for r in rows}
    for round_ in sorted({r["round"] for r in rows}):
        a, b = by_key.get((round_, "A")), by_key.get((round_, "B"))
        if not a or not b or not a["steps"] or not b["steps"]:
            continue
        loss_diff, loss_step = max_relative_difference(a["loss_steps"], a["losses"], b["loss_steps"], b["losses"])
        pairs.append({
            "round": round_,
            "tokens_per_s_ratio": ratio(b["median_tokens_per_s"], a["median_tokens_per_s"]),
            "tokens_per_s_overall_ratio": ratio(b["tokens_per_s_overall"], a["tokens_per_s_overall"]),
            "train_runtime_speedup": ratio(a["train_runtime_s"], b["train_runtime_s"]),
            "wall_speedup": ratio(a["wall_s"], b["wall_s"]),
            "peak_mem_ratio": ratio(b["peak_mem_gib"], a["peak_mem_gib"]),
            "max_rel_loss_diff": loss_diff,
            "max_rel_loss_diff_step": loss_step,
            "steps_compared": len(set(a["loss_steps"]) & set(b["loss_steps"])),
        })
    same = {}
    for variant in VARIANTS:  # run-to-run noise of one variant, the yardstick for the A/B loss difference
        runs = [r for r in rows if r["variant"] == variant and r["steps"]]
        if len(runs) >= 2:
            same[variant] = max_relative_difference(runs[0]["loss_steps"], runs[0]["losses"], runs[1]["loss_steps"],
                                                    runs[1]["losses"])[0]

    def median_of(key):
        values = [p[key] for p in pairs if p[key] is not None]
        return statistics.median(values) if values else None

    loss_diffs = [p["max_rel_loss_diff"] for p in pairs if p["max_rel_loss_diff"] is not None]
    return {
        **part_facts,
        "trials": rows,
        "pairs": pairs,
        "median_tokens_per_s_ratio": median_of("tokens_per_s_ratio"),
        "median_tokens_per_s_overall_ratio": median_of("tokens_per_s_overall_ratio"),
        "median_train_runtime_speedup": median_of("train_runtime_speedup"),
        "median_wall_speedup": median_of("wall_speedup"),
        "max_rel_loss_diff": max(loss_diffs) if loss_diffs else None,
        "max_rel_loss_diff_same_variant": same,
        "plan_lines": {v: list(dict.fromkeys(line for r in rows if r["variant"] == v for line in r["plan_lines"]))
                       for v in VARIANTS},
        "checkpointing_lines": {v: list(dict.fromkeys(line for r in rows if r["variant"] == v
                                                      for line in r["checkpointing_lines"])) for v in VARIANTS},
        "batch_layout_lines": {v: list(dict.fromkeys(line for r in rows if r["variant"] == v
                                                     for line in r.get("batch_layout_lines", []))) for v in VARIANTS},
        "graphs_lines": {v: list(dict.fromkeys(line for r in rows if r["variant"] == v
                                               for line in r.get("graphs_lines", []))) for v in VARIANTS},
    }


def summarize(out, dest=None):
    """`<out>/layout_1gpu.json` (or `dest`) from `<out>/environment.json` and `<out>/trials/<part>/...`; returns it."""
    out = Path(out)
    environment = json.loads((out / "environment.json").read_text()) if (out / "environment.json").exists() else {}
    parts = {}
    for part_dir in sorted(p for p in (out / "trials").glob("*") if p.is_dir()):
        facts = json.loads((part_dir / "part.json").read_text()) if (part_dir / "part.json").exists() else {}
        trials = []
        for trial_dir in sorted(p for p in part_dir.iterdir() if (p / "trial.json").exists()):
            record = json.loads((trial_dir / "trial.json").read_text())
            state = (json.loads((trial_dir / "trainer_state.json").read_text())
                     if (trial_dir / "trainer_state.json").exists() else None)
            trials.append((record, trial_figures(*read_metrics(trial_dir / metrics.METRICS_FILE), state=state)))
        trials.sort(key=lambda t: (t[0]["round"], VARIANTS.index(t[0]["variant"])))
        parts[part_dir.name] = summarize_part(facts, trials)
        if (part_dir / "resume.json").exists():
            parts[part_dir.name]["resume"] = json.loads((part_dir / "resume.json").read_text())
    order = environment.get("parts_requested") or []
    parts = dict(sorted(parts.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order)))
    summary = {**environment, "parts": parts}
    Path(dest or out / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary


# ---------------------------------------------------------------------------------------------------------------
# The call


def environment_facts(parts, deadline_s, rounds):
    def version(name):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=index,name,memory.total,driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30).stdout
        gpus = [dict(zip(("index", "name", "memory_total", "driver"), (f.strip() for f in line.split(","))))
                for line in smi.strip().splitlines()]
    except (OSError, subprocess.TimeoutExpired):
        gpus = []
    return {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": os.environ.get("BENCH_COMMIT"),
        "host": socket.gethostname(),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "hardware": {"gpus": gpus},
        "versions": {name: version(name) for name in PACKAGES},
        "parts_requested": parts,
        "rounds": rounds,
        "deadline_s": deadline_s,
        "tiny": tiny_mode(),
        "variants": {"A": "as written" + (f" ({os.environ['LAYOUT_A_FLAGS']})" if os.environ.get("LAYOUT_A_FLAGS")
                                          else ""),
                     "B": " ".join(variant_flags()["B"])},
        "variant_env": variant_env(),
        "first_trial_s_env": os.environ.get("LAYOUT_FIRST_TRIAL_S"),
        "launch": os.environ.get("LAYOUT_LAUNCH", "torchrun"),
        "max_steps_env": os.environ.get("LAYOUT_MAX_STEPS"),
        "notebooks_source": ((NOTEBOOKS / "SOURCE.txt").read_text().splitlines()
                             if (NOTEBOOKS / "SOURCE.txt").exists() else None),
        "method": "per trial a fresh process; A = the exported script as written, B = the same plus the B flags; "
                  "rounds A B A B; tokens/s = median over steps after the warm-up steps of metrics.jsonl's "
                  "tokens_per_s (non-padding tokens of the step / its wall time); ratio = B/A within a round; loss "
                  "difference = max over steps of |loss_B - loss_A| / |loss_A|",
    }


def pair_need(walls, first_guess, variant):
    """Seconds to keep for the next trial: its variant's latest wall time (another variant's, or the part's guess,
    before it has one) plus 5%; an A also keeps its B's, so that no round is left with half a pair."""
    def estimate(v):
        return 1.05 * walls.get(v, walls.get("A", walls.get("B", first_guess)))

    return estimate(variant) + (estimate("B") if variant == "A" else 0)


def run(out, part_names, deadline_s, work, rounds, resume=False):
    t0 = time.monotonic()
    deadline = t0 + deadline_s - 3  # the summary after the last trial
    out, work = Path(out), Path(work)
    (out / "trials").mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    (out / "environment.json").write_text(json.dumps(environment_facts(part_names, deadline_s, rounds), indent=2)
                                          + "\n")
    log(f"parts {part_names}, {rounds} rounds, deadline {deadline_s:.0f}s; A {variant_flags()['A'] or 'as written'}, "
        f"B {variant_flags()['B']}")
    for name in part_names:
        part = PARTS[name]
        first = TINY_FIRST_TRIAL_S if tiny_mode() else float(os.environ.get("LAYOUT_FIRST_TRIAL_S")
                                                             or part.first_trial_s)
        hung = TINY_MAX_TRIAL_S if tiny_mode() else part.max_trial_s
        prepare = 10 if model_ready(part.shape, work) else part.prepare_s
        part_out = out / "trials" / name
        part_out.mkdir(parents=True, exist_ok=True)
        left = deadline - time.monotonic()
        if left < prepare + 2 * first:
            log(f"skip {name}: ~{prepare + 2 * first}s for preparation and a pair, {left:.0f}s left")
            (part_out / "part.json").write_text(json.dumps({"part": name, "status": "skipped",
                                                            "reason": f"{left:.0f}s left"}, indent=2) + "\n")
            continue
        log(f"prepare {name}")
        try:
            facts = prepare_part(name, part, work)
        except Exception as error:  # a broken part must not cost the others their turn
            facts = {"part": name, "status": "blocked", "blocker": f"{type(error).__name__}: {error}"}
        (part_out / "part.json").write_text(json.dumps(facts, indent=2) + "\n")
        log(f"{name}: {facts['status']} (prepared in {facts.get('prepare_s', 0):.0f}s, call at "
            f"{time.monotonic() - t0:.0f}s)"
            + (f" ({facts.get('blocker')})" if facts["status"] != "ready" else
               f"; stand-ins {facts['standin_names']}, data {facts['data']['target_tokens']}, "
               f"materialize {facts['materialize_s']:.0f}s"))
        summarize(out)
        if facts["status"] != "ready":
            continue
        walls = {}  # variant -> wall time of its latest trial
        for round_ in range(1, rounds + 1):
            for variant in VARIANTS:
                left = deadline - time.monotonic()
                need = pair_need(walls, first, variant)
                if left < need:
                    log(f"skip {name} round {round_} {variant} and after: ~{need:.0f}s needed, {left:.0f}s left")
                    break
                log(f"{name} round {round_} {variant} {variant_flags()[variant]}")
                record = run_trial(facts, variant, round_, min(hung, left), work, out)
                walls[variant] = record["wall_s"]
                summary = summarize(out)
                row = summary["parts"][name]["trials"][-1]
                log(f"  {variant}: {row['status']} rc={record['returncode']} wall {record['wall_s']:.0f}s, "
                    f"{row['steps']} steps, median {row['median_tokens_per_s'] or 0:.0f} tok/s, train_runtime "
                    f"{row['train_runtime_s']}, peak {row['peak_mem_gib']} GiB; "
                    f"{(row['plan_lines'] or ['no plan line'])[-1]}")
                if not row["steps"]:  # trained no step: the next trial would fail alike, and cost as much
                    log(f"  stop {name}: {(row['errors'] or ['no error line'])[-1]}")
                    break
            else:
                continue
            break
        if resume:  # each run a fresh B of RESUME_STEPS steps (of the part's), with one restart
            need = 2 * 1.05 * walls.get("B", first) + 30
            left = deadline - time.monotonic()
            if left < need:
                log(f"skip {name}'s resume check: ~{need:.0f}s needed, {left:.0f}s left")
            else:
                log(f"{name} resume check {variant_flags()['B']}")
                checked = resume_check(facts, variant_flags()["B"], left, work, out)
                log(f"  resumed steps {checked['resumed_steps']}: max abs loss diff after the resume "
                    f"{checked['max_abs_loss_diff_after_resume']}; adapters {checked.get('adapters_full_vs_resumed')}"
                    + (f"; {checked['error']}" if checked.get("error") else ""))
        part_summary = summarize(out)["parts"][name]
        log(f"{name}: tokens/s B/A per round {[p['tokens_per_s_ratio'] for p in part_summary['pairs']]}, median "
            f"{part_summary['median_tokens_per_s_ratio']}; max rel loss diff {part_summary['max_rel_loss_diff']}")
    summarize(out)
    log(f"done after {time.monotonic() - t0:.0f}s")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser("run")
    run_parser.add_argument("--out", required=True, type=Path)
    run_parser.add_argument("--parts", default="alpaca_8b,alpaca_1b,conversational_3b")
    run_parser.add_argument("--deadline-s", type=float, default=540)
    run_parser.add_argument("--work", type=Path, default=Path("/tmp/layout"))
    run_parser.add_argument("--rounds", type=int, default=2)
    run_parser.add_argument("--resume-check", action="store_true",
                            help="after each part's rounds, B's save and resume (resume_check)")
    summarize_parser = commands.add_parser("summarize")
    summarize_parser.add_argument("--out", required=True, type=Path, help="a call's $OUT (read only)")
    summarize_parser.add_argument("--json", type=Path, help=f"where to write the summary (default <out>/{SUMMARY})")
    args = parser.parse_args()
    if args.command == "summarize":
        summary = summarize(args.out, args.json)
        for name, part in summary["parts"].items():
            print(name, "tokens/s B/A", part.get("median_tokens_per_s_ratio"), "max rel loss diff",
                  part.get("max_rel_loss_diff"))
        return
    names = [n for n in args.parts.split(",") if n]
    unknown = [n for n in names if n not in PARTS]
    if unknown:
        parser.error(f"unknown parts {unknown}; known: {sorted(PARTS)}")
    run(args.out, names, args.deadline_s, args.work, args.rounds, args.resume_check)


if __name__ == "__main__":
    main()
