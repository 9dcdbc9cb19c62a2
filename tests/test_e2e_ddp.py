"""The DDP guarantees end to end, on the real exported script, with two gloo processes on CPU:

- rank-0 side effects happen once: rank-0 prints appear once, the adapter is saved once, by rank 0, and loading it
  back onto the base model gives the trained model's logits;
- N processes train like one: run with the same flags, 2 processes log the losses of 1 process (the script keeps
  the notebook's global batch by halving the accumulation), and say so; `--batch_layout per-device` is classic DDP
  (2 processes x the notebook's accumulation 2 log the losses of 1 process x accumulation 4); batch values given on
  the command line are per process (2 processes x `--gradient_accumulation_steps 2` log the losses of 1 process
  x accumulation 4);
- a notebook written in Unsloth's style (tests/fixtures/unsloth_style) exports with the expected rewrites and runs.

Saves are counted by tests/fixtures/e2e/sitecustomize.py, which every process of a run imports at start-up.

The first two tests are the default tier's proof of these guarantees (one print, one save, per-step loss parity of
1 and 2 processes at the same global batch, the plan line); they read one pair of reference runs started in the
background (tests/conftest.py). The rest are e2e.
"""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SAVE_HOOK = REPO / "tests" / "fixtures" / "e2e" / "sitecustomize.py"
# A few steps, the held-out loss only before and after training, on a few rows: each run takes seconds of training.
# (The reference runs use these, with --warmup_steps 0: tests/fixtures/e2e/reference_runs.py.)
FEW_STEPS = ["--max_steps", "4", "--eval_steps", "100", "--eval_rows", "16"]

_spec = importlib.util.spec_from_file_location("pipeline", REPO / "pipeline.py")
pipeline = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pipeline)

def run_script(script, *flags, nproc, cwd=REPO, env=None):
    """`script` on `nproc` torchrun processes, or as plain `python script` when nproc is None."""
    launcher = [sys.executable] if nproc is None else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)]
    environ = {**os.environ, "CUDA_VISIBLE_DEVICES": "", **(env or {})}
    result = subprocess.run([*launcher, str(script), *flags], cwd=cwd, env=environ,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return result


def step_records(output_dir):
    records = map(json.loads, (Path(output_dir) / "metrics.jsonl").read_text().splitlines())
    return [record for record in records if "event" not in record]


def eval_losses(output_dir):
    """{step: held-out loss} from a run's metrics.jsonl (the last evaluation at a step, when there are two)."""
    records = map(json.loads, (Path(output_dir) / "metrics.jsonl").read_text().splitlines())
    return {record["step"]: record["eval_loss"] for record in records if record.get("event") == "eval"}


def losses(output_dir):
    """{step: training loss} from a run's metrics.jsonl."""
    return {record["step"]: record["loss"] for record in step_records(output_dir)}


@pytest.fixture
def save_hook(tmp_path):
    """Environment that makes every process record its PeftModel.save_pretrained calls in `log`."""
    folder = tmp_path / "hook"
    folder.mkdir()
    shutil.copy(SAVE_HOOK, folder / "sitecustomize.py")
    log = tmp_path / "saves.log"
    python_path = os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))
    return {"log": log, "env": {"PYTHONPATH": python_path, "NBDDP_E2E_SAVE_LOG": str(log)}}


@pytest.fixture(scope="module")
def example_script(tmp_path_factory):
    """notebooks/ exported afresh (generated/ may lag behind the notebooks while they are edited)."""
    out = tmp_path_factory.mktemp("generated")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(REPO)  # notebook paths in the script and its source map are relative to the repository
        assert pipeline.main(["export", "--out", str(out)]) == 0
    return out / "train.py"


def reference_output(runs, name):
    """What a reference run ("one": 1 process, "two": 2 torchrun processes) printed, stdout then stderr."""
    result = json.loads((runs / "results.json").read_text())[name]
    return result["stdout"] + result["stderr"]


# The default tier's two tests read the same reference runs (tests/conftest.py, tests/fixtures/e2e/reference_runs.py):
# the exported script with FEW_STEPS and warmup 0 on 1 process (one/) and on 2 processes (two/, saves recorded).


def test_two_processes_print_and_save_once_and_the_adapter_reproduces_the_trained_model(ddp_reference_runs):
    output_dir = ddp_reference_runs / "two"
    output = reference_output(ddp_reference_runs, "two")
    assert output.count("nbddp: backend=") == 1 and "world_size=2" in output
    assert output.count("held-out loss after 4 steps: ") == 1
    assert output.count(f"saved the adapters and tokenizer to {output_dir}/lora_adapter") == 1
    saves = (ddp_reference_runs / "saves.log").read_text().splitlines()
    assert saves == [f"0 {output_dir}/lora_adapter"]  # once, by rank 0
    assert sorted(losses(output_dir)) == [1, 2, 3, 4]

    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from nbddp.examples.tiny_model import ensure_weights

    trained = torch.load(ddp_reference_runs / "trained_logits.pt")
    base_path = ensure_weights(str(REPO / "models" / "tiny-llama"))
    base = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    with torch.no_grad():
        base_logits = base(input_ids=trained["input_ids"]).logits
        loaded = PeftModel.from_pretrained(base, output_dir / "lora_adapter").eval()
        loaded_logits = loaded(input_ids=trained["input_ids"]).logits
    assert not torch.allclose(base_logits, trained["logits"], atol=1e-4)  # training changed what the model says
    torch.testing.assert_close(loaded_logits, trained["logits"], rtol=1e-5, atol=1e-5)


def test_two_processes_with_the_same_flags_log_the_losses_of_one_process(ddp_reference_runs):
    """No batch flag: the notebook's 4 rows x 2 micro batches per step on 1 process, kept on 2 processes as
    4 x 1 x 2 (the default `--batch_layout notebook`). Loss normalisation across ranks must make them equal.

    On one CPU they agree to the last bit; 1e-5 leaves room for other CPUs' rounding and still fails when each rank
    averages over its own tokens (average_tokens_across_devices=False)."""
    assert_same_training(ddp_reference_runs / "one", ddp_reference_runs / "two")
    output = reference_output(ddp_reference_runs, "two")
    plan = ("global batch 8 rows = 4 per device x 1 accumulation x 2 processes (the notebook: 4 x 2 x 1; "
            "--batch_layout notebook)")
    assert output.count(f"nbddp: SFTConfig: {plan}") == 1  # rank 0 says it, once
    records = map(json.loads, (ddp_reference_runs / "two" / "metrics.jsonl").read_text().splitlines())
    assert [record["text"] for record in records if record.get("event") == "batch_plan"] == [plan]


@pytest.mark.e2e
def test_per_device_layout_is_classic_ddp(example_script, tmp_path):
    """`--batch_layout per-device`: each process runs the notebook's per-device settings (4 x 2), so 2 processes
    train the global batch of 1 process x accumulation 4, as every DDP script does."""
    flags = [*FEW_STEPS, "--warmup_steps", "0"]
    run_script(example_script, *flags, "--gradient_accumulation_steps", "4", "--output_dir", str(tmp_path / "one"),
               nproc=None)
    result = run_script(example_script, *flags, "--batch_layout", "per-device", "--output_dir", str(tmp_path / "two"),
                        nproc=2)
    assert "global batch 16 rows = 4 per device x 2 accumulation x 2 processes" in result.stdout
    assert_same_training(tmp_path / "one", tmp_path / "two")


@pytest.mark.e2e
@pytest.mark.parametrize("how", ["flags", "set"])
def test_batch_values_on_the_command_line_are_per_process(example_script, tmp_path, how):
    """`--gradient_accumulation_steps 2` (or `--set`) on 2 processes is 2 per process, as in every Hugging Face
    script: 2 x 2 x 2 trains the global batch of 1 process at 2 x 4, and the plan line says whose values they are."""
    def batch(micro, accumulation):
        if how == "set":
            return ["--set", f"per_device_train_batch_size={micro}",
                    "--set", f"gradient_accumulation_steps={accumulation}"]
        return ["--per_device_train_batch_size", str(micro), "--gradient_accumulation_steps", str(accumulation)]

    flags = [*FEW_STEPS, "--warmup_steps", "0"]
    run_script(example_script, *flags, *batch(2, 4), "--output_dir", str(tmp_path / "one"), nproc=None)
    result = run_script(example_script, *flags, *batch(2, 2), "--output_dir", str(tmp_path / "two"), nproc=2)
    one, two = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert sorted(one) == sorted(two) == [1, 2, 3, 4]
    for step in one:
        assert two[step] == pytest.approx(one[step], rel=1e-3), f"step {step}: 1 process {one[step]}, 2: {two[step]}"
    assert_same_training(tmp_path / "one", tmp_path / "two")  # and closer still on one CPU: see the test above
    assert "global batch 8 rows = 2 per device x 2 accumulation x 2 processes (command line)" in result.stdout


def assert_same_training(one_dir, two_dir):
    """Per-step training losses to 1e-5, held-out losses to 1e-6, tokens per step equal."""
    one, two = losses(one_dir), losses(two_dir)
    assert sorted(one) == sorted(two) == [1, 2, 3, 4]
    assert len(set(one.values())) == 4  # the steps saw different batches (and updated weights)
    for step in one:
        assert two[step] == pytest.approx(one[step], abs=1e-5), f"step {step}: 1 process {one[step]}, 2: {two[step]}"
    # The held-out loss too, before and after training (16 held-out rows: two evaluation batches, which
    # Transformers alone normalises across ranks together, 6.40911 against 6.40937 before training).
    evals_one, evals_two = eval_losses(one_dir), eval_losses(two_dir)
    assert sorted(evals_one) == sorted(evals_two) == [0, 4]
    for step in evals_one:
        assert evals_two[step] == pytest.approx(evals_one[step], abs=1e-6), f"eval at {step}: {evals_one} vs {evals_two}"
    # metrics.jsonl counts the tokens of the global batch: rank 0 alone would count half of them
    tokens_one = [record["tokens"] for record in step_records(one_dir)]
    assert [record["tokens"] for record in step_records(two_dir)] == tokens_one
    assert all(count > 8 for count in tokens_one)  # 8 rows of several tokens each


EXPECTED_UNSLOTH_STYLE_REWRITES = [
    "[convert-magics] dropped `%%capture`; its body is kept",
    "[convert-magics] dropped `!pip install unsloth` (install packages before running the script)",
    "[inject-device-map] added device_map=ddp.device_map()",
    '[replace-cuda-device] replaced .to("cuda") with .to(ddp.device)',
    "[replace-cuda-device] replaced torch.cuda.get_device_properties(0) with ddp.device_properties()",
    "[rename-trainer-tokenizer] tokenizer= -> processing_class=",
    "[record-metrics] added callbacks=[ddp.metrics_callback()]",
    "[set-ddp-training-args] added ddp_find_unused_parameters=False, average_tokens_across_devices=True",
    "[set-ddp-training-args] fp16=not is_bfloat16_supported() -> fp16=ddp.gpu_only(...)",
    '[set-ddp-training-args] optim="adamw_8bit" -> ddp.optimizer("adamw_8bit")',
    "[guard-rank0-side-effects] model.save_pretrained() runs on the main process only",
    "[guard-inference-cell] the cell generates text (FastLanguageModel.for_inference): it runs on the main process",
    "[show-cell-result] tokenizer.batch_decode(outputs) is shown once unless None, as Jupyter shows a cell's last value",
    '[convert-magics] `!mkdir -p lora_model && echo "fine-tuned on the Alpaca rows, at most {max_seq_length} tokens each" '
    '>> lora_model/NOTES.txt` -> ddp.shell',
    '[convert-magics] `%%writefile lora_model/TRAINING.md` -> ddp.write_file("lora_model/TRAINING.md", ...): written once',
]


@pytest.mark.e2e
def test_an_unsloth_style_notebook_exports_and_trains_on_two_processes(save_hook, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    assert pipeline.main(["export", "--notebooks", "tests/fixtures/unsloth_style", "--out", str(tmp_path)]) == 0
    report = capsys.readouterr().out
    for rewrite in EXPECTED_UNSLOTH_STYLE_REWRITES:
        assert rewrite in report

    # The notebook saves to the relative folders `lora_model` and `outputs`: its cells run in a scratch folder
    # (--workdir), not in the fixture's, with its model and data paths made absolute.
    work = tmp_path / "work"
    work.mkdir()
    result = run_script(tmp_path / "train.py", "--max_steps", "2", "--model_name", str(REPO / "models" / "tiny-llama"),
                        "--data_path", str(REPO / "data" / "tiny_instructions.jsonl"), "--workdir", str(work),
                        nproc=2, cwd=work, env=save_hook["env"])

    assert (result.stdout + result.stderr).count("nbddp: backend=") == 1
    # The generation cell ends with `tokenizer.batch_decode(outputs)`, which Jupyter shows: rank 0 prints it once.
    assert result.stdout.count("moon river cat fox") == 1
    # Unsloth's memory-statistics cells (torch.cuda.get_device_properties(0)) run on CPU too, and print once.
    assert result.stdout.count("GPU = CPU (no GPU). Max memory = ") == 1
    assert result.stdout.count("Peak reserved memory = 0.0 GB.") == 1
    saves = save_hook["log"].read_text().splitlines()
    # Trainer also saves a checkpoint at the last step (its save_strategy defaults to "steps"), on rank 0 alone.
    assert [save for save in saves if "checkpoint-" not in save] == ["0 lora_model"]
    assert all(save.startswith("0 ") for save in saves)
    assert (work / "lora_model" / "adapter_config.json").is_file()
    # The notebook's shell command and %%writefile cell ran once for the machine's two ranks.
    # {max_seq_length} filled in from the script's variables, as IPython fills it in.
    assert (work / "lora_model" / "NOTES.txt").read_text() == "fine-tuned on the Alpaca rows, at most 2048 tokens each\n"
    assert (work / "lora_model" / "TRAINING.md").read_text().startswith("# LoRA adapters from the Alpaca fixture")
    assert result.stdout.count("Writing lora_model/TRAINING.md") == 1
    # record-metrics gave the notebook's trainer nbddp's metrics, in its output_dir, written once (rank 0).
    assert [record["step"] for record in step_records(work / "outputs")] == [1, 2]
    assert (work / "lora_model" / "adapter_model.safetensors").is_file()
