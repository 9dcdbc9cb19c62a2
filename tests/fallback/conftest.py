"""The fallback's tests build the same tiny Llama as the runtime's: its fixtures are tests/runtime/conftest.py's,
shared from there rather than copied."""
from tests.runtime.conftest import (  # noqa: F401 (fixtures)
    backend_patches_undone_after, model_cache, tiny_llama_dir, tiny_model_path)
