"""A smoke run (NBDDP_SMOKE_DIR) saves into its folder and pushes nothing (nbddp/runtime/smoke_sandbox.py)."""
import os
import socket
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from nbddp import patches
from nbddp.runtime import smoke_sandbox
from nbddp.runtime.context import DistributedContext

REPO = Path(__file__).parents[2]
TINY_LLAMA = REPO / "models" / "tiny-llama"
SAVED_THERE = "(the training run writes where the notebook says)"


@pytest.fixture
def project(tmp_path, monkeypatch, model_cache):
    """The user's project folder, the working directory; the libraries' methods as they are now, put back after."""
    (tmp_path / "project").mkdir()
    monkeypatch.chdir(tmp_path / "project")
    monkeypatch.delenv(smoke_sandbox.SMOKE_DIR_VARIABLE, raising=False)
    monkeypatch.setattr(smoke_sandbox, "_announced", set())
    for owner, name, _ in smoke_sandbox.targets():
        if name in vars(owner):
            monkeypatch.setattr(owner, name, vars(owner)[name])
    return tmp_path / "project"


@pytest.fixture
def smoke_run(project, monkeypatch):
    """A smoke run's folder, as `pipeline.py smoke` makes it, with the sandbox installed (as runtime.setup does)."""
    smoke = project / "runs" / "20260101T000000Z-smoke"
    smoke.mkdir(parents=True)
    monkeypatch.setenv(smoke_sandbox.SMOKE_DIR_VARIABLE, str(smoke))
    smoke_sandbox.install()
    return smoke


@pytest.fixture
def no_network(monkeypatch):
    """Every connection and name lookup is recorded and refused."""
    calls = []

    def refuse(*args, **kwargs):
        calls.append(args)
        raise OSError("no network in this test")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    return calls


def tiny_lora():
    """The repo's tiny Llama (weights built by ensure_weights) with LoRA adapters, and its tokenizer."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from nbddp.examples.tiny_model import ensure_weights

    path = ensure_weights(str(TINY_LLAMA))
    model = AutoModelForCausalLM.from_pretrained(path)
    lora = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    return lora, AutoTokenizer.from_pretrained(path)


def listing(folder):
    return sorted(str(path.relative_to(folder)) for path in Path(folder).rglob("*"))


def created_outside(smoke, project, before):
    """What is in `project` now and was not in the listing `before`, outside the smoke folder."""
    inside = str(smoke.relative_to(project))
    return [path for path in listing(project) if path not in before and not path.startswith(inside)]


def test_a_smoke_runs_saves_land_in_its_folder_and_nothing_in_the_project(smoke_run, project, model_cache, capsys):
    model, tokenizer = tiny_lora()  # ensure_weights writes nbddp's cache, not the smoke folder
    assert next(model_cache.rglob("*.safetensors"), None) is not None
    before = listing(project)
    model.save_pretrained("lora_model")
    tokenizer.save_pretrained("lora_model")
    model.base_model.model.save_pretrained(project / "merged")  # a Path, absolute, in the project
    assert created_outside(smoke_run, project, before) == []
    saved = set(os.listdir(smoke_run / "lora_model"))
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"} <= saved
    assert "model.safetensors" in os.listdir(smoke_run / "merged")
    assert capsys.readouterr().out.splitlines() == [  # one line per destination, however many saves go there
        f"nbddp: smoke run: save to lora_model went to runs/20260101T000000Z-smoke/lora_model {SAVED_THERE}",
        f"nbddp: smoke run: save to {project / 'merged'} went to runs/20260101T000000Z-smoke/merged {SAVED_THERE}"]


def test_outside_a_smoke_run_nothing_is_wrapped_and_saves_go_where_the_notebook_says(project, capsys):
    from peft import PeftModel

    original = PeftModel.save_pretrained
    smoke_sandbox.install()
    assert PeftModel.save_pretrained is original
    model, _ = tiny_lora()
    model.save_pretrained("lora_model")
    assert (project / "lora_model" / "adapter_config.json").is_file()
    assert capsys.readouterr().out == ""


def test_pushes_and_uploads_are_skipped_with_one_line_each_and_no_network_call(smoke_run, project, no_network, capsys):
    import huggingface_hub

    model, tokenizer = tiny_lora()
    before = listing(project)
    model.push_to_hub("me/lora")
    tokenizer.push_to_hub("me/lora")
    model.base_model.model.save_pretrained("merged", push_to_hub=True, repo_id="me/merged")
    huggingface_hub.HfApi().upload_file(path_or_fileobj=b"x", path_in_repo="x.txt", repo_id="me/file")
    huggingface_hub.upload_folder(folder_path=str(project), repo_id="me/folder")
    assert no_network == []
    assert created_outside(smoke_run, project, before) == [] and (smoke_run / "merged" / "config.json").is_file()
    assert capsys.readouterr().out.splitlines() == [
        "nbddp: smoke run: push_to_hub to me/lora skipped (the training run pushes)",
        f"nbddp: smoke run: save to merged went to runs/20260101T000000Z-smoke/merged {SAVED_THERE}",
        "nbddp: smoke run: save_pretrained(push_to_hub=True) to me/merged skipped (the training run pushes)",
        "nbddp: smoke run: upload_file to me/file skipped (the training run pushes)",
        "nbddp: smoke run: upload_folder to me/folder skipped (the training run pushes)"]


def test_a_trainers_checkpoints_stay_whole_in_its_output_dir_and_its_pushes_are_skipped(smoke_run, project, tmp_path,
                                                                                        no_network, capsys):
    from transformers import Trainer, TrainingArguments

    model, _ = tiny_lora()
    elsewhere = tmp_path / "elsewhere"  # outside the project: an output_dir the user gave (-p output_dir)
    args = DistributedContext().training_args(TrainingArguments)(
        output_dir=str(elsewhere), max_steps=1, save_strategy="steps", save_steps=1, report_to="none",
        per_device_train_batch_size=1, use_cpu=True, push_to_hub=True, hub_model_id="me/trained")
    assert args.push_to_hub is False
    rows = [{"input_ids": [1, 3, 4, 5, 2], "labels": [1, 3, 4, 5, 2]}] * 2
    trainer = Trainer(model=model, args=args, train_dataset=rows)
    trainer.train()
    assert {"adapter_model.safetensors", "optimizer.pt", "trainer_state.json"} <= set(
        os.listdir(elsewhere / "checkpoint-1"))
    trainer.save_model("final")
    trainer.push_to_hub()
    assert (smoke_run / "final" / "adapter_config.json").is_file() and not (project / "final").exists()
    assert not (smoke_run / smoke_sandbox.OUTSIDE_PROJECT).exists()
    assert no_network == []
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("nbddp: smoke run:")]
    assert lines == [
        "nbddp: smoke run: TrainingArguments(push_to_hub=True) to me/trained skipped (the training run pushes)",
        f"nbddp: smoke run: save to final went to runs/20260101T000000Z-smoke/final {SAVED_THERE}"]


def test_writefile_and_savefig_go_to_the_smoke_folder_and_a_path_outside_the_project_under_abs(smoke_run, project,
                                                                                              tmp_path, capsys):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    (project / "notes").mkdir()
    (tmp_path / "outside").mkdir()
    DistributedContext().write_file("notes/README.md", "adapters\n")
    plt.plot([1, 2])
    plt.savefig("loss.png")
    plt.gcf().savefig(tmp_path / "outside" / "loss.png")
    plt.close("all")
    assert (smoke_run / "notes" / "README.md").read_text() == "adapters\n"
    assert (smoke_run / "loss.png").is_file()
    outside = smoke_run / smoke_sandbox.OUTSIDE_PROJECT / tmp_path.relative_to("/") / "outside" / "loss.png"
    assert outside.is_file()
    assert listing(project / "notes") == [] and not (project / "loss.png").exists()
    assert listing(tmp_path / "outside") == []
    assert capsys.readouterr().out.splitlines() == [
        f"nbddp: smoke run: save to notes/README.md went to runs/20260101T000000Z-smoke/notes/README.md {SAVED_THERE}",
        "Writing runs/20260101T000000Z-smoke/notes/README.md",
        f"nbddp: smoke run: save to loss.png went to runs/20260101T000000Z-smoke/loss.png {SAVED_THERE}",
        f"nbddp: smoke run: save to {tmp_path / 'outside' / 'loss.png'} went to {outside.relative_to(project)} "
        f"{SAVED_THERE}"]


def test_installing_twice_wraps_once(smoke_run):
    from peft import PeftModel

    smoke_sandbox.install()
    assert patches.is_patched(PeftModel.save_pretrained, smoke_sandbox.PATCH)
    assert not patches.is_patched(PeftModel.save_pretrained.__wrapped__, smoke_sandbox.PATCH)


def test_unsloths_saving_functions_are_redirected_and_its_pushes_skipped(smoke_run, monkeypatch, capsys):
    # Unsloth binds these functions of unsloth.save to each model it loads (patch_saving_functions), by name.
    calls = []

    def unsloth_generic_save_pretrained_merged(self, save_directory, tokenizer=None):
        calls.append(save_directory)

    def unsloth_push_to_hub_gguf(self, repo_id, tokenizer=None):
        calls.append(repo_id)

    save = types.ModuleType("unsloth.save")
    save.unsloth_generic_save_pretrained_merged = unsloth_generic_save_pretrained_merged
    save.unsloth_push_to_hub_gguf = unsloth_push_to_hub_gguf
    monkeypatch.setitem(sys.modules, "unsloth.save", save)
    smoke_sandbox.install()
    model = types.SimpleNamespace()  # what patch_saving_functions does with each model
    model.save_pretrained_merged = types.MethodType(save.unsloth_generic_save_pretrained_merged, model)
    model.push_to_hub_gguf = types.MethodType(save.unsloth_push_to_hub_gguf, model)
    model.save_pretrained_merged("model", tokenizer=None)
    model.push_to_hub_gguf("me/gguf")
    assert calls == ["runs/20260101T000000Z-smoke/model"]
    assert capsys.readouterr().out.splitlines()[-1] == (
        "nbddp: smoke run: unsloth_push_to_hub_gguf to me/gguf skipped (the training run pushes)")


def test_setup_installs_it_in_a_smoke_run(tmp_path):
    # What a generated script's setup cell does, in a fresh interpreter with the smoke run's variable set.
    code = textwrap.dedent(f"""
        from nbddp import runtime
        ddp = runtime.setup(backend="hf", script=None)
        from transformers import AutoModelForCausalLM
        from nbddp.examples.tiny_model import ensure_weights
        model = AutoModelForCausalLM.from_pretrained(ensure_weights({str(TINY_LLAMA)!r}))
        model.save_pretrained("lora_model")
        model.push_to_hub("me/lora")
        """)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "NBDDP_CACHE": str(tmp_path / "cache"),
           smoke_sandbox.SMOKE_DIR_VARIABLE: "runs/x-smoke", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=180)
    assert result.returncode == 0, result.stderr
    assert sorted(os.listdir(tmp_path)) == ["cache", "runs"]
    assert (tmp_path / "runs" / "x-smoke" / "lora_model" / "model.safetensors").is_file()
    assert "nbddp: smoke run: push_to_hub to me/lora skipped (the training run pushes)" in result.stdout


def test_the_wrappers_and_what_they_read_can_be_pickled_by_value():
    # datasets fingerprints map functions with dill, which pickles by value the classes Unsloth patches at run
    # time, these wrappers among their methods, and the module globals the wrappers read.
    import dill

    from nbddp.runtime import smoke_sandbox

    wrapped = smoke_sandbox._redirecting("save_directory")(lambda self, path: path)
    assert dill.loads(dill.dumps(wrapped, recurse=True)) is not None
    for name in ("_state", "_announced"):
        dill.dumps(getattr(smoke_sandbox, name))


def test_the_cells_open_writes_into_the_smoke_folder_appends_to_a_copy_and_reads_what_it_wrote(smoke_run, project,
                                                                                              capsys):
    (project / "notes.txt").write_text("the user's\n")
    namespace = {}
    smoke_sandbox.install(namespace=namespace)
    cell_open = namespace["open"]
    with cell_open("results.json", "w") as file:
        file.write("{}")
    with cell_open("notes.txt", "a") as file:
        file.write("smoke\n")
    with cell_open("results.json") as file:  # a later cell reads what this run wrote
        assert file.read() == "{}"
    with cell_open("notes.txt", encoding="utf-8") as file:
        assert file.read() == "the user's\nsmoke\n"
    assert (project / "notes.txt").read_text() == "the user's\n" and not (project / "results.json").exists()
    assert (smoke_run / "results.json").read_text() == "{}"
    with cell_open(os.open(project / "notes.txt", os.O_RDONLY)) as file:  # a file descriptor is the builtin's
        assert file.read() == "the user's\n"
    assert capsys.readouterr().out.splitlines() == [
        f"nbddp: smoke run: save to results.json went to runs/20260101T000000Z-smoke/results.json {SAVED_THERE}",
        f"nbddp: smoke run: save to notes.txt went to runs/20260101T000000Z-smoke/notes.txt {SAVED_THERE}",
        "nbddp: smoke run: results.json read from runs/20260101T000000Z-smoke/results.json, where this smoke run "
        "saved it",
        "nbddp: smoke run: notes.txt read from runs/20260101T000000Z-smoke/notes.txt, where this smoke run saved it"]


def test_outside_a_smoke_run_the_cells_open_is_the_builtin(project):
    namespace = {}
    smoke_sandbox.install(namespace=namespace)
    assert namespace == {}


def test_torch_save_and_save_to_disk_are_redirected_and_read_back(smoke_run, project):
    import datasets
    import torch

    torch.save({"step": 3}, "state.pt")
    datasets.Dataset.from_dict({"text": ["a", "b"]}).save_to_disk("prepared")
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["c"]})}).save_to_disk(
        dataset_dict_path=str(project / "splits"))
    assert sorted(os.listdir(project)) == ["runs"]
    assert torch.load("state.pt") == {"step": 3}
    assert datasets.load_from_disk("prepared")["text"] == ["a", "b"]
    assert datasets.DatasetDict.load_from_disk(project / "splits")["train"]["text"] == ["c"]
    assert (smoke_run / "state.pt").is_file() and (smoke_run / "prepared").is_dir() and (smoke_run / "splits").is_dir()


def test_from_pretrained_of_a_folder_this_smoke_run_saved_loads_the_smoke_runs_copy(smoke_run, project, capsys):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from nbddp.examples.tiny_model import ensure_weights

    model, tokenizer = tiny_lora()
    model.save_pretrained("lora_model")
    tokenizer.save_pretrained("lora_model")
    assert not (project / "lora_model").exists()
    base = AutoModelForCausalLM.from_pretrained(ensure_weights(str(TINY_LLAMA)))  # not saved here: read as it is
    reloaded = PeftModel.from_pretrained(base, "lora_model")
    assert AutoTokenizer.from_pretrained("lora_model").vocab_size == tokenizer.vocab_size
    assert reloaded.peft_config["default"].r == 4
    lines = [line for line in capsys.readouterr().out.splitlines() if " read from " in line]
    assert lines == ["nbddp: smoke run: lora_model read from runs/20260101T000000Z-smoke/lora_model, where this "
                     "smoke run saved it"]


def test_a_module_the_notebook_writes_stays_importable_from_the_smoke_runs_copy(smoke_run, project, monkeypatch):
    # `%%writefile reward.py` then `from reward import ...`, as GRPO notebooks do; the cells' folder is on sys.path.
    monkeypatch.setattr(sys, "path", ["", *sys.path])
    monkeypatch.delitem(sys.modules, "smoke_written_reward", raising=False)
    DistributedContext().write_file("smoke_written_reward.py", "SCORE = 7\n")
    import smoke_written_reward

    assert smoke_written_reward.SCORE == 7 and not (project / "smoke_written_reward.py").exists()
    assert Path(smoke_written_reward.__file__) == smoke_run / "smoke_written_reward.py"
