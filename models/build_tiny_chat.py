"""Write models/tiny-chat/: a small Llama config and a byte-level BPE tokenizer that has the chat templates' tokens.

A stand-in for an instruct model in tests and notebook sweeps: any text encodes (bytes, plus merges learnt from
data/tiny_instructions.jsonl), and the special tokens of the chat families in Unsloth's table (Llama 3's
<|start_header_id|>, ChatML's <|im_start|>, Gemma's <start_of_turn>, Phi's <|end|>, Mistral's [INST], ...) are
single tokens. Their strings come from nbddp/fallback/unsloth_chat_templates.json, not typed here: every token a
template writes that has a "|" at an edge (<|im_start|>, <|turn>, <turn|>) or is [INST]/[/INST], and every stop word
and renamed token of the table. The tokenizer's own chat template is the table's chatml.

No weights are written: `nbddp.examples.tiny_model.ensure_weights("models/tiny-chat")` builds them from
config.json (seeded), as for models/tiny-llama, whose model shape this reuses. Same inputs, same bytes:

    python models/build_tiny_chat.py                     # rewrite models/tiny-chat/
    python models/build_tiny_chat.py --out /tmp/tiny     # e.g. to compare with the committed files
"""
import argparse
import importlib.util
import json
import re
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "data" / "tiny_instructions.jsonl"
TEMPLATES = REPO / "nbddp" / "fallback" / "unsloth_chat_templates.json"
OUT = REPO / "models" / "tiny-chat"

UNK, PAD, BOS, EOS = "<unk>", "<pad>", "<s>", "</s>"  # ids 0..3, as in tiny-llama
VOCAB_SIZE = 512  # 256 bytes, the special tokens, and merges for the rest
MAX_LENGTH = 2048
TEMPLATE_TOKEN = re.compile(r"<\|[^<>|\s]+\|?>|<[^<>|\s]+\|>|\[/?INST\]")
ROLE_WORDS = ("system", "user", "assistant", "model", "human", "gpt", "tool")


def load_sibling(name):
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def chat_tokens(table) -> list[str]:
    """The table's token strings, sorted."""
    texts = [*table["templates"].values(), table["gemma4_empty_thought"]["template"]]
    tokens = {token for text in texts for token in TEMPLATE_TOKEN.findall(text)}
    for entry in table["chat_templates"].values():
        if entry["stop_word"] != "eos_token":
            tokens.add(entry["stop_word"])
        tokens.update(*(entry["token_mapping"] or {}).items())
    return sorted(tokens - {UNK, PAD, BOS, EOS})


def corpus(data_path):
    """The text for the merges: every text field of the data rows, and the role names as often as rows."""
    with open(data_path, encoding="utf-8") as lines:
        for line in lines:
            yield from json.loads(line).values()
            yield from ROLE_WORDS  # each on its own, as a template writes it after a turn token


def build_tokenizer(special_tokens, data_path):
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=special_tokens, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(data_path), trainer=trainer)
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in special_tokens])
    bos_id = tokenizer.token_to_id(BOS)
    # Like Llama's tokenizer: a BOS in front of every sequence.
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return tokenizer


def tokenizer_config(added_tokens_decoder, chat_template):
    return {
        "added_tokens_decoder": added_tokens_decoder,
        "bos_token": BOS,
        "chat_template": chat_template,
        "clean_up_tokenization_spaces": False,
        "eos_token": EOS,
        "model_input_names": ["input_ids", "attention_mask"],  # as Llama's: no token_type_ids (4.x returns them)
        "model_max_length": MAX_LENGTH,
        "pad_token": PAD,
        "padding_side": "right",
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": UNK,
    }


def build(data_path, templates_path, out_dir):
    tiny_llama = load_sibling("build_tiny_llama")
    table = json.loads(templates_path.read_text(encoding="utf-8"))
    special_tokens = [UNK, PAD, BOS, EOS, *chat_tokens(table)]
    tokenizer = build_tokenizer(special_tokens, data_path)
    vocab = tokenizer.get_vocab()
    assert len(vocab) <= VOCAB_SIZE, f"{len(vocab)} tokens, more than {VOCAB_SIZE}"
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {
        "tokenizer.json": tokenizer.to_str(pretty=True) + "\n",
        "tokenizer_config.json": tiny_llama.dump_json(
            tokenizer_config(tiny_llama.added_tokens_decoder({token: vocab[token] for token in special_tokens}),
                             table["templates"]["chatml"])),
        "special_tokens_map.json": tiny_llama.dump_json(
            {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD, "unk_token": UNK}),
        "config.json": tiny_llama.dump_json({**tiny_llama.model_config(vocab), "max_position_embeddings": MAX_LENGTH}),
    }
    for name, text in files.items():
        tiny_llama.write_atomically(out_dir / name, text)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA, help=f"text for the merges (default {DATA.relative_to(REPO)})")
    parser.add_argument("--templates", type=Path, default=TEMPLATES,
                        help=f"Unsloth's chat templates (default {TEMPLATES.relative_to(REPO)})")
    parser.add_argument("--out", type=Path, default=OUT, help=f"output folder (default {OUT.relative_to(REPO)})")
    args = parser.parse_args()
    build(args.data, args.templates, args.out)


if __name__ == "__main__":
    main()
