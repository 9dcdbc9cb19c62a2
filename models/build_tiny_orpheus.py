"""Write models/tiny-orpheus/: models/tiny-chat's tokenizer and Llama shape with Orpheus's vocabulary size.

Orpheus (unsloth/orpheus-3b-0.1-ft) is a Llama 3 whose vocabulary goes on past the text tokens: its notebook writes
the ids of its speech markers (128257..128265) and of SNAC's audio codes (128266 + k * 4096 + code, k < 7) into the
rows itself, and generates them, so the stand-in's embeddings must reach 128266 + 7 * 4096. The tokenizer stays
tiny-chat's (the notebook encodes only text with it); its embeddings are tied to keep the weights small.

No weights are written: `nbddp.examples.tiny_model.ensure_weights("models/tiny-orpheus")` builds them from
config.json (seeded), as for models/tiny-chat. Same inputs, same bytes:

    python models/build_tiny_orpheus.py                     # rewrite models/tiny-orpheus/
    python models/build_tiny_orpheus.py --out /tmp/tiny     # e.g. to compare with the committed files
"""
import argparse
import json
import shutil
from pathlib import Path

MODELS = Path(__file__).resolve().parent
SOURCE, OUT = MODELS / "tiny-chat", MODELS / "tiny-orpheus"
AUDIO_CODES_START, CODEBOOKS, CODEBOOK_SIZE = 128266, 7, 4096  # the notebook's offsets: 128266 + k * 4096
VOCAB_SIZE = AUDIO_CODES_START + CODEBOOKS * CODEBOOK_SIZE


def build(source: Path, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    config = json.loads((source / "config.json").read_text(encoding="utf-8"))
    config.update(vocab_size=VOCAB_SIZE, tie_word_embeddings=True)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    for name in ("special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(source / name, out_dir / name)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help="folder to write (default: %(default)s)")
    build(SOURCE, parser.parse_args().out)


if __name__ == "__main__":
    main()
