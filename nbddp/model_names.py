"""Is a model name something `from_pretrained` can load here? Checked before Transformers or Unsloth try, by the
notebooks and by the fallback's `from_pretrained`: nbddp's, shared by the notebooks and the fallback.

    from nbddp.model_names import require_model
    require_model(model_name)  # UsageError: model 'models/tyny-llama': no such directory (did you mean ...?)

Transformers' own answer to a mistyped local path or an unreachable Hub comes after about 45 s of
retries and reads "We couldn't connect to 'https://huggingface.co' ...", naming neither the path nor
the fix. A name is fine when it is a local model directory, is in the Hugging Face cache, or the Hub
answers for it (one metadata request, no retries); then `from_pretrained` downloads it as usual.
"""
from pathlib import Path

from nbddp.errors import UsageError
from nbddp.near_miss import closest_sibling

MODEL_FILES = ("config.json", "adapter_config.json")  # a saved model, or a LoRA adapter (Unsloth loads both)
HUB_TIMEOUT_S = 10  # the one metadata request to the Hub


def require_model(name: str) -> None:
    """Raise UsageError, naming `name`, when neither this machine nor the Hub has that model."""
    path = Path(name).expanduser()
    if path.is_dir():
        if not any((path / file).is_file() for file in MODEL_FILES):
            raise UsageError(f"model {name!r}: the directory has no {' or '.join(MODEL_FILES)}, so it holds no saved model")
        return
    if path.exists():
        raise UsageError(f"model {name!r}: a file, not a model directory")
    if _looks_local(name):
        raise UsageError(f"model {name!r}: no such directory{closest_sibling(path, Path.is_dir)}")
    if _in_hub_cache(name):
        return
    _ask_hub(name)


def _looks_local(name: str) -> bool:
    """A path rather than a Hub id: not a valid repo id, or under a local folder (`models/x` beside `models/`)."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if "/" in name and Path(name.split("/")[0]).is_dir():
        return True
    try:
        validate_repo_id(name)
    except HFValidationError:  # `./x`, `/abs/x`, `a/b/c`, `~/x`: no Hub id looks like these
        return True
    return False


def _in_hub_cache(name: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return any(isinstance(try_to_load_from_cache(name, file), str) for file in MODEL_FILES)


def _ask_hub(name: str) -> None:
    import httpx
    from huggingface_hub import constants, model_info
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        model_info(name, timeout=HUB_TIMEOUT_S)
    except GatedRepoError:
        return  # it exists; from_pretrained and the user's token settle access
    except RepositoryNotFoundError:
        raise UsageError(
            f"model {name!r}: not a local directory, and the Hugging Face Hub has no such model "
            "(or it is private: log in with `hf auth login`)"
        ) from None
    except (httpx.HTTPError, OSError) as error:  # no network, offline mode (HF_HUB_OFFLINE), the Hub failing
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise UsageError(
            f"model {name!r}: not a local directory, not in the Hugging Face cache ({constants.HF_HUB_CACHE}), "
            f"and the Hub cannot be reached ({reason}); give a local model directory, or download it first "
            f"where the Hub is reachable (`hf download {name}`)"
        ) from None
