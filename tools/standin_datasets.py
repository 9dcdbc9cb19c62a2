"""Small local copies of the datasets Unsloth's notebooks load from the hub, in each one's column layout.

    build(Path("work/datasets"), "openai/gsm8k")  # -> work/datasets/openai/gsm8k, or None without a layout

A stand-in is a folder named like the hub id holding one parquet file per config and split, plus a README.md whose
`configs:` block maps them, so `load_dataset("openai/gsm8k", "main", split="train")` run from the folder above
reads it before the hub. Rows are made by code, deterministically, short (a byte-level tokenizer makes a byte one
token) and in the layout the notebooks read: the column names, nesting and value formats they parse (gsm8k's
`#### N`, numeric `expected_answer`s, `{"from", "value"}` turns). Images are real PNGs and audio real WAVs, typed
with datasets' `Image` and `Audio` features. Row counts cover the highest row a notebook indexes
(`dataset[1523]`, `select(range(10000))`, `train_test_split(test_size=50)` then `[100]`).

Two things the audio notebooks load by a hub id get a folder the same way, though no dataset (`Layout.folder`):
evaluate's "wer" metric (`evaluate.load("wer")` reads `wer/wer.py` from the folder it runs in; needs evaluate and
jiwer) and SNAC's codec (`SNAC.from_pretrained` reads a folder's config.json and pytorch_model.bin; needs snac).
"""
import dataclasses
import io
import json
import math
import random
import shutil
import struct
import wave
from collections.abc import Callable
from pathlib import Path

ROWS = 200
WORDS = ("the model reads a short line of text and writes a short answer about cats dogs rain sun trees numbers "
         "rivers maps songs boats stars bread tea").split()
KOREAN = "위키 백과 기사 제목 내용 한국어 문장 번역 학습 데이터".split()


@dataclasses.dataclass(frozen=True)
class Layout:
    row: Callable[[random.Random, int], dict]  # row i, from a generator seeded by the dataset id and i
    rows: int = ROWS
    config: str = "default"
    splits: tuple[str, ...] = ("train",)
    audio: tuple[str, ...] = ()  # columns holding {"array": [...], "sampling_rate": N} to store as WAV
    # columns holding {"frames": uint8 tensor (T, 3, H, W), "fps": N}, stored as MP4 files in the folder's clips/
    # (encoded by torchcodec; without it the id gets no stand-in) and typed as datasets' Video by their paths
    video: tuple[str, ...] = ()
    # writes the whole folder instead of rows: a thing an audio notebook loads from the hub by an id that is no
    # dataset (evaluate's "wer" metric, a SNAC codec); its ImportError (a package missing) leaves the id without one
    folder: Callable[[Path], None] | None = None


def build(root: Path, dataset_id: str) -> Path | None:
    """Write the stand-in for `dataset_id` under `root` (replacing an older one) and return its folder (None: no
    layout, or its `folder` builder lacks a package)."""
    layout = LAYOUTS.get(dataset_id)
    if layout is None:
        return None
    from datasets import Audio, Dataset, Features, Video

    folder = root / dataset_id
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    if layout.folder is not None:
        try:
            layout.folder(folder)
        except ImportError:  # the package its builder needs is missing: the notebook's own import of it says so
            shutil.rmtree(folder)
            return None
        return folder
    entries = []
    for split in layout.splits:
        rows = [layout.row(random.Random(f"{dataset_id}:{split}:{i}"), i) for i in range(layout.rows)]
        for column in layout.audio:
            for row in rows:
                row[column] = {"bytes": _wav(**row[column]), "path": None}
        for column in layout.video:
            for i, row in enumerate(rows):
                try:
                    row[column] = str(_mp4(folder / "clips" / f"{split}-{column}-{i}.mp4", **row[column]))
                except ImportError:  # torchcodec (or its FFmpeg) is missing: the notebook's own import says so
                    shutil.rmtree(folder)
                    return None
        dataset = Dataset.from_list(rows)  # PIL images become datasets' Image feature by themselves
        if layout.audio or layout.video:  # cast the {"bytes", "path"} structs and paths, not encode arrays
            dataset = dataset.cast(Features({**dataset.features, **{column: Audio() for column in layout.audio},
                                             **{column: Video() for column in layout.video}}))
        path = Path(layout.config) / f"{split}.parquet"
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        dataset.to_parquet(str(folder / path))
        entries.append(f"  - split: {split}\n    path: {path.as_posix()}")
    (folder / "README.md").write_text(
        f"---\nconfigs:\n- config_name: {layout.config}\n  default: true\n  data_files:\n" + "\n".join(entries)
        + f"\n---\nnbddp sweep stand-in for {dataset_id}: {layout.rows} generated rows per split.\n",
        encoding="utf-8")
    return folder


def _words(rng: random.Random, low: int = 4, high: int = 12, bank=WORDS) -> str:
    return " ".join(rng.choice(bank) for _ in range(rng.randint(low, high)))


def _image(rng: random.Random, text: str, size=(96, 48)):
    from PIL import Image, ImageDraw

    image = Image.new("RGB", size, tuple(rng.randrange(160, 256) for _ in range(3)))
    ImageDraw.Draw(image).text((4, size[1] // 3), text[:14], fill=(0, 0, 0))
    return image


def _tone(rng: random.Random, seconds: float, sampling_rate: int = 16000) -> dict:
    frequency = rng.choice((220, 330, 440))
    count = int(seconds * sampling_rate)
    return {"array": [math.sin(2 * math.pi * frequency * t / sampling_rate) * 0.3 for t in range(count)],
            "sampling_rate": sampling_rate}


def _clip(rng: random.Random, seconds: float, fps: int = 2, size: int = 32) -> dict:
    """A square of one colour crossing a plain background, `seconds` long at `fps` frames per second."""
    import torch

    count = int(seconds * fps)
    frames = torch.empty(count, 3, size, size, dtype=torch.uint8)
    frames[:] = torch.tensor([rng.randrange(160, 256) for _ in range(3)], dtype=torch.uint8).view(3, 1, 1)
    colour = torch.tensor([rng.randrange(0, 96) for _ in range(3)], dtype=torch.uint8).view(3, 1, 1)
    side, top = size // 4, rng.randrange(0, size - size // 4)
    for t in range(count):
        left = t * (size - side) // max(1, count - 1)
        frames[t, :, top:top + side, left:left + side] = colour
    return {"frames": frames, "fps": fps}


def _mp4(path: Path, frames, fps) -> Path:
    """`frames` written to `path` as an H.264 MP4; ImportError without torchcodec or FFmpeg's libraries."""
    try:
        from torchcodec.encoders import VideoEncoder
    except (ImportError, RuntimeError) as error:  # torchcodec raises RuntimeError when it finds no FFmpeg
        raise ImportError(f"writing {path.name} needs torchcodec and FFmpeg's libraries: {error}") from error
    path.parent.mkdir(parents=True, exist_ok=True)
    VideoEncoder(frames, frame_rate=fps).to_file(str(path))
    return path.resolve()


def _wav(array, sampling_rate) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as file:
        file.setnchannels(1)
        file.setsampwidth(2)
        file.setframerate(sampling_rate)
        file.writeframes(struct.pack(f"<{len(array)}h", *(int(x * 32767) for x in array)))
    return buffer.getvalue()


def _sharegpt(rng: random.Random, turns: int = 1, bank=WORDS) -> list[dict]:
    conversation = []
    for _ in range(turns):
        conversation += [{"from": "human", "value": _words(rng, bank=bank) + "?"},
                         {"from": "gpt", "value": _words(rng, bank=bank) + "."}]
    return conversation


def _messages(rng: random.Random, system: bool = False) -> list[dict]:
    head = [{"role": "system", "content": _words(rng, 3, 6)}] if system else []
    return head + [{"role": "user", "content": _words(rng) + "?"}, {"role": "assistant", "content": _words(rng) + "."}]


def _sum_problem(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(2, 40), rng.randint(2, 40)
    return f"Tom has {a} apples and buys {b} more. How many apples does he have?", a + b


def _alpaca(rng, i):
    return {"output": _words(rng) + ".", "input": _words(rng, 0, 5), "instruction": _words(rng) + "?"}


def _alpaca_gpt4(rng, i):
    row = {"instruction": _words(rng) + "?", "input": _words(rng, 0, 5), "output": _words(rng) + "."}
    return {**row, "text": f"### Instruction:\n{row['instruction']}\n\n### Response:\n{row['output']}"}


def _open_math_reasoning(rng, i):
    problem, answer = _sum_problem(rng)
    expected = str(answer) if i % 8 != 7 else "\\frac{1}{2}"  # a few non-numeric answers, which notebooks drop
    return {"expected_answer": expected, "problem_type": "has_answer_extracted", "problem_source": "aops_c4",
            "generation_model": "DeepSeek-R1", "pass_rate_72b_tir": "0.9", "problem": problem,
            "generated_solution": f"<think>\nAdd the two numbers.\n</think>\nThe answer is {expected}.",
            "inference_mode": "cot"}


def _dapo(rng, i):
    problem, answer = _sum_problem(rng)
    return {"prompt": problem, "solution": str(answer), "data_source": "math_dapo", "ability": "MATH",
            "reward_model": {"ground_truth": str(answer), "style": "rule-lighteval/MATH_v2"},
            "extra_info": {"index": str(i)}}


def _gsm8k(rng, i):
    problem, answer = _sum_problem(rng)
    return {"question": problem, "answer": f"He has {answer} apples.\n#### {answer}"}


def _deepscaler(rng, i):
    problem, answer = _sum_problem(rng)
    return {"problem": problem, "answer": str(answer), "solution": f"Adding gives $\\boxed{{{answer}}}$."}


def _latex_ocr(rng, i):
    text = rng.choice(("\\frac{a}{b}", "x^{2}+y^{2}", "\\sum_{i=1}^{n} i", "\\sqrt{x+1}", "e^{i\\pi}+1=0"))
    return {"image": _image(rng, text, (160, 40)), "text": text}


def _math_vista(rng, i):
    problem, answer = _sum_problem(rng)
    numeric = i % 4 != 3
    return {"pid": str(i), "question": problem, "image": f"images/{i}.jpg",
            "decoded_image": _image(rng, str(answer), (96, 96)), "choices": None if numeric else ["A", "B"],
            "unit": None, "precision": None, "answer": str(answer) if numeric else "A",
            "question_type": "free_form" if numeric else "multi_choice",
            "answer_type": "integer" if numeric else "text", "query": problem}


def _radiology(rng, i):
    caption = "Panoramic radiograph showing " + _words(rng, 3, 6) + "."
    return {"image": _image(rng, "xray", (96, 96)), "image_id": f"ROCO_{i:05d}", "caption": caption,
            "cui": ["C1306645"]}


def _llava(rng, i):
    question, answer = _words(rng) + "?", _words(rng) + "."
    return {"messages": [{"role": "user", "content": [{"type": "image", "text": None, "index": 0},
                                                      {"type": "text", "text": question, "index": None}]},
                         {"role": "assistant", "content": [{"type": "text", "text": answer, "index": None}]}],
            "images": [_image(rng, answer)]}


def _parsynth(rng, i):
    text = _words(rng, 2, 4)
    return {"image_path": _image(rng, text, (128, 32)), "text": text}


def _kaira(rng, i):
    return {"audio": _tone(rng, 0.25, 24000), "text": _words(rng) + ".", "source": "0"}


def _emilia(rng, i):
    return {"audio": _tone(rng, 0.05), "text": _words(rng) + "."}


# evaluate-metric/wer's metric, for `evaluate.load("wer")` run beside it: word error rate through jiwer, as the
# hub's wer.py computes it (errors over reference words, summed over the pairs).
WER_METRIC = """import datasets
import evaluate
import jiwer


class Wer(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(description="word error rate (nbddp sweep stand-in)", citation="",
                                   features=datasets.Features({"predictions": datasets.Value("string"),
                                                               "references": datasets.Value("string")}))

    def _compute(self, predictions=None, references=None, concatenate_texts=False):
        if concatenate_texts:
            return jiwer.wer(references, predictions)
        errors = words = 0
        for prediction, reference in zip(predictions, references):
            measures = jiwer.process_words(reference, prediction)
            errors += measures.substitutions + measures.deletions + measures.insertions
            words += measures.substitutions + measures.deletions + measures.hits
        return errors / words
"""
# hubertsiuzdak/snac_24khz's config.json with the encoder's and decoder's widths cut (8 and 32 for 48 and 1024):
# the same rates, strides and 4096-code books, so a notebook's code offsets (128266 + k * 4096) hold.
SNAC_24KHZ = {"sampling_rate": 24000, "encoder_dim": 8, "encoder_rates": [2, 4, 8, 8], "decoder_dim": 32,
              "decoder_rates": [8, 8, 4, 2], "attn_window_size": None, "codebook_size": 4096, "codebook_dim": 8,
              "vq_strides": [4, 2, 1], "noise": True, "depthwise": True}


def _wer_metric(folder: Path) -> None:
    (folder / "wer.py").write_text(WER_METRIC, encoding="utf-8")


def _snac(folder: Path) -> None:
    """SNAC.from_pretrained's folder (config.json, pytorch_model.bin): a tiny SNAC of seeded random weights."""
    import torch
    from snac import SNAC

    (folder / "config.json").write_text(json.dumps(SNAC_24KHZ, indent=2) + "\n", encoding="utf-8")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        torch.save(SNAC.from_config(folder / "config.json").state_dict(), folder / "pytorch_model.bin")


def _txt360_agent(rng, i):
    tool = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                             "parameters": {"type": "object",
                                                            "properties": {"city": {"type": "string"}},
                                                            "required": ["city"]}}}
    messages = [{"role": "system", "content": "You can call tools.", "tools": [tool]},
                {"role": "user", "content": _words(rng) + "?"},
                {"role": "assistant", "content": "", "think": _words(rng, 3, 6),
                 "tool_calls": [{"id": f"call_{i}", "type": "function",
                                 "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                {"role": "tool", "content": "sunny", "tool_call_id": f"call_{i}", "name": "get_weather"},
                {"role": "assistant", "content": _words(rng) + ".", "think": _words(rng, 3, 6)}]
    return {"messages": json.dumps(messages)}


def _mobile_actions(rng, i):
    tool = {"function": {"name": "set_alarm", "description": "Sets an alarm",
                         "parameters": {"type": "OBJECT", "required": ["time"],
                                        "properties": {"time": {"type": "STRING", "description": "HH:MM"}}}}}
    return {"metadata": "train" if i % 5 else "eval", "tools": [tool],
            "messages": [{"role": "developer", "content": "You are a phone assistant.", "tool_calls": None},
                         {"role": "user", "content": _words(rng) + "?", "tool_calls": None},
                         {"role": "assistant", "content": "",  # "", not None: the stand-in model's template adds it
                          "tool_calls": [{"function": {"name": "set_alarm", "arguments": {"time": "07:30"}}}]}]}


def _multilingual_thinking(rng, i):
    developer, user, analysis, final = _words(rng, 3, 6), _words(rng) + "?", _words(rng), _words(rng) + "."
    return {"reasoning_language": "English", "developer": developer, "user": user, "analysis": analysis,
            "final": final,
            "messages": [{"content": developer, "role": "system", "thinking": None},
                         {"content": user, "role": "user", "thinking": None},
                         {"content": final, "role": "assistant", "thinking": analysis}]}


def _codeforces(rng, i):
    problem, solution = _words(rng) + "?", "```python\nprint(sum(map(int, input().split())))\n```"
    return {"id": f"{i}A", "problem": problem, "generation": f"<think>\n{_words(rng)}\n</think>\n{solution}",
            "messages": [{"role": "user", "content": problem},
                         {"role": "assistant", "content": f"<think>\n{_words(rng)}\n</think>\n{solution}"}]}


def _dolphin_preference(rng, i):
    return {"instruction": _words(rng) + "?", "input": _words(rng, 0, 4), "accepted": _words(rng) + ".",
            "rejected": _words(rng, 2, 4) + "."}


def _ultrafeedback(rng, i):
    prompt = _words(rng) + "?"
    chosen, rejected = _words(rng) + ".", _words(rng, 2, 4) + "."
    return {"prompt": prompt, "prompt_id": f"{i:064x}",
            "chosen": [{"role": "user", "content": prompt}, {"role": "assistant", "content": chosen}],
            "rejected": [{"role": "user", "content": prompt}, {"role": "assistant", "content": rejected}],
            "messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": chosen}],
            "score_chosen": 8.0, "score_rejected": 4.0}


LAYOUTS: dict[str, Layout] = {
    "unsloth/alpaca-cleaned": Layout(_alpaca),
    "yahma/alpaca-cleaned": Layout(_alpaca),
    "vicgalle/alpaca-gpt4": Layout(_alpaca_gpt4),
    "mlabonne/FineTome-100k": Layout(lambda rng, i: {"conversations": _sharegpt(rng, 1 + i % 2),
                                                      "source": "infini-instruct-top-500k", "score": 5.0},
                                     rows=10000),  # Gemma3_(270M)_Phone_Deployment: .select(range(10000))
    "philschmid/guanaco-sharegpt-style": Layout(lambda rng, i: {"conversations": _sharegpt(rng)}),
    "FreedomIntelligence/alpaca-gpt4-korean": Layout(lambda rng, i: {"conversations": _sharegpt(rng, bank=KOREAN)}),
    "unsloth/OpenMathReasoning-mini": Layout(_open_math_reasoning, splits=("cot",)),
    "open-r1/DAPO-Math-17k-Processed": Layout(_dapo, config="en"),
    "openai/gsm8k": Layout(_gsm8k, config="main", splits=("train", "test")),
    "agentica-org/DeepScaleR-Preview-Dataset": Layout(_deepscaler),
    "unsloth/LaTeX_OCR": Layout(_latex_ocr, splits=("train", "test")),
    # the vision GRPO notebooks keep its numeric answers, then read row 165
    "AI4Math/MathVista": Layout(_math_vista, rows=300, splits=("testmini",)),
    "unsloth/Radiology_mini": Layout(_radiology, splits=("train", "test")),
    "unsloth/llava-instruct-mix-vsft-mini": Layout(_llava),
    "hezarai/parsynth-ocr-200k": Layout(_parsynth, rows=2000, splits=("train", "test")),
    "Etherll/kaira": Layout(_kaira, audio=("audio",)),
    "kadirnar/Emilia-DE-B000000": Layout(_emilia, rows=7600, audio=("audio",)),
    "wer": Layout(None, folder=_wer_metric),  # Whisper: evaluate.load("wer")
    "hubertsiuzdak/snac_24khz": Layout(None, folder=_snac),  # Orpheus_(3B)-TTS: SNAC.from_pretrained(...)
    "LLM360/TxT360-3efforts": Layout(_txt360_agent, config="agent", splits=("medium",)),
    "google/mobile-actions": Layout(_mobile_actions),
    "HuggingFaceH4/Multilingual-Thinking": Layout(_multilingual_thinking),
    "open-r1/codeforces-cots": Layout(_codeforces, config="solutions_decontaminated"),
    "Thytu/ChessInstruct": Layout(lambda rng, i: {"task": "Find the missing move.", "input": "e4 e5 Nf3 ?",
                                                   "expected_output": rng.choice(("Nc6", "d6", "Nf6")),
                                                   "KIND": "FIND_MISSING_MOVE"}),
    "reciperesearch/dolphin-sft-v0.1-preference": Layout(_dolphin_preference),
    # Zephyr_(7B)-DPO samples 0.5% of it, then reads row 8
    "HuggingFaceH4/ultrafeedback_binarized": Layout(_ultrafeedback, rows=2000, splits=("train_prefs", "test_prefs")),
    "roneneldan/TinyStories": Layout(lambda rng, i: {"text": "Once upon a time " + _words(rng, 8, 20) + "."}),
    "wikimedia/wikipedia": Layout(lambda rng, i: {"id": str(i), "url": f"https://ko.wikipedia.org/wiki?curid={i}",
                                                   "title": _words(rng, 1, 2, KOREAN),
                                                   "text": _words(rng, 10, 30, KOREAN)},
                                  rows=400, config="20231101.ko"),
    "dair-ai/emotion": Layout(lambda rng, i: {"text": _words(rng), "label": i % 6}, config="unsplit"),
    "sentence-transformers/all-nli": Layout(lambda rng, i: {"anchor": _words(rng), "positive": _words(rng)},
                                            config="pair"),
    "electroglyph/technical": Layout(lambda rng, i: {"anchor": _words(rng, 1, 2), "positive": _words(rng)}),
    "tomaarsen/miriad-4.4M-split": Layout(lambda rng, i: {"question": _words(rng) + "?",
                                                           "passage_text": _words(rng, 10, 30)},
                                          splits=("train", "eval")),
    # Muse_Glimmer_(30B)-Multimodal decodes the clips by their paths (torchcodec's VideoDecoder)
    "XinNUS/Temporal_Caption_Bench": Layout(lambda rng, i: {"query": _words(rng) + "?", "video": _clip(rng, 4.0),
                                                             "duration": 4.0,
                                                             "facts": [{"tag": "shared", "text": _words(rng)}]},
                                            rows=64, video=("video",)),
}
