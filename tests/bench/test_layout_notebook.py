import json
import random
from pathlib import Path

import pytest

from bench import layout_notebook as ln

REPO = Path(__file__).resolve().parents[2]

NOTEBOOK_CODE = '''
from unsloth import FastLanguageModel
load_in_4bit = True # Use 4bit quantization
model, tokenizer = FastLanguageModel.from_pretrained(
    model_name = "unsloth/Llama-3.1-8B",
    load_in_4bit = load_in_4bit,
)
alpaca_prompt = """Below is an instruction.

### Instruction:
{}

### Input:
{}

### Response:
{}"""
from datasets import load_dataset
dataset = load_dataset("unsloth/alpaca-cleaned", split = "train")
model.save_pretrained_merged("model", tokenizer, save_method = "merged_16bit",)
model.save_pretrained("llama_lora")  # Local saving
if False:
    model.save_pretrained("lora_model")
'''


def step(n, loss, tokens=1000, rate=None, time_s=None, peak=10.0):
    return {"step": n, "loss": loss, "learning_rate": 1e-4, "tokens": tokens,
            "tokens_per_s": rate if rate is not None else 1000.0 * n, "peak_mem_gib": peak,
            "time_s": time_s if time_s is not None else float(n)}


def write_trial(part_dir, round_, variant, steps, end=True, plan=None, returncode=0, log=None):
    trial = part_dir / f"{round_:02d}_{variant}"
    trial.mkdir(parents=True)
    lines = []
    if plan:
        lines.append({"event": "batch_plan", **plan})
    lines += steps
    if end:
        lines.append({"event": "end", "step": len(steps), "train_runtime": 10.0 * (2 if variant == "A" else 1),
                      "train_loss": 1.0})
    (trial / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    record = {"part": part_dir.name, "round": round_, "variant": variant, "flags": [] if variant == "A" else
              ["--batch_layout", "auto"], "command": "python train.py", "returncode": returncode, "timed_out": False,
              "wall_s": 100.0 if variant == "A" else 80.0, "log": ln.log_facts(log or "")}
    (trial / "trial.json").write_text(json.dumps(record))


def test_notebook_facts_reads_the_ids_the_notebook_names():
    facts = ln.notebook_facts(NOTEBOOK_CODE)
    assert facts["model_id"] == "unsloth/Llama-3.1-8B"
    assert facts["dataset_id"] == "unsloth/alpaca-cleaned"
    assert facts["load_in_4bit"] is True
    assert facts["adapter_dir"] == "llama_lora"  # not save_pretrained_merged's, and the first of the two
    assert facts["alpaca_prompt"].startswith("Below is an instruction.") and facts["alpaca_prompt"].count("{}") == 3


def test_stand_in_names_cover_unslooths_4bit_names_without_unsloth_installed():
    names = ln.unsloth_names("unsloth/Llama-3.1-8B", True)
    assert names[0] == "unsloth/Llama-3.1-8B"
    assert "unsloth/Llama-3.1-8B-unsloth-bnb-4bit" in names and "unsloth/Llama-3.1-8B-bnb-4bit" in names
    assert "unsloth/llama-3.1-8b-unsloth-bnb-4bit" in names
    assert ln.unsloth_names("unsloth/Llama-3.1-8B", False) == ["unsloth/Llama-3.1-8B", "unsloth/llama-3.1-8b"]


def test_alpaca_rows_hit_their_token_length_exactly():
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(REPO / "models" / "tiny-llama" / "tokenizer.json"))
    prompt = ln.notebook_facts(NOTEBOOK_CODE)["alpaca_prompt"]
    words, starts = ln._words(tokenizer)
    rng = random.Random(0)
    for target in (256, 300, 512):
        row = ln.alpaca_row(tokenizer, prompt, "</s>", words, starts, target, rng)
        assert set(row) == {"instruction", "input", "output"}
        assert len(tokenizer.encode(prompt.format(row["instruction"], row["input"], row["output"]) + "</s>").ids) \
            == target
        assert tokenizer.token_to_id("<unk>") not in tokenizer.encode(row["output"]).ids


def test_write_dataset_records_the_length_distribution(tmp_path):
    tokenizer_json = REPO / "models" / "tiny-llama" / "tokenizer.json"
    prompt = ln.notebook_facts(NOTEBOOK_CODE)["alpaca_prompt"]
    facts = ln.write_dataset(tmp_path / "unsloth" / "alpaca-cleaned", "alpaca", tokenizer_json, prompt, "</s>", 256,
                             512, rows=50)
    rows = (tmp_path / "unsloth" / "alpaca-cleaned" / "train.jsonl").read_text().splitlines()
    assert len(rows) == 50 and facts["rows"] == 50 and facts["exact_lengths"]
    assert 256 <= facts["target_tokens"]["min"] <= facts["target_tokens"]["max"] <= 512
    chat = ln.write_dataset(tmp_path / "chat", "sharegpt", tokenizer_json, None, "</s>", 256, 512, rows=10)
    row = json.loads((tmp_path / "chat" / "train.jsonl").read_text().splitlines()[0])
    assert {t["from"] for t in row["conversations"]} == {"human", "gpt"} and not chat["exact_lengths"]


def test_a_grown_tokenizer_has_the_size_asked_and_rows_of_alpaca_cleaneds_lengths(tmp_path):
    from tokenizers import Tokenizer

    grown = ln.large_tokenizer(tmp_path / "tok", 32000)
    tokenizer = Tokenizer.from_file(str(grown / "tokenizer.json"))
    assert tokenizer.get_vocab_size(with_added_tokens=True) == 32000
    assert len(ln._words(tokenizer)[0]) > 15000  # one token with and without a leading space
    prompt = ln.notebook_facts(NOTEBOOK_CODE)["alpaca_prompt"]
    facts = ln.write_dataset(tmp_path / "data", "alpaca", grown / "tokenizer.json", prompt, "</s>", 0, 512,
                             rows=2000, heavy=True)
    lengths = facts["target_tokens"]
    assert lengths["distribution"] == "alpaca-cleaned's heavy tail" and lengths["max"] <= ln.HEAVY_MAX
    assert 60 <= lengths["p10"] <= 85 and 150 <= lengths["p50"] <= 175 and 320 <= lengths["p90"] <= 390
    rows = [json.loads(line) for line in (tmp_path / "data" / "train.jsonl").read_text().splitlines()]
    longest = max(rows, key=lambda r: len(r["output"]))
    assert len(tokenizer.encode(prompt.format(longest["instruction"], longest["input"], longest["output"])
                                + "</s>").ids) <= ln.HEAVY_MAX


def test_place_standin_links_the_weights_and_copies_another_tokenizer(tmp_path):
    model, tokenizer = tmp_path / "model", tmp_path / "tok"
    model.mkdir()
    tokenizer.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_text("weights")
    (model / "tokenizer.json").write_text("tiny")
    (tokenizer / "tokenizer.json").write_text("chat")
    dest = tmp_path / "run" / "unsloth" / "Llama-3.2-3B-Instruct"
    ln.place_standin(model, dest, tokenizer)
    ln.place_standin(model, dest, tokenizer)  # again: replaced, not nested
    assert (dest / "model.safetensors").is_symlink() and (dest / "config.json").is_symlink()
    assert (dest / "tokenizer.json").read_text() == "chat" and not (dest / "tokenizer.json").is_symlink()


def test_log_facts_finds_plan_checkpointing_and_notebook_lines():
    text = ("nbddp: backend=unsloth (CUDA and Unsloth) world_size=1 device=cuda:0\n"
            "nbddp: SFTConfig: global batch 8 rows = 2 per device x 4 accumulation x 1 process (as the notebook)\n"
            " 10%|#  | 6/60 [00:02<00:20]\r 12%|#  | 7/60 [00:02<00:19]\rnbddp: --batch_layout auto: micro batch 8 "
            "with gradient checkpointing off (was 2, unsloth): estimated 9.1 GiB; global batch 8 rows = 8 per device "
            "x 1 accumulation x 1 process\n"
            "   \\\\   /|    Num examples = 1,024 | Num Epochs = 1 | Total steps = 60\n"
            "O^O/ \\_/ \\    Batch size per device = 8 | Gradient accumulation steps = 1\n"
            "12.5 seconds used for training.\nPeak reserved memory = 9.87 GB.\n")
    facts = ln.log_facts(text)
    assert len(facts["plan_lines"]) == 2 and facts["plan_lines"][1].startswith("nbddp: --batch_layout auto")
    assert facts["checkpointing_lines"] == [facts["plan_lines"][1]] == facts["batch_layout_lines"]
    assert facts["unsloth_batch_lines"] == [
        "O^O/ \\_/ \\    Batch size per device = 8 | Gradient accumulation steps = 1"]
    assert facts["notebook_peak_reserved_gb"] == 9.87 and facts["notebook_train_runtime_s"] == 12.5
    assert facts["errors"] == []


def test_trial_figures_leave_out_warm_up_steps():
    steps = [step(n, 2.0 - n / 100, rate=100.0 if n <= 5 else 1000.0 + n, time_s=float(n)) for n in range(1, 61)]
    figures = ln.trial_figures(steps, {"train_runtime": 61.0, "train_loss": 1.7}, {"micro_batch": 8})
    assert figures["steps"] == 60 and figures["warmup_steps"] == 5
    assert figures["median_tokens_per_s"] == pytest.approx(1000.0 + 33)  # median of steps 6..60
    assert figures["tokens_per_s_overall"] == pytest.approx(55 * 1000 / (60.0 - 5.0))
    assert figures["train_runtime_s"] == 61.0 and figures["batch_plan"] == {"micro_batch": 8}
    assert figures["losses"][0] == pytest.approx(1.99) and figures["loss_steps"][-1] == 60
    assert figures["step_split_ms"] is None  # no step_split in these records
    short = ln.trial_figures([step(n, 1.0) for n in range(1, 6)], None, None)
    assert short["warmup_steps"] == 1 and short["median_tokens_per_s"] == 3500.0 and short["train_runtime_s"] is None


def test_trial_figures_split_the_steady_steps():
    steps = [{**step(n, 1.0), "step_split": {"steps": 1, "between_steps_s": 0.01 * (n == 1) + 0.002 + 18 * (n == 5),
                                              "forward_backward_s": 0.2, "optimizer_s": 0.02}} for n in range(1, 6)]
    figures = ln.trial_figures(steps, None, None)
    assert figures["warmup_steps"] == 1  # step 1's slow fetch is left out; step 5's profiler dump is one of four
    assert figures["step_split_ms"] == pytest.approx({"between_steps": 2.0, "forward_backward": 200.0,
                                                      "optimizer": 20.0})


def test_trial_figures_fall_back_to_trainer_state_log_history():
    state = {"log_history": [{"step": 1, "loss": 3.0}, {"step": 2, "loss": 2.5}, {"train_runtime": 4.0, "step": 2}]}
    figures = ln.trial_figures([], None, None, state=state)
    assert figures["losses"] == [3.0, 2.5] and figures["train_runtime_s"] == 4.0
    assert figures["median_tokens_per_s"] is None


def test_max_relative_difference_compares_common_steps():
    worst, at = ln.max_relative_difference([1, 2, 3], [2.0, 1.0, 4.0], [1, 2], [2.0, 1.1])
    assert worst == pytest.approx(0.1) and at == 2
    assert ln.max_relative_difference([1], [1.0], [2], [1.0]) == (None, None)


def test_summarize_pairs_rounds_and_takes_medians(tmp_path):
    out = tmp_path / "out"
    part = out / "trials" / "alpaca_8b"
    part.mkdir(parents=True)
    (out / "environment.json").write_text(json.dumps({"hardware": {"gpus": [{"name": "NVIDIA H200"}]},
                                                      "versions": {"torch": "2.11.0"},
                                                      "parts_requested": ["alpaca_8b"]}))
    (part / "part.json").write_text(json.dumps({"part": "alpaca_8b", "model_id": "unsloth/Llama-3.1-8B"}))
    plan_log = "nbddp: --batch_layout auto: micro batch 8 with gradient checkpointing off; global batch 8 rows\n"
    rates = {(1, "A"): 1000.0, (1, "B"): 1500.0, (2, "A"): 1000.0, (2, "B"): 1800.0}
    for (round_, variant), rate in rates.items():
        losses = [2.0 - n / 100 + (0.002 if (variant, round_) == ("B", 2) and n == 7 else 0.0) for n in range(1, 21)]
        write_trial(part, round_, variant, [step(n, losses[n - 1], rate=rate) for n in range(1, 21)],
                    plan={"layout": "auto", "micro_batch": 8} if variant == "B" else None,
                    log=plan_log if variant == "B" else "", returncode=0 if (round_, variant) != (2, "A") else 1)
    summary = ln.summarize(out)
    assert json.loads((out / ln.SUMMARY).read_text()) == summary
    assert summary["hardware"]["gpus"][0]["name"] == "NVIDIA H200" and summary["versions"]["torch"] == "2.11.0"
    result = summary["parts"]["alpaca_8b"]
    assert result["model_id"] == "unsloth/Llama-3.1-8B"
    assert [t["status"] for t in result["trials"]] == ["ok", "ok", "trained", "ok"]
    assert [p["tokens_per_s_ratio"] for p in result["pairs"]] == pytest.approx([1.5, 1.8])
    assert result["median_tokens_per_s_ratio"] == pytest.approx(1.65)
    assert result["median_train_runtime_speedup"] == pytest.approx(2.0)
    assert result["median_wall_speedup"] == pytest.approx(1.25)
    assert result["max_rel_loss_diff"] == pytest.approx(0.002 / (2.0 - 0.07))
    assert result["pairs"][1]["max_rel_loss_diff_step"] == 7
    assert result["max_rel_loss_diff_same_variant"] == {"A": 0.0, "B": pytest.approx(0.002 / (2.0 - 0.07))}
    assert result["plan_lines"]["B"] == [plan_log.strip()] and result["plan_lines"]["A"] == []
    assert result["trials"][1]["batch_plan"]["micro_batch"] == 8


def test_summarize_keeps_a_failed_trial_out_of_the_pairs(tmp_path):
    out = tmp_path / "out"
    part = out / "trials" / "alpaca_1b"
    part.mkdir(parents=True)
    write_trial(part, 1, "A", [step(n, 1.0) for n in range(1, 6)])
    write_trial(part, 1, "B", [], end=False, returncode=1, log="Traceback (most recent call last):\nValueError: x\n")
    result = ln.summarize(out)["parts"]["alpaca_1b"]
    assert [t["status"] for t in result["trials"]] == ["ok", "failed"]
    assert result["pairs"] == [] and result["median_tokens_per_s_ratio"] is None
    assert result["trials"][1]["errors"] == ["Traceback (most recent call last):", "ValueError: x"]


def test_pair_need_keeps_room_for_the_b_of_an_a():
    assert ln.pair_need({}, 100, "A") == pytest.approx(210)  # the part's guess for both
    assert ln.pair_need({"A": 130}, 100, "B") == pytest.approx(136.5)  # B not run yet: A's time
    assert ln.pair_need({"A": 130, "B": 90}, 100, "A") == pytest.approx(1.05 * 220)
    assert ln.pair_need({"A": 130, "B": 90}, 100, "B") == pytest.approx(94.5)


def test_a_model_materialized_before_with_the_same_config_is_reused(tmp_path):
    from bench.materialize import STAMP, shape_config, stamp_for

    folder = tmp_path / "models" / "llama3-8b"
    folder.mkdir(parents=True)
    assert not ln.model_ready("llama3-8b", tmp_path)
    (folder / STAMP).write_text(json.dumps(stamp_for("llama3-8b", 0, shape_config("llama3-8b"))))
    assert ln.model_candidates("llama3-8b", tmp_path)[0] == folder and ln.model_ready("llama3-8b", tmp_path)
    (folder / STAMP).write_text(json.dumps(stamp_for("llama3-8b", 1, shape_config("llama3-8b"))))
    assert not ln.model_ready("llama3-8b", tmp_path)


def test_a_tokenizer_larger_than_the_tiny_model_gets_a_tiny_model_with_as_many_embedding_rows(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from nbddp.examples.tiny_model import ensure_weights

    tiny = Path(ensure_weights(str(ln.TINY_MODEL)))
    grown = ln.grown_tiny_model(tiny, tmp_path / "tiny-131", 131)
    before, after = (AutoModelForCausalLM.from_pretrained(str(d)) for d in (tiny, grown))
    rows = before.get_input_embeddings().weight.shape[0]
    assert after.config.vocab_size == after.get_input_embeddings().weight.shape[0] == 131 > rows
    assert torch.equal(after.get_input_embeddings().weight[:rows], before.get_input_embeddings().weight)
    assert (grown / "tokenizer.json").is_file()
    stamp = (grown / "config.json").stat().st_mtime_ns
    assert ln.grown_tiny_model(tiny, grown, 131) == grown and (grown / "config.json").stat().st_mtime_ns == stamp


def test_a_variants_environment_comes_from_its_layout_env(monkeypatch):
    monkeypatch.setenv("LAYOUT_B_ENV", "NBDDP_CUDA_GRAPHS=1 OTHER='a b'")
    monkeypatch.delenv("LAYOUT_A_ENV", raising=False)
    assert ln.variant_env() == {"A": {}, "B": {"NBDDP_CUDA_GRAPHS": "1", "OTHER": "a b"}}
