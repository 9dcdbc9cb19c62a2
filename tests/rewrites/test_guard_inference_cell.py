import textwrap

import libcst as cst
import pytest
from rewrite_case import assert_rewrites, assert_unchanged, run

from nbddp.export.rewrites.guard_inference_cell import GuardInferenceCell, rank0_block


def test_unsloth_inference_cell_runs_on_the_main_process_only():
    changes = assert_rewrites(
        GuardInferenceCell,
        """\
        # alpaca_prompt = Copied from above
        FastLanguageModel.for_inference(model) # Enable native 2x faster inference
        inputs = tokenizer(
        [
            alpaca_prompt.format("Continue the fibonnaci sequence.", "1, 1, 2, 3, 5, 8", "")
        ], return_tensors = "pt").to(ddp.device)

        outputs = model.generate(**inputs, max_new_tokens = 64, use_cache = True)
        tokenizer.batch_decode(outputs)
        """,
        """\
        # alpaca_prompt = Copied from above
        if ddp.is_main_process:
            FastLanguageModel.for_inference(model) # Enable native 2x faster inference
            inputs = tokenizer(
            [
                alpaca_prompt.format("Continue the fibonnaci sequence.", "1, 1, 2, 3, 5, 8", "")
            ], return_tensors = "pt").to(ddp.device)

            outputs = model.generate(**inputs, max_new_tokens = 64, use_cache = True)
            tokenizer.batch_decode(outputs)
        ddp.barrier()
        """,
    )
    assert changes == [
        (
            2,
            "the cell generates text (FastLanguageModel.for_inference): it runs on the main process only,"
            " then ddp.barrier()",
        )
    ]


@pytest.mark.parametrize(
    "line",
    [
        "_ = model.generate(**inputs, streamer = text_streamer, max_new_tokens = 128)",
        "streamer = TextStreamer(tokenizer, skip_prompt = True)",
        'pipe = pipeline("text-generation", model=model, tokenizer=tokenizer)',
        'pipe = transformers.pipeline(task="text-generation", model=model)',
        "FastModel.for_inference(model)",
        "output = model.fast_generate([text], sampling_params = sampling_params, lora_request = None)",
    ],
)
def test_every_kind_of_generation_is_found(line):
    code, changes = run(GuardInferenceCell, f"x = 1\n{line}\n")
    assert code == f"if ddp.is_main_process:\n    x = 1\n    {line}\nddp.barrier()\n"
    assert [number for number, _ in changes] == [2]


def test_unsloth_vllm_inference_cell_with_its_lora_runs_on_the_main_process_only():
    # GRPO notebooks with fast_inference = True (Advanced_Llama3_1_(3B)_GRPO_LoRA, cell 47): vLLM sampling with the
    # LoRA just saved; the cell's last value is shown, once.
    changes = assert_rewrites(
        GuardInferenceCell,
        """\
        from vllm import SamplingParams
        sampling_params = SamplingParams(temperature = 0.8, max_tokens = 1024)
        output = model.fast_generate(
            text,
            sampling_params = sampling_params,
            lora_request = model.load_lora("grpo_saved_lora"),
        )[0].outputs[0].text
        ddp.show(output)
        """,
        """\
        from vllm import SamplingParams
        if ddp.is_main_process:
            sampling_params = SamplingParams(temperature = 0.8, max_tokens = 1024)
            output = model.fast_generate(
                text,
                sampling_params = sampling_params,
                lora_request = model.load_lora("grpo_saved_lora"),
            )[0].outputs[0].text
            ddp.show(output)
        ddp.barrier()
        """,
    )
    assert changes == [(3, "the cell generates text (model.fast_generate): it runs on the main process only, then "
                           "ddp.barrier()")]


def test_loading_a_lora_alone_generates_nothing():
    assert_unchanged(GuardInferenceCell, 'lora_request = model.load_lora("grpo_saved_lora")\n')


def test_leading_imports_and_rebindings_stay_on_every_rank():
    # Unsloth's conversational notebooks open their inference cell so: under the guard, ranks other than 0 would
    # go on with the tokenizer that has no chat template.
    code, changes = run(GuardInferenceCell, """\
        from unsloth.chat_templates import get_chat_template
        tokenizer = get_chat_template(
            tokenizer,
            chat_template = "llama-3.1",
        )
        FastLanguageModel.for_inference(model)
        messages = [{"role": "user", "content": "Continue: 1, 1, 2, 3, 5, 8,"}]
        outputs = model.generate(input_ids = tokenizer.apply_chat_template(messages), max_new_tokens = 64)
        """)
    assert code == textwrap.dedent("""\
        from unsloth.chat_templates import get_chat_template
        tokenizer = get_chat_template(
            tokenizer,
            chat_template = "llama-3.1",
        )
        if ddp.is_main_process:
            FastLanguageModel.for_inference(model)
            messages = [{"role": "user", "content": "Continue: 1, 1, 2, 3, 5, 8,"}]
            outputs = model.generate(input_ids = tokenizer.apply_chat_template(messages), max_new_tokens = 64)
        ddp.barrier()
        """)
    assert changes == [
        (6, "the cell generates text (FastLanguageModel.for_inference): it runs on the main process only, then "
            "ddp.barrier()"),
        (2, "`tokenizer` is rebound from its old value before the main-process block, on every rank, so that all "
            "ranks go on with the same `tokenizer`"),
    ]


def test_a_rebinding_after_other_statements_stays_guarded_with_a_note():
    code, changes = run(GuardInferenceCell, """\
        messages = [{"role": "user", "content": "Continue: 1, 1, 2, 3, 5, 8,"}]
        tokenizer = get_chat_template(tokenizer, chat_template = "llama-3.1")
        outputs = model.generate(input_ids = tokenizer.apply_chat_template(messages), max_new_tokens = 64)
        """)
    assert code.startswith("if ddp.is_main_process:\n    messages = ")
    assert changes[1:] == [(2, "`tokenizer` is rebound from its old value on the main process only; the other "
                               "ranks keep the old `tokenizer` (move that line to a cell of its own to run it on "
                               "every rank)")]


def test_a_rebinding_that_generates_is_guarded():
    code, _ = run(GuardInferenceCell, "model = FastLanguageModel.for_inference(model)\nprint(model.generate(x))\n")
    assert code.startswith("if ddp.is_main_process:\n    model = FastLanguageModel.for_inference(model)\n")


def test_generation_nested_in_a_loop_guards_the_whole_cell():
    before = "for prompt in prompts:\n    if prompt:\n        print(model.generate(prompt))\n"
    code, changes = run(GuardInferenceCell, before)
    assert code.startswith("if ddp.is_main_process:\n    for prompt in prompts:\n")
    assert changes[0][0] == 3


def test_generation_inside_a_function_the_cell_defines_does_not_count():
    assert_unchanged(GuardInferenceCell, "def ask(question):\n    return model.generate(question)\nx = lambda q: model.generate(q)\n")


def test_cells_without_generation_or_tagged_are_left_alone():
    assert_unchanged(GuardInferenceCell, 'pipe = pipeline("text-classification")\nFastLanguageModel.for_training(model)\n')
    assert_unchanged(GuardInferenceCell, "out = model.generate(x)\n", tags={"rank0"})
    assert_unchanged(GuardInferenceCell, "out = model.generate(x)\n", tags={"main-process-first"})


def test_a_cell_that_also_trains_is_left_for_all_ranks_with_a_note():
    before = "trainer_stats = trainer.train()\noutputs = model.generate(**inputs)\n"
    code, changes = run(GuardInferenceCell, before)
    assert code == before
    assert changes == [
        (
            2,
            "the cell generates text but also calls trainer.train(), which every rank must run; left for all ranks"
            " (put the generation in a cell of its own to run it on the main process only)",
        )
    ]


def test_rank0_block_keeps_header_comments_and_trailing_comments():
    module = cst.parse_module("# heading\n\nx = 1\nif x:\n    y = 2\n# the end\n")
    assert rank0_block(module).code == (
        "# heading\n\nif ddp.is_main_process:\n    x = 1\n    if x:\n        y = 2\n    # the end\nddp.barrier()\n"
    )


def test_rank0_block_of_a_cell_without_code_is_the_cell():
    module = cst.parse_module("# only a comment\n")
    assert rank0_block(module).code == "# only a comment\n"
