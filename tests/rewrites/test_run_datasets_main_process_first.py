import pytest
from rewrite_case import assert_rewrites, assert_unchanged, run

from nbddp.export.rewrites.run_datasets_main_process_first import RunDatasetsMainProcessFirst


def test_alpaca_data_prep_runs_on_local_rank_0_first():
    changes = assert_rewrites(
        RunDatasetsMainProcessFirst,
        """\
        EOS_TOKEN = tokenizer.eos_token

        from datasets import load_dataset
        # the cleaned Alpaca set
        dataset = load_dataset("yahma/alpaca-cleaned", split = "train")
        dataset = dataset.map(formatting_prompts_func, batched = True, num_proc = 4)  # adds "text"
        print(dataset)
        """,
        """\
        EOS_TOKEN = tokenizer.eos_token

        from datasets import load_dataset
        # the cleaned Alpaca set
        with ddp.main_process_first():
            dataset = load_dataset("yahma/alpaca-cleaned", split = "train")
            dataset = dataset.map(formatting_prompts_func, batched = True, num_proc = ddp.cap_num_proc(4))  # adds "text"
        print(dataset)
        """,
    )
    assert sorted(changes) == [
        (5, "load_dataset() runs on local rank 0 first; the other ranks reuse its cache"),
        (6, "dataset.map() runs on local rank 0 first; the other ranks reuse its cache"),
        (6, "num_proc=4 -> ddp.cap_num_proc(4) (every rank starts its own workers)"),
    ]


@pytest.mark.parametrize(
    "statement",
    [
        'ds = Dataset.from_dict({"text": texts})',
        "ds = datasets.Dataset.from_list(rows)",
        "ds = ds.filter(lambda row: len(row['text']) > 0)",
        "ds = ds.map(function=tokenize, batched=True)",
        'ds = load_dataset("json", data_files="data/train.jsonl")["train"].shuffle(seed=0)',
        "dataset = standardize_sharegpt(dataset)",  # Unsloth's helpers map with workers of their own
        "dataset = chat_templates.standardize_data_formats(dataset)",
        'trainer = train_on_responses_only(trainer, instruction_part="<|user|>", response_part="<|assistant|>")',
    ],
)
def test_every_dataset_builder_is_found(statement):
    code, changes = run(RunDatasetsMainProcessFirst, f"{statement}\n")
    assert code == f"with ddp.main_process_first():\n    {statement}\n"
    assert changes and all(line == 1 for line, _ in changes)


def test_blocks_that_every_rank_runs_are_wrapped_inside():
    assert_rewrites(
        RunDatasetsMainProcessFirst,
        """\
        for split in ("train", "test"):
            if split:
                parts[split] = parts[split].map(tokenize)
        """,
        """\
        for split in ("train", "test"):
            if split:
                with ddp.main_process_first():
                    parts[split] = parts[split].map(tokenize)
        """,
    )


def test_functions_and_main_process_blocks_are_not_wrapped_but_num_proc_is_capped():
    code, changes = run(
        RunDatasetsMainProcessFirst,
        """\
        def prepare(ds):
            return ds.map(tokenize, num_proc=8)
        if ddp.is_main_process:
            sample = load_dataset("x", split="train[:10]")
        with ddp.main_process_first():
            ds = load_dataset("x")
        """,
    )
    assert code.count("with ddp.main_process_first()") == 1
    assert "num_proc=ddp.cap_num_proc(8)" in code
    assert changes == [(2, "num_proc=8 -> ddp.cap_num_proc(8) (every rank starts its own workers)")]


def test_other_calls_and_tagged_cells_are_left_alone():
    assert_unchanged(
        RunDatasetsMainProcessFirst,
        """\
        squares = list(map(lambda x: x * x, numbers))
        kept = filter(None, rows)
        ds = ds.select(range(100))
        names = ds.map()
        """,
    )
    assert_unchanged(RunDatasetsMainProcessFirst, 'ds = load_dataset("x", num_proc=4)\n', tags={"main-process-first"})
    assert_unchanged(RunDatasetsMainProcessFirst, 'ds = load_dataset("x")\n', tags={"rank0"})
