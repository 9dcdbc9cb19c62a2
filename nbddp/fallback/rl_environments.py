"""The hf backend's RL-environment helpers, `from unsloth import execute_with_time_limit` and its siblings: Unsloth's
own code, from unsloth_zoo/rl_environments.py of an installed unsloth_zoo.

    from unsloth import check_python_modules, create_locked_down_function, execute_with_time_limit

Unsloth's GRPO notebooks run the functions a model writes through these (a standard-library check, a sandboxed
`def`, a time limit). They are a sandbox: nbddp does not write its own. The file needs only the standard library and
numpy, but `import unsloth_zoo` refuses to run without Unsloth (and Unsloth without a GPU), so the file is loaded on
its own as module `unsloth_zoo.rl_environments` (`zoo_files`), its package's __init__ left unrun. Without
unsloth_zoo installed the name is bad input that says what to install.
"""
import importlib.util
import sys

from nbddp.errors import UsageError
from nbddp.fallback import zoo_files

NAMES = ("check_python_modules", "create_locked_down_function", "execute_with_time_limit", "Benchmarker",
         "check_signal_escape_patterns", "validate_single_function_source", "load_single_function", "time_limit")
MODULE = "unsloth_zoo.rl_environments"
PINNED = "unsloth-zoo==2026.10.9"  # docs/guide.md's GPU install


def load():
    """unsloth_zoo/rl_environments.py as a module (loaded once), or UsageError when unsloth_zoo is not installed."""
    if MODULE in sys.modules:
        return sys.modules[MODULE]
    spec = zoo_files.spec("rl_environments")
    if spec is None:
        raise UsageError(
            "Unsloth's RL-environment helpers (check_python_modules, create_locked_down_function, "
            "execute_with_time_limit) are unsloth_zoo's code, which is not installed; nbddp's Transformers+PEFT "
            f"fallback (--backend hf) loads them from it without a GPU: pip install --no-deps {PINNED}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[MODULE]
        raise
    return module
