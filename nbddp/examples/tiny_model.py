"""Weights for a model that ships only its config and tokenizer (a tiny test model kept in the repo).

`ensure_weights("models/tiny-llama")` builds the weights once, deterministically, into a cache keyed by the
directory's content and the Transformers release (whose weight names can change: Llava's did in 5.0) and returns
that path; any other name (a hub id, a directory with weights) comes back
unchanged. So the example notebooks train a real, if tiny, model on machines that cannot reach a hub. A config
with a `vision_config` (models/tiny-vision) is built as an image-text-to-text model, a speech model's
(models/tiny-whisper) as a speech-to-text model, a causal LM's as one, and any other as the class its config's
`architectures` names (models/tiny-csm: CsmForConditionalGeneration, a text-to-speech model).
"""
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from nbddp.formats.run_settings import ENV, setting

WEIGHT_PATTERNS = ("*.safetensors", "*.bin")


def ensure_weights(model_name: str) -> str:
    source = Path(model_name)
    if not (source / "config.json").is_file() or any(next(source.glob(p), None) for p in WEIGHT_PATTERNS):
        return model_name
    target = cache_root() / _content_hash(source)
    if not target.is_dir():
        _build(source, target)
    return str(target)


def cache_root() -> Path:
    """Where built weights go: the run setting `cache`, else its default in the table (~/.cache/nbddp/models)."""
    return Path(os.environ.get(ENV.CACHE) or Path(setting("cache").default).expanduser())


def _content_hash(directory: Path) -> str:
    import transformers

    digest = hashlib.sha256(transformers.__version__.encode() + b"\0")
    for path in _files(directory):
        digest.update(path.name.encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def _files(directory: Path) -> list[Path]:
    return sorted(path for path in directory.iterdir() if path.is_file())


def _build(source: Path, target: Path) -> None:
    """Write the model into a temporary directory beside `target`, then rename it into place.

    Ranks that race here each build the same weights; the first rename wins and the others discard theirs.
    """
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, AutoModelForSpeechSeq2Seq
    from transformers.models.auto.modeling_auto import (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
                                                        MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES)

    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        with torch.random.fork_rng(devices=[]):  # seed without disturbing the caller's random state
            torch.manual_seed(0)
            config = AutoConfig.from_pretrained(source)
            auto_class = (AutoModelForImageTextToText if hasattr(config, "vision_config") else
                          AutoModelForSpeechSeq2Seq if config.model_type in MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES
                          else AutoModelForCausalLM if config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
                          else None)
            model = (auto_class.from_config(config, dtype=torch.float32) if auto_class is not None
                     else getattr(transformers, config.architectures[0])(config).float())
        # Transformers 5 writes nothing on a rank other than 0 of a process group (should_save_on_this_rank), and
        # any rank may build here: the second machine's first rank, or every rank of a notebook without a guard.
        model.should_save_on_this_rank = lambda is_main_process: True
        model.save_pretrained(staging)
        for path in _files(source):  # config and tokenizer files, byte for byte
            shutil.copy2(path, staging / path.name)
        try:
            os.rename(staging, target)
        except OSError:
            if not target.is_dir():  # not another rank's identical build that got there first
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
