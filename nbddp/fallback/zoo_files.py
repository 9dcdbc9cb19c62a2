"""unsloth_zoo's own files for the hf backend, each as module `unsloth_zoo.<stem>` loaded from its path
(`importlib`) with the package's __init__ left unrun: `import unsloth_zoo` refuses to run without Unsloth, and
Unsloth without a GPU.

    spec("rl_environments")  # a ModuleSpec to load now, or None when unsloth_zoo (or that file) is not installed
    lazy_module("utils")     # a module that runs its file at its first attribute, or None (as above)

    package()                # the package itself with its __init__ unrun, or None (as above)

Put in sys.modules as `unsloth_zoo.<stem>`, the module is what a notebook's `from unsloth_zoo.<stem> import X`
gets, without the package being imported. Only files that import no sibling module of their package load this way;
with `package()` put in sys.modules as `unsloth_zoo`, any of its modules does (and imports its siblings so).
"""
import importlib.util
import os
from types import ModuleType


def spec(stem: str) -> importlib.machinery.ModuleSpec | None:
    package = importlib.util.find_spec("unsloth_zoo")  # finds the folder without running its __init__
    folders = list(package.submodule_search_locations or []) if package else []
    path = next((f"{folder}/{stem}.py" for folder in folders if os.path.isfile(f"{folder}/{stem}.py")), None)
    return importlib.util.spec_from_file_location(f"unsloth_zoo.{stem}", path) if path else None


def lazy_module(stem: str) -> ModuleType | None:
    found = spec(stem)
    if found is None:
        return None
    found.loader = importlib.util.LazyLoader(found.loader)
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)  # lazily: the file runs when the module is first used
    return module


def package() -> ModuleType | None:
    """`unsloth_zoo` as a bare package, its folder searched for submodules and its __init__ (which refuses to run
    without Unsloth) left unrun; None when unsloth_zoo is not installed."""
    found = importlib.util.find_spec("unsloth_zoo")
    if found is None or not found.submodule_search_locations:
        return None
    module = ModuleType("unsloth_zoo", "unsloth_zoo's modules, its __init__ unrun (nbddp's hf backend)")
    module.__path__ = list(found.submodule_search_locations)
    module.__spec__ = found
    return module
