"""Write models/tiny-csm/: a tiny Sesame CSM (text-to-speech) config with its processor, for unsloth/csm-1b.

A CSM is a Llama backbone over text and audio frames, a depth decoder for the codebooks of each frame, and a Mimi
codec that turns the waveform into those codebooks. The stand-in keeps their kinds and Mimi's convolutions (its
upsampling ratios 8, 6, 5, 4, so a 24 kHz waveform gives 12.5 frames a second, which CsmProcessor's default
`encoded_length_kwargs` count on), with 4 codebooks of 2048 codes instead of 32 and widths of 4 to 64. The
tokenizer is models/tiny-chat's plus CSM's `<|AUDIO|>` and `<|audio_eos|>`; the chat template is the render loop
of sesame/csm-1b's (`<s>[speaker]text</s><|AUDIO|><|audio_eos|>`), and the feature extractor Encodec's at 24 kHz.

No weights are written: `nbddp.examples.tiny_model.ensure_weights("models/tiny-csm")` builds them from
config.json (seeded). Built with Transformers 4.56 (the CSM notebook's stack); 5.x loads the files too:

    python models/build_tiny_csm.py                     # rewrite models/tiny-csm/
    python models/build_tiny_csm.py --out /tmp/tiny     # e.g. to compare with the committed files
"""
import argparse
import json
from pathlib import Path

MODELS = Path(__file__).resolve().parent
SOURCE, OUT = MODELS / "tiny-chat", MODELS / "tiny-csm"
AUDIO, AUDIO_EOS = "<|AUDIO|>", "<|audio_eos|>"
CHAT_TEMPLATE = ("{%- for message in messages %}{{- bos_token }}{{- '[' + message['role'] + ']' }}"
                 "{{- message['content'][0]['text'] }}{{- eos_token }}"
                 "{%- if message['content']|length > 1 %}{{- '<|AUDIO|><|audio_eos|>' }}{%- endif %}{%- endfor %}")
CODEBOOKS, CODEBOOK_SIZE = 4, 2048  # the model's vocabulary per codebook: 2048 codes, then eos 0's pad 2050
CODEC = {"hidden_size": 32, "num_filters": 4, "codebook_size": CODEBOOK_SIZE, "codebook_dim": 16,
         "num_quantizers": CODEBOOKS, "vector_quantization_hidden_dimension": 16, "upsample_groups": 32,
         "num_hidden_layers": 1, "intermediate_size": 64, "num_attention_heads": 2, "num_key_value_heads": 2,
         "head_dim": 16}
SHAPE = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 16}


def build(out_dir: Path) -> None:
    from transformers import AutoTokenizer, CsmConfig, CsmProcessor, EncodecFeatureExtractor, MimiConfig

    tokenizer = AutoTokenizer.from_pretrained(SOURCE)
    tokenizer.add_special_tokens({"additional_special_tokens": [AUDIO, AUDIO_EOS]})
    audio, audio_eos = tokenizer.convert_tokens_to_ids([AUDIO, AUDIO_EOS])
    processor = CsmProcessor(feature_extractor=EncodecFeatureExtractor(feature_size=1, sampling_rate=24000),
                             tokenizer=tokenizer, chat_template=CHAT_TEMPLATE)
    config = CsmConfig(num_codebooks=CODEBOOKS, vocab_size=CODEBOOK_SIZE + 3, text_vocab_size=len(tokenizer),
                       num_hidden_layers=2, **SHAPE, max_position_embeddings=2048, pad_token_id=tokenizer.pad_token_id,
                       bos_token_id=tokenizer.bos_token_id, eos_token_id=None, audio_token_id=audio,
                       audio_eos_token_id=audio_eos, codebook_pad_token_id=CODEBOOK_SIZE + 2, codebook_eos_token_id=0,
                       depth_decoder_config={"num_codebooks": CODEBOOKS, "backbone_hidden_size": SHAPE["hidden_size"],
                                             "vocab_size": CODEBOOK_SIZE + 3, "num_hidden_layers": 1, **SHAPE},
                       codec_config=MimiConfig(**CODEC).to_dict(), architectures=["CsmForConditionalGeneration"])
    out_dir.mkdir(parents=True, exist_ok=True)
    processor.save_pretrained(out_dir)
    config.save_pretrained(out_dir)
    # A random backbone and depth decoder also pick the ids after the 2048 codes (2048, 2049 and the pad 2050),
    # which the trained model never writes and Mimi's codebooks cannot decode: generation leaves them out.
    not_codes = list(range(CODEBOOK_SIZE, CODEBOOK_SIZE + 3))
    generation = {"bos_token_id": tokenizer.bos_token_id, "pad_token_id": tokenizer.pad_token_id,
                  "suppress_tokens": not_codes, "depth_decoder_suppress_tokens": not_codes}
    (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n", encoding="utf-8")
    for name in ("config.json", "preprocessor_config.json", "tokenizer_config.json"):  # without the version line
        path = out_dir / name
        data = json.loads(path.read_text(encoding="utf-8"))
        data.pop("transformers_version", None)
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help="folder to write (default: %(default)s)")
    build(parser.parse_args().out)


if __name__ == "__main__":
    main()
