"""`unsloth.dataprep` under the Transformers+PEFT fallback (installed by runtime.backend.activate): every name says what
to do instead, so `from unsloth.dataprep import SyntheticDataKit` is a UsageError, not "'unsloth' is not a package"."""
from nbddp.errors import UsageError


def __getattr__(name):
    # PEP 562: `from unsloth.dataprep import X` ends here for every X.
    if name.startswith("_"):  # dunders and privates: the import system and tools probe these
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    synthetic = name == "SyntheticDataKit"
    what = ("serves the model with vLLM (a CUDA GPU) to generate question-answer pairs with Meta's synthetic-data-kit"
            if synthetic else "is Unsloth's data preparation")
    raise UsageError(
        f"unsloth.dataprep.{name} {what}, and nbddp's Transformers+PEFT fallback (--backend hf) has no "
        f"unsloth.dataprep. Run on a GPU with Unsloth{' and vLLM' if synthetic else ''} installed (--backend "
        "unsloth), or prepare the data beforehand and load it with datasets.load_dataset")
