import textwrap

import pytest
from rewrite_case import assert_unchanged, run

from nbddp.export.rewrites.warn_remote_generation import WarnRemoteGeneration

ADVICE = ("under torchrun every rank makes its calls, here and through what it builds in later cells: N times the "
          "cost and time, and each rank may get different answers (a dataset that differs between ranks); generate "
          "once and save it (tag the generating cells notebook-only and run them in Jupyter), then load the saved "
          "file in a cell every rank runs")


def test_the_raft_notebooks_gpt_4o_client_gets_a_warning_at_its_line():
    # Llama3.2_(1B)-RAFT, cell 13: the client that RAFTDatasetPack(...).run() generates the dataset with, two cells on.
    before = """\
        from llama_index.llms.openai import OpenAI
        from llama_index.embeddings.openai import OpenAIEmbedding

        Settings.llm = OpenAI(model = "gpt-4o")
        Settings.embed_model = OpenAIEmbedding(model = "text-embedding-ada-002")
        """
    code, changes = run(WarnRemoteGeneration, before)
    assert code == textwrap.dedent(before)
    assert changes == [(4, f"warning: the cell generates through a remote API (OpenAI): {ADVICE}")]


@pytest.mark.parametrize("line, call", [
    ('reply = client.chat.completions.create(model = "gpt-4o", messages = messages)', "client.chat.completions.create"),
    ("client = openai.OpenAI()", "openai.OpenAI"),
    ('reply = openai.ChatCompletion.create(model = "gpt-4", messages = messages)', "openai.ChatCompletion.create"),
    ("client = AsyncOpenAI(api_key = key)", "AsyncOpenAI"),
])
def test_every_kind_of_remote_generation_is_found_once_per_cell(line, call):
    _, changes = run(WarnRemoteGeneration, f"x = 1\nfor row in rows:\n    {line}\n    {line}\n")
    assert changes == [(3, f"warning: the cell generates through a remote API ({call}): {ADVICE}")]


def test_calls_that_run_once_or_per_rank_on_purpose_are_left_alone():
    # A reward function scores each rank's own completions; a rank0 cell or a main-process block runs once.
    assert_unchanged(WarnRemoteGeneration, """\
        def judge(completions, **kwargs):
            return [client.chat.completions.create(messages = c) for c in completions]
        score = lambda c: client.chat.completions.create(messages = c)
        if ddp.is_main_process:
            data = openai.chat.completions.create(model = "gpt-4o", messages = messages)
        print(openai_api_key, model.generate(x))
        """)
    assert_unchanged(WarnRemoteGeneration, "client = OpenAI()\n", tags={"rank0"})
