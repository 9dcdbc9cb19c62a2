import json
import time
from types import SimpleNamespace

import pytest
import torch
from transformers import TrainerControl, TrainerState

from nbddp.formats.metrics import STEP_PHASES
from nbddp.runtime.reporting.metrics import MetricsCallback


def state(is_world_process_zero, step=0, tokens=0):
    return TrainerState(is_world_process_zero=is_world_process_zero, global_step=step, num_input_tokens_seen=tokens)


def records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


class Counted(torch.nn.Module):
    """A model whose forward passes the callback counts."""

    def forward(self, input_ids=None, attention_mask=None):
        return input_ids


def cpu_args():
    return SimpleNamespace(device=torch.device("cpu"))


def simulate(callback, is_world_process_zero, args=None):
    args, model = args or cpu_args(), Counted()
    control = TrainerControl()
    callback.on_train_begin(args, state(is_world_process_zero), control, model=model)
    model(input_ids=torch.ones(2, 5, dtype=torch.long))
    callback.on_log(args, state(is_world_process_zero, 5, 640), control, logs={"loss": 2.5, "learning_rate": 1e-4, "grad_norm": 1.0})
    callback.on_log(args, state(is_world_process_zero, 5, 640), control, logs={"eval_loss": 2.4, "eval_runtime": 0.1})
    callback.on_log(args, state(is_world_process_zero, 10, 1280), control, logs={"train_runtime": 3.5, "train_loss": 2.3})
    callback.on_train_end(args, state(is_world_process_zero), control)
    return args


def test_rank_zero_writes_steps_evals_and_end(tmp_path):
    path = tmp_path / "outputs" / "run" / "metrics.jsonl"
    args = simulate(MetricsCallback(path), is_world_process_zero=True)
    step, evaluation, end = records(path)
    assert step["step"] == 5 and step["loss"] == 2.5 and step["learning_rate"] == 1e-4
    assert step["tokens"] == 10 and step["tokens_per_s"] > 0 and step["time_s"] >= 0 and step["peak_mem_gib"] > 0
    assert set(step) == {"step", "loss", "learning_rate", "tokens", "tokens_per_s", "peak_mem_gib", "time_s"}
    assert evaluation == {"event": "eval", "step": 5, "eval_loss": 2.4}
    assert time.time() - 60 < end.pop("ended_at") <= time.time()  # where `run` splits its wall time
    assert end == {"event": "end", "step": 10, "train_runtime": 3.5, "train_loss": 2.3}
    assert not hasattr(args, "include_num_input_tokens_seen")  # Trainer's per-batch count is left off


def test_without_a_path_it_writes_into_the_training_arguments_output_dir(tmp_path):
    # What record-metrics adds to a notebook's trainer: the path comes from args.output_dir at train begin.
    args = SimpleNamespace(device=torch.device("cpu"), output_dir=str(tmp_path / "outputs"))
    simulate(MetricsCallback(), is_world_process_zero=True, args=args)
    assert [record.get("event") for record in records(tmp_path / "outputs" / "metrics.jsonl")] == [None, "eval", "end"]


def test_other_ranks_write_nothing(tmp_path):
    path = tmp_path / "outputs" / "metrics.jsonl"
    simulate(MetricsCallback(path), is_world_process_zero=False)
    assert not path.exists() and not path.parent.exists()


def test_a_new_training_run_starts_a_new_file(tmp_path):
    path = tmp_path / "metrics.jsonl"
    simulate(MetricsCallback(path), is_world_process_zero=True)
    simulate(MetricsCallback(path), is_world_process_zero=True)
    assert len(records(path)) == 3


def test_a_run_resumed_at_a_checkpoint_keeps_the_lines_up_to_its_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    killed = [{"event": "eval", "step": 0, "eval_loss": 3.0}, {"step": 4, "loss": 2.9}, {"step": 5, "loss": 2.8},
              {"step": 6, "loss": 2.7}]
    path.write_text("".join(json.dumps(record) + "\n" for record in killed) + '{"step": 7, "lo')  # killed mid-line
    callback, args, control = MetricsCallback(path), cpu_args(), TrainerControl()
    callback.on_train_begin(args, state(True, step=5), control, model=Counted())  # Trainer loaded checkpoint-5
    callback.on_log(args, state(True, 6, 64), control, logs={"loss": 2.65})
    assert [(record["step"], record.get("loss")) for record in records(path)] == [(0, None), (4, 2.9), (5, 2.8), (6, 2.65)]
    assert not list(tmp_path.glob(".*"))  # no temp file left behind


def test_tokens_per_second_over_each_interval(tmp_path, monkeypatch):
    clock = iter([100.0, 100.0, 102.0, 106.0])  # train begins (and the step split's first mark), two logs
    monkeypatch.setattr("nbddp.runtime.reporting.metrics.time.perf_counter", lambda: next(clock))
    path = tmp_path / "metrics.jsonl"
    callback, args, control, model = MetricsCallback(path), cpu_args(), TrainerControl(), Counted()
    callback.on_train_begin(args, state(True), control, model=model)
    model(input_ids=torch.ones(1, 1000, dtype=torch.long))
    callback.on_log(args, state(True, 1), control, logs={"loss": 3.0, "learning_rate": 0.1})
    model(input_ids=torch.ones(2, 1000, dtype=torch.long))
    callback.on_log(args, state(True, 2), control, logs={"loss": 2.0, "learning_rate": 0.1})
    first, second = records(path)
    assert (first["tokens"], second["tokens"]) == (1000, 2000)
    assert first["tokens_per_s"] == pytest.approx(1000 / 2) and first["time_s"] == pytest.approx(2)
    assert second["tokens_per_s"] == pytest.approx(2000 / 4) and second["time_s"] == pytest.approx(6)


def test_only_non_padding_tokens_of_training_passes_count(tmp_path):
    callback, args, control, model = MetricsCallback(tmp_path / "metrics.jsonl"), cpu_args(), TrainerControl(), Counted()
    callback.on_train_begin(args, state(True), control, model=model)
    ids, mask = torch.ones(2, 6, dtype=torch.long), torch.tensor([[1] * 6, [1] * 4 + [0] * 2])
    model(input_ids=ids, attention_mask=mask)  # 10 real tokens, 2 padding
    model(ids)  # positional input ids, no mask: all 12 count
    with torch.no_grad():  # generation
        model(input_ids=ids)
    model.eval()  # evaluation
    model(input_ids=ids)
    callback.on_log(args, state(True, 1), control, logs={"loss": 1.0})
    callback.on_train_end(args, state(True), control)
    model.train()
    model(input_ids=ids)  # after training: the hook is gone
    assert [record["tokens"] for record in records(tmp_path / "metrics.jsonl")] == [22]
    assert callback._tokens.item() == 0


def test_with_a_real_trainer(tiny_llama_dir, model_cache, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments

    from nbddp.examples.tiny_model import ensure_weights

    path = ensure_weights(str(tiny_llama_dir))
    model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    rows = [tokenizer("the cat sat on the mat")["input_ids"]] * 8
    dataset = [{"input_ids": torch.tensor(ids), "labels": torch.tensor(ids)} for ids in rows]
    output_dir = tmp_path / "outputs"
    args = TrainingArguments(
        output_dir=str(output_dir), max_steps=4, per_device_train_batch_size=2, logging_steps=2,
        report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=dataset, callbacks=[MetricsCallback(output_dir / "metrics.jsonl")])
    trainer.train()
    first, second, end = records(output_dir / "metrics.jsonl")
    assert (first["step"], second["step"]) == (2, 4)
    assert first["tokens"] == second["tokens"] == 2 * 2 * 6  # 2 steps of 2 rows of 6 tokens per logged line
    assert first["tokens_per_s"] > 0 and first["learning_rate"] > 0
    assert end["event"] == "end" and end["step"] == 4 and end["train_runtime"] > 0
    # The step split: each record's two steps, every phase measured, together the training's time up to the log
    assert first["step_split"]["steps"] == second["step_split"]["steps"] == 2
    assert all(record["step_split"][f"{phase}_s"] > 0 for record in (first, second) for phase in STEP_PHASES)
    measured = sum(record["step_split"][f"{phase}_s"] for record in (first, second) for phase in STEP_PHASES)
    assert measured == pytest.approx(second["time_s"], rel=0.25)


def test_a_training_run_that_raised_is_not_counted_twice_by_the_next(tmp_path):
    callback, args, control, model = MetricsCallback(tmp_path / "metrics.jsonl"), cpu_args(), TrainerControl(), Counted()
    callback.on_train_begin(args, state(True), control, model=model)  # this train() raises: no on_train_end
    callback.on_train_begin(args, state(True), control, model=model)  # the user runs the cell again
    model(input_ids=torch.ones(1, 7, dtype=torch.long))
    callback.on_log(args, state(True, 1), control, logs={"loss": 1.0})
    assert [record["tokens"] for record in records(tmp_path / "metrics.jsonl")] == [7]


def test_on_a_gpu_each_step_record_carries_its_model_flops_utilization(tmp_path, monkeypatch):
    from nbddp.runtime.reporting import metrics as reporting_metrics
    from nbddp.runtime.reporting import utilization

    config = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
              "vocab_size": 120}
    peak = {"device": "a GPU", "median_flops_per_s": 1e9}
    monkeypatch.setattr(reporting_metrics, "_flops_basis", lambda model, device: (config, 8, peak))
    path = tmp_path / "metrics.jsonl"
    args = SimpleNamespace(device=torch.device("cpu"), per_device_train_batch_size=2, gradient_accumulation_steps=1,
                           world_size=1)
    simulate(MetricsCallback(path), is_world_process_zero=True, args=args)
    basis, step, *_ = records(path)
    assert basis == {"event": "utilization", "device": "a GPU", "peak_flops_per_s": 1e9,
                     "convention": utilization.CONVENTION}
    # 10 tokens in 5 steps of 2 rows: rows of 1 token
    expected = step["tokens_per_s"] * utilization.flops_per_token(config, 1.0, 8) / 1e9
    assert step["mfu"] == pytest.approx(expected, rel=1e-9) and step["mfu"] > 0


def test_no_utilization_off_a_gpu_or_without_llama_widths():
    from nbddp.runtime.reporting.metrics import _flops_basis

    llama = SimpleNamespace(config=SimpleNamespace(to_dict=lambda: {
        "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
        "vocab_size": 120}))
    assert _flops_basis(llama, torch.device("cpu")) is None
    vision = SimpleNamespace(config=SimpleNamespace(to_dict=lambda: {"text_config": {"hidden_size": 64}}))
    assert _flops_basis(vision, torch.device("cuda", 0)) is None
