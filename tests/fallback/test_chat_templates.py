"""`unsloth.chat_templates` on the hf backend (nbddp/fallback/chat_templates.py, chat_markers.py)."""
import json
import sys
from pathlib import Path

import jinja2.ext
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment
from trl import SFTConfig, SFTTrainer

from nbddp.errors import DataError, UsageError
from nbddp.runtime import backend as backends
from nbddp.fallback.chat_markers import Marker, TurnEnds, template_markers
from nbddp.fallback.chat_templates import IGNORE_INDEX, response_labels

X = IGNORE_INDEX
USER, ASSISTANT = Marker((7, 8)), Marker((9,))  # marker token ids
NO_ENDS = TurnEnds(eos_id=None, bos_id=None)
TINY_CHAT = Path(__file__).resolve().parents[2] / "models" / "tiny-chat"
TABLE = json.loads((Path(__file__).resolve().parents[2]
                    / "nbddp/fallback/unsloth_chat_templates.json").read_text())
SHAREGPT = {"role": "from", "content": "value", "user": "human", "assistant": "gpt"}
CHAT = [{"role": "user", "content": "Copy the words."}, {"role": "assistant", "content": "cat dog"},
        {"role": "user", "content": "Give the first word."}, {"role": "assistant", "content": "cat"}]


def test_labels_run_from_each_response_to_the_next_instruction():
    ids = [1, 7, 8, 3, 4, 9, 5, 6, 7, 8, 3, 9, 5, 2]
    assert response_labels(ids, ids, USER, ASSISTANT, NO_ENDS) == [X, X, X, X, X, X, 5, 6, X, X, X, X, 5, 2]


def test_last_response_only():
    ids = [7, 8, 3, 9, 5, 6, 7, 8, 3, 9, 5, 2]
    assert response_labels(ids, ids, USER, ASSISTANT, NO_ENDS, last_response_only=True) == [X] * 10 + [5, 2]


def test_labels_already_masked_stay_masked():
    ids = [7, 8, 3, 9, 5, 6]
    assert response_labels(ids, [X, X, X, X, X, 6], USER, ASSISTANT, NO_ENDS) == [X, X, X, X, X, 6]


def test_a_row_without_a_response_is_all_masked():
    ids = [7, 8, 3, 4, 5]
    assert response_labels(ids, ids, USER, ASSISTANT, NO_ENDS) == [X] * 5


def test_an_answer_ends_at_its_eos_which_is_trained_on():
    ids = [7, 8, 3, 9, 5, 2, 6, 6, 7, 8, 3, 9, 5]
    assert response_labels(ids, ids, USER, ASSISTANT, TurnEnds(eos_id=2, bos_id=None)) == [X] * 4 + [5, 2] + [X] * 6 + [5]


def test_an_answer_ends_where_another_turn_opens():
    """A tool or system turn between answers is not trained on: it starts with the opener all markers share (7)."""
    ids = [7, 8, 3, 7, 9, 5, 7, 4, 6, 7, 9, 5]
    user, assistant = Marker((7, 8)), Marker((7, 9))
    ends = TurnEnds(eos_id=None, bos_id=None, opener=(7,))
    assert response_labels(ids, ids, user, assistant, ends) == [X] * 5 + [5] + [X] * 5 + [5]
    assert response_labels(ids, ids, user, assistant, NO_ENDS) == [X] * 5 + [5, 7, 4, 6] + [X, X] + [5]


def test_a_markers_optional_ids_go_with_it():
    """With optional ids after the response marker (a newline that may merge), the answer starts after them."""
    ids = [7, 8, 3, 9, 4, 5, 6]
    assert response_labels(ids, ids, USER, Marker((9,), right=(4,)), NO_ENDS) == [X] * 5 + [5, 6]
    assert response_labels(ids, ids, USER, Marker((9,), right=(1,)), NO_ENDS) == [X] * 4 + [4, 5, 6]


@pytest.fixture
def hf_backend_active(monkeypatch, backend_patches_undone_after):
    monkeypatch.delitem(sys.modules, "unsloth", raising=False)
    monkeypatch.delitem(sys.modules, "unsloth.chat_templates", raising=False)
    backends.activate("hf")


@pytest.fixture
def trainer(hf_backend_active, tiny_model_path, tmp_path):
    """An SFTTrainer on the tiny Llama; rows read "ran far <question> sat on <answer>", the tiny vocabulary's chat."""
    from datasets import Dataset
    from unsloth import FastLanguageModel

    model, tokenizer = FastLanguageModel.from_pretrained(tiny_model_path, max_seq_length=64, load_in_4bit=False)
    model = FastLanguageModel.get_peft_model(model, r=4, lora_alpha=8)
    rows = [
        "ran far the cat sat on the mat",
        "ran far a cat sat on away ran far a dog sat on the dog",  # two turns
        "ran far the dog",  # no answer to train on
    ]
    return SFTTrainer(
        model=model,
        processing_class=tokenizer,
        train_dataset=Dataset.from_dict({"text": rows * 2}),
        eval_dataset={"held_out": Dataset.from_dict({"text": rows[:1]})},
        args=SFTConfig(output_dir=str(tmp_path / "outputs"), max_steps=1, per_device_train_batch_size=2, bf16=False, report_to="none"),
    )


def answer_labels(row):
    return [label for label in row["labels"] if label != IGNORE_INDEX]


def test_trains_on_the_answers_only(trainer, capsys):
    from unsloth.chat_templates import train_on_responses_only  # as the notebooks import it

    tokenizer = trainer.processing_class
    words = tokenizer.convert_ids_to_tokens
    assert train_on_responses_only(trainer, instruction_part="ran far", response_part="sat on") is trainer
    assert "dropped 2 of 6 rows of train_dataset" in capsys.readouterr().out
    assert words(answer_labels(trainer.train_dataset[0])) == ["the", "mat", "</s>"]
    assert words(answer_labels(trainer.train_dataset[1])) == ["away", "the", "dog", "</s>"]
    assert words(answer_labels(trainer.eval_dataset["held_out"][0])) == ["the", "mat", "</s>"]
    batch = next(iter(trainer.get_train_dataloader()))
    trained_tokens = (batch["labels"] != IGNORE_INDEX).sum(dim=1)
    assert (trained_tokens > 0).all() and (trained_tokens < batch["attention_mask"].sum(dim=1)).all()  # the collator kept them
    trainer.train()
    assert trainer.state.global_step == 1


def test_markers_that_never_occur_are_an_error(trainer):
    from unsloth.chat_templates import train_on_responses_only

    with pytest.raises(UsageError, match="no row of train_dataset contains response_part 'mat far'"):
        train_on_responses_only(trainer, instruction_part="ran far", response_part="mat far")


def test_both_markers_or_neither(trainer):
    from unsloth.chat_templates import train_on_responses_only

    with pytest.raises(UsageError, match="give both instruction_part and response_part, or neither"):
        train_on_responses_only(trainer, response_part="sat on")


def test_no_markers_and_no_chat_template_is_an_error(trainer):
    from unsloth.chat_templates import train_on_responses_only

    with pytest.raises(UsageError, match="no chat_template to read the markers from; pass instruction_part"):
        train_on_responses_only(trainer)


def test_return_function_gives_the_batch_function(trainer):
    from unsloth.chat_templates import train_on_responses_only

    add_labels = train_on_responses_only(trainer, instruction_part="ran far", response_part="sat on", return_function=True)
    tokenizer = trainer.processing_class
    ids = tokenizer("ran far the cat sat on the mat", add_special_tokens=False)["input_ids"]
    (labels,) = add_labels({"input_ids": [ids]})["labels"]
    assert tokenizer.convert_ids_to_tokens([label for label in labels if label != IGNORE_INDEX]) == ["the", "mat"]


def test_unsloths_other_chat_template_helpers_are_bad_input_that_says_what_to_do(hf_backend_active):
    with pytest.raises(UsageError, match="unsloth.chat_templates.test_chat_templates is Unsloth's test .*Leave the call"):
        from unsloth.chat_templates import test_chat_templates  # noqa: F401
    with pytest.raises(ImportError, match="cannot import name 'no_such_helper'"):
        from unsloth.chat_templates import no_such_helper  # noqa: F401


# get_chat_template, on the tiny chat model's tokenizer (models/tiny-chat: every template token is one token)


@pytest.fixture
def chat_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TINY_CHAT))


def jinja_render(template, messages, tokenizer, add_generation_prompt=False):
    """`template` rendered by jinja as Transformers configures it, without Transformers."""
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    environment.globals["raise_exception"] = raise_exception
    return environment.from_string(template).render(
        messages=messages, add_generation_prompt=add_generation_prompt,
        bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token)


def table_template(name):
    entry = TABLE["chat_templates"][name]
    return TABLE["templates"][entry["template"]].replace("{system_message}", entry["default_system_message"] or "")


@pytest.mark.parametrize("name", ["llama-3.1", "llama-3", "qwen-2.5", "qwen3-instruct", "gemma-3", "gemma-4", "phi-3",
                                  "phi-4", "mistral", "zephyr", "alpaca", "unsloth"])
def test_a_named_template_renders_as_unsloths_text(hf_backend_active, chat_tokenizer, name):
    from unsloth.chat_templates import get_chat_template

    tokenizer = get_chat_template(chat_tokenizer, chat_template=name)
    assert tokenizer is chat_tokenizer and tokenizer.eos_token == "</s>"  # no renaming for these templates
    for generation in (False, True):
        messages = CHAT[:3] if generation else CHAT
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)
        assert text == jinja_render(table_template(name), messages, tokenizer, generation)
        assert "Give the first word." in text


def test_mapping_reads_sharegpt_turns(hf_backend_active, chat_tokenizer):
    from unsloth.chat_templates import get_chat_template

    tokenizer = get_chat_template(chat_tokenizer, chat_template="llama-3", mapping=SHAREGPT)
    sharegpt = [{"from": {"user": "human", "assistant": "gpt"}[turn["role"]], "value": turn["content"]} for turn in CHAT]
    assert tokenizer.apply_chat_template(sharegpt, tokenize=False) == jinja_render(table_template("llama-3"), CHAT, tokenizer)
    assert tokenizer.apply_chat_template(CHAT, tokenize=False) == jinja_render(table_template("llama-3"), CHAT, tokenizer)


def test_system_message_replaces_the_default(hf_backend_active, chat_tokenizer):
    from unsloth.chat_templates import get_chat_template

    tokenizer = get_chat_template(chat_tokenizer, chat_template="qwen-2.5", system_message="Say 'yes'.")
    text = tokenizer.apply_chat_template(CHAT[:2], tokenize=False)
    assert text.startswith("<|im_start|>system\nSay 'yes'.<|im_end|>\n<|im_start|>user\nCopy the words.")
    default = get_chat_template(chat_tokenizer, chat_template="qwen-2.5").apply_chat_template(CHAT[:2], tokenize=False)
    assert "You are Qwen, created by Alibaba Cloud." in default


def test_a_template_of_ones_own(hf_backend_active, chat_tokenizer):
    from unsloth.chat_templates import get_chat_template

    template = "{{ bos_token }}{{ '{system_message}' }}{% for m in messages %}{{ m['content'] + eos_token }}{% endfor %}"
    with pytest.raises(UsageError, match="has a {system_message} placeholder and no default system message"):
        get_chat_template(chat_tokenizer, chat_template=(template, "eos_token"))
    tokenizer = get_chat_template(chat_tokenizer, chat_template=(template, "eos_token"), system_message="S:")
    assert tokenizer.apply_chat_template(CHAT[:2], tokenize=False) == "<s>S:Copy the words.</s>cat dog</s>"


def test_an_unknown_template_name_lists_the_known_ones(hf_backend_active, chat_tokenizer):
    from unsloth.chat_templates import get_chat_template

    with pytest.raises(UsageError, match=r"'llama-9' is not one of Unsloth 2026.10.9's templates \(unsloth, zephyr, chatml,"):
        get_chat_template(chat_tokenizer, chat_template="llama-9")


def test_chatml_maps_the_eos_token_to_its_stop_word(hf_backend_active, chat_tokenizer):
    """The tiny tokenizer has both </s> and <|im_end|>, so they swap names: <|im_end|> gets EOS's id (trained)."""
    from unsloth.chat_templates import get_chat_template

    eos_id, im_end_id = chat_tokenizer.eos_token_id, chat_tokenizer.convert_tokens_to_ids("<|im_end|>")
    chat_tokenizer.model_max_length = 77
    tokenizer = get_chat_template(chat_tokenizer, chat_template="chatml", mapping=SHAREGPT, map_eos_token=True)
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", eos_id)
    assert tokenizer.convert_tokens_to_ids("</s>") == im_end_id
    assert tokenizer("a<|im_end|>", add_special_tokens=False)["input_ids"][-1] == eos_id
    assert (tokenizer.pad_token, tokenizer.model_max_length, tokenizer.padding_side) == ("<pad>", 77, "right")  # kept


def test_a_pad_token_that_was_eos_follows_it(hf_backend_active, chat_tokenizer):
    from unsloth.chat_templates import get_chat_template

    chat_tokenizer.pad_token = chat_tokenizer.eos_token  # as the fallback's from_pretrained sets a missing one
    eos_id = chat_tokenizer.eos_token_id
    tokenizer = get_chat_template(chat_tokenizer, chat_template="chatml")
    assert (tokenizer.pad_token, tokenizer.pad_token_id) == ("<|im_end|>", eos_id)


def test_map_eos_token_false_keeps_the_vocabulary(hf_backend_active, chat_tokenizer):
    from unsloth.chat_templates import get_chat_template

    vocab = chat_tokenizer.get_vocab()
    tokenizer = get_chat_template(chat_tokenizer, chat_template="chatml", map_eos_token=False)
    assert tokenizer.eos_token == "</s>" and tokenizer.get_vocab() == vocab


def test_gemma4_gets_the_empty_thought_variant_where_the_model_primes_one(hf_backend_active, chat_tokenizer):
    """Gemma-4 26B-A4B and 31B: their own template opens an empty thought channel, so Unsloth picks its variant."""
    from unsloth.chat_templates import get_chat_template

    assert get_chat_template(chat_tokenizer, "gemma-4").chat_template == TABLE["templates"]["gemma-4"]
    chat_tokenizer.chat_template = "{{ '<|turn>model\\n<|channel>thought\\n<channel|>' }}"
    assert get_chat_template(chat_tokenizer, "gemma-4").chat_template == TABLE["gemma4_empty_thought"]["template"]


def test_a_processor_gets_the_template_too(hf_backend_active, chat_tokenizer):
    """Vision notebooks pass the processor (get_chat_template(processor, "gemma-3")); it renders their messages."""
    from transformers import CLIPImageProcessor, LlavaProcessor
    from unsloth import get_chat_template  # as the vision notebooks import it

    processor = LlavaProcessor(image_processor=CLIPImageProcessor(), tokenizer=chat_tokenizer, patch_size=14,
                               image_token="<|image|>")
    assert get_chat_template(processor, "gemma-3") is processor
    messages = [{"role": "user", "content": [{"type": "text", "text": "Copy the words."}]}]
    assert processor.apply_chat_template(messages, tokenize=False) == "<s><start_of_turn>user\nCopy the words.<end_of_turn>\n"
    assert processor.tokenizer.chat_template == processor.chat_template


def gemma_tokenizer(words=("<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", "user", "hi")):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GemmaTokenizerFast  # GemmaTokenizer on transformers 5

    backend = Tokenizer(models.WordLevel({word: i for i, word in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return GemmaTokenizerFast(tokenizer_object=backend, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                              unk_token="<unk>")


def test_chatml_on_a_gemma_tokenizer_renames_gemmas_turn_tokens(hf_backend_active):
    from unsloth.chat_templates import get_chat_template

    tokenizer = get_chat_template(gemma_tokenizer(), chat_template="chatml")
    assert tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"]) == [4, 1]
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 1)
    assert tokenizer.apply_chat_template(CHAT[:1], tokenize=False) == "<bos><|im_start|>user\nCopy the words.<|im_end|>\n"


def test_a_renamed_token_the_tokenizer_lacks_is_an_error(hf_backend_active):
    from unsloth.chat_templates import get_chat_template

    with pytest.raises(UsageError, match="renames the token <start_of_turn> to <|im_start|>, but <start_of_turn> is not"):
        get_chat_template(gemma_tokenizer(("<pad>", "<eos>", "<bos>", "<unk>")), chat_template="chatml")


# train_on_responses_only without markers: Unsloth reads them off the chat template


@pytest.mark.parametrize(("name", "instruction", "response"), [
    ("llama-3.1", "<|start_header_id|>user<|end_header_id|>\n\n", "<|start_header_id|>assistant<|end_header_id|>\n\n"),
    ("llama-3", "<|start_header_id|>user<|end_header_id|>\n\n", "<|start_header_id|>assistant<|end_header_id|>\n\n"),
    ("chatml", "<|im_start|>user\n", "<|im_start|>assistant\n"),
    ("qwen-2.5", "<|im_start|>user\n", "<|im_start|>assistant\n"),
    ("qwen3-instruct", "<|im_start|>user\n", "<|im_start|>assistant\n"),
    ("gemma-3", "<start_of_turn>user\n", "<start_of_turn>model\n"),
    ("gemma-4", "<|turn>user\n", "<|turn>model\n"),
    ("phi-3", "<|user|>\n", "<|assistant|>\n"),
    ("phi-4", "<|im_start|>user<|im_sep|>", "<|im_start|>assistant<|im_sep|>"),
    ("mistral", "[INST]", "[/INST]"),
])
def test_markers_are_read_from_the_chat_template(hf_backend_active, chat_tokenizer, name, instruction, response):
    from unsloth.chat_templates import get_chat_template

    assert template_markers(get_chat_template(chat_tokenizer, chat_template=name)) == (instruction, response)


@pytest.fixture
def chat_trainer(hf_backend_active, model_cache, tmp_path):
    """A function: an SFTTrainer on the tiny chat model whose rows are CHAT in `template` (and one without answer)."""
    from datasets import Dataset
    from unsloth import FastLanguageModel

    from nbddp.examples.tiny_model import ensure_weights

    def build(template):
        model, tokenizer = FastLanguageModel.from_pretrained(ensure_weights(str(TINY_CHAT)), max_seq_length=256,
                                                             load_in_4bit=False)
        model = FastLanguageModel.get_peft_model(model, r=4, lora_alpha=8)
        from unsloth.chat_templates import get_chat_template

        tokenizer = get_chat_template(tokenizer, chat_template=template)
        texts = [tokenizer.apply_chat_template(messages, tokenize=False) for messages in (CHAT, CHAT[:1])]
        return SFTTrainer(
            model=model, processing_class=tokenizer, train_dataset=Dataset.from_dict({"text": texts}),
            args=SFTConfig(output_dir=str(tmp_path / "outputs"), max_steps=1, per_device_train_batch_size=1, bf16=False,
                           report_to="none"),
        )
    return build


@pytest.mark.parametrize(("template", "answers"), [
    ("llama-3.1", ["cat dog<|eot_id|>", "cat<|eot_id|></s>"]),
    ("qwen-2.5", ["cat dog<|im_end|>\n", "cat<|im_end|>\n</s>"]),
    ("gemma-3", ["cat dog<end_of_turn>\n", "cat<end_of_turn>\n</s>"]),
])
def test_trains_on_the_answers_its_template_marks(chat_trainer, capsys, template, answers):
    from unsloth.chat_templates import train_on_responses_only

    trainer = train_on_responses_only(chat_trainer(template))
    out = capsys.readouterr().out
    assert "train_on_responses_only: instruction_part=" in out and "(read from the chat template)" in out
    assert "dropped 1 of 2 rows of train_dataset" in out  # the row with no answer
    (row,) = trainer.train_dataset
    tokenizer = trainer.processing_class
    spans, span = [], []
    for label in row["labels"] + [IGNORE_INDEX]:
        if label != IGNORE_INDEX:
            span.append(label)
        elif span:
            spans.append(tokenizer.decode(span))
            span = []
    assert spans == answers
    trainer.train()
    assert trainer.state.global_step == 1


def test_force_match_false_finds_a_marker_written_with_other_newlines(chat_trainer):
    from unsloth.chat_templates import train_on_responses_only

    markers = {"instruction_part": "\n\n<|im_start|>user\n", "response_part": "\n\n<|im_start|>assistant\n"}
    with pytest.raises(UsageError, match="no row of train_dataset contains response_part"):
        train_on_responses_only(chat_trainer("chatml"), **markers)
    trainer = train_on_responses_only(chat_trainer("chatml"), force_match=False, **markers)
    (row,) = trainer.train_dataset
    assert trainer.processing_class.decode([label for label in row["labels"] if label != IGNORE_INDEX]) \
        == "cat dog<|im_end|>cat<|im_end|>"


# standardize_sharegpt / standardize_data_formats


def sharegpt_rows():
    return [
        {"conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "Hi"},
                           {"from": "gpt", "value": "Hello"}], "id": 1},
        {"conversations": [{"from": "Human ", "value": "Name a cat"}, {"from": "GPT", "value": "Tom"}], "id": 2},
    ]


def test_standardize_sharegpt_gives_role_and_content(hf_backend_active):
    from datasets import Dataset
    from unsloth.chat_templates import standardize_data_formats, standardize_sharegpt

    assert standardize_sharegpt is standardize_data_formats
    dataset = standardize_sharegpt(Dataset.from_list(sharegpt_rows()))
    assert dataset.to_list() == [
        {"conversations": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                           {"role": "assistant", "content": "Hello"}], "id": 1},
        {"conversations": [{"role": "user", "content": "Name a cat"}, {"role": "assistant", "content": "Tom"}], "id": 2},
    ]


def test_role_and_content_keys_of_any_name(hf_backend_active):
    """The role key is the one whose values are all aliases, whatever it is called (here "speaker")."""
    from datasets import Dataset
    from unsloth.chat_templates import standardize_sharegpt

    rows = [{"conversations": [{"text": "Hi", "speaker": "user"}, {"text": "Hello", "speaker": "assistant"}]}]
    assert standardize_sharegpt(Dataset.from_list(rows))[0]["conversations"] == [
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]


def test_a_dataset_without_conversations_comes_back_as_it_is(hf_backend_active):
    from datasets import Dataset
    from unsloth.chat_templates import standardize_data_formats

    dataset = Dataset.from_list([{"text": "a"}])
    assert standardize_data_formats(dataset) is dataset


def test_aliases_of_ones_own(hf_backend_active):
    from datasets import Dataset
    from unsloth.chat_templates import standardize_sharegpt

    rows = [{"conversations": [{"from": "asker", "value": "Hi"}, {"from": "bot", "value": "Hello"},
                               {"from": "asker", "value": "Name a cat"}, {"from": "bot", "value": "Tom"}]}]
    with pytest.raises(DataError, match="the role 'asker' is in no alias list; pass it in aliases_for_user="):
        standardize_sharegpt(Dataset.from_list(rows))
    dataset = standardize_sharegpt(Dataset.from_list(rows), aliases_for_user=["asker"], aliases_for_assistant=["bot"])
    assert [turn["role"] for turn in dataset[0]["conversations"]] == ["user", "assistant"] * 2
    with pytest.raises(UsageError, match="the alias 'bot' would mean both user and assistant"):
        standardize_sharegpt(Dataset.from_list(rows), aliases_for_user=["asker", "Bot"], aliases_for_assistant=["bot"])


def test_turns_that_are_not_two_texts_are_data_errors(hf_backend_active):
    from datasets import Dataset
    from unsloth.chat_templates import standardize_sharegpt

    with pytest.raises(DataError, match="a turn's 'weight' is int, not text"):
        standardize_sharegpt(Dataset.from_list([{"conversations": [{"from": "human", "value": "Hi", "weight": 1}]}]))
    with pytest.raises(DataError, match=r"the turns have the keys \['from', 'lang', 'value'\]; each turn needs exactly two"):
        standardize_sharegpt(Dataset.from_list([{"conversations": [{"from": "human", "value": "Hi", "lang": "en"}]}]))
