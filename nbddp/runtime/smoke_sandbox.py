"""A smoke run writes nothing of the user's: what the notebook's code saves lands in the smoke run's folder, and
nothing goes to a hub.

`pipeline.py smoke` (and `run`'s smoke step) set the run setting `smoke_dir` to the smoke run's folder; `runtime.setup`
then calls `install()`, which wraps the library methods listed below, each once however often it runs. Without it
nothing is wrapped: the training run saves and pushes where the notebook says.

A save to a path P goes to `redirected(P)`:
- P itself when it lies in the smoke folder already (the smoke's output_dir) or in nbddp's model cache
  (`tiny_model.ensure_weights` builds weights there; nbddp's, not the user's);
- `<smoke dir>/P` for a P in the project (the folder the run started in, which holds the smoke folder, before the
  script changed into the notebooks' folder), `<smoke dir>/abs/<P from its root>` for any other
  (`/content/drive/...`, `/tmp/x`): the smoke run writes neither.
The first save to each P prints where it went. A Trainer's checkpoints (`save_model(_internal_call=True)`) stay
whole where its output_dir says (`Trainer._save_checkpoint`), which the smoke run points at its folder.

Wrapped (no upstream bug behind these: the smoke run must leave the user's files and hub repositories alone):
- `save_pretrained` of transformers' PreTrainedModel, PreTrainedTokenizerBase (and TokenizersBackend, which has
  its own) and ProcessorMixin and of PEFT's PeftModel (Unsloth's models and tokenizers are these; the fallback's
  `save_lora` is PeftModel's): redirected, and their `push_to_hub=True` skipped.
- `Trainer.save_model`, matplotlib's `Figure.savefig` (`plt.savefig` calls it), `torch.save`, datasets'
  `save_to_disk` and `ddp.write_file` (%%writefile, which calls `redirected` itself): redirected.
- `open` as the notebook's cells see it (a name in their namespace, not the builtin the libraries call): a write
  is redirected, an append or update first copies the file it changes; a read takes the smoke run's copy if the
  notebook wrote one.
- Unsloth's saving functions in `unsloth.save`, which it binds to each model it loads (`save_pretrained_merged`,
  `save_pretrained_gguf`, ...): redirected; its pushes (`push_to_hub_merged`, `push_to_hub_gguf`, and
  `upload_to_huggingface`, which its `push_to_hub` calls first) skipped. The fallback's (nbddp.fallback.save) write
  through the methods above, and `write_executorch_config`, which writes a file itself: redirected.
- skipped with one line per repository: `push_to_hub` of PreTrainedModel, PreTrainedTokenizerBase, ProcessorMixin
  and PushToHubMixin (PEFT models'), Trainer.push_to_hub, huggingface_hub's HfApi.upload_file, upload_folder and
  upload_large_folder and the module's functions of those names; the training arguments' `push_to_hub=True` is
  turned off (`training_kwargs`).
- read from the smoke run's copy when the notebook saved one there (`read_from`): `from_pretrained` of
  transformers' models, tokenizers, processors, configs and auto classes, of PEFT's PeftModel and PeftConfig and
  of Unsloth's loaders; `torch.load`; datasets' `load_from_disk`. So `from_pretrained("lora_model")` after
  `save_pretrained("lora_model")` loads what this run saved, as the notebook would; a module the notebook writes
  where it imports from (`%%writefile reward.py`) stays importable: its copy's folder goes ahead on sys.path.
Not covered: `!` commands, which run where they say (a `!git clone` that later cells read must be where they
read it); `pipeline.py smoke` lists what changed in the project outside runs/ afterwards (`project_changes`).
"""
import functools
import importlib
import io
import os
import shutil
import sys
from pathlib import Path

from nbddp import patches
from nbddp.examples import tiny_model
from nbddp.fallback import save as fallback_save
from nbddp.formats.run_settings import ENV

SMOKE_DIR_VARIABLE = ENV.SMOKE_DIR
OUTSIDE_PROJECT = "abs"  # <smoke dir>/abs/<path from its root>: where a save outside the project goes
PATCH = "smoke-sandbox"
UPLOADS = ("upload_file", "upload_folder", "upload_large_folder")
UNSLOTH_SAVES = ("unsloth_generic_save_pretrained_merged", "unsloth_save_pretrained_gguf",
                 "unsloth_save_pretrained_torchao", "unsloth_convert_lora_to_ggml_and_save_locally")
UNSLOTH_LOADERS = ("FastLanguageModel", "FastModel")  # their from_pretrained: FastVisionModel's is FastModel's
UNSLOTH_PUSHES = ("unsloth_generic_push_to_hub_merged", "unsloth_push_to_hub_gguf",
                  "unsloth_convert_lora_to_ggml_and_push_to_hub", "upload_to_huggingface")

# Inside a Trainer's checkpoint save, whose paths stay. A plain dict, not a ContextVar: datasets fingerprints a map
# function with dill, which pickles by value the classes Unsloth patches at run time, these wrappers and the module
# globals they read with them, and a ContextVar cannot be pickled (seen on a GPU: "cannot pickle
# '_contextvars.ContextVar' object" building SFTTrainer in the smoke run).
_state = {"trainer_saving": False, "project": None}
_announced = set()  # the destinations already named: one line each


def smoke_dir() -> Path | None:
    """The smoke run's folder (absolute), or None outside a smoke run."""
    text = os.environ.get(SMOKE_DIR_VARIABLE)
    return Path(os.path.abspath(text)) if text else None


def install(project=None, namespace=None) -> None:
    """In a smoke run (the run setting `smoke_dir` set), wrap the saving, pushing and loading functions listed above;
    otherwise nothing. `project`: the folder the run started in (None: the working directory); `namespace`: the cells'
    globals, whose `open` becomes `notebook_open`."""
    if smoke_dir() is None:
        return
    _state["project"] = Path(os.path.abspath(project or os.getcwd()))
    for owner, name, wrap in targets():
        if vars(owner).get(name) is not None:  # a class's own method (one it inherits is wrapped where it is defined)
            patches.wrap(PATCH, owner, name, wrap)
    if namespace is not None:
        namespace["open"] = notebook_open


def targets():
    """(owner, attribute, wrap) for each function install() wraps; `wrap(original)` returns the wrapper."""
    import datasets
    import huggingface_hub
    import huggingface_hub.hf_api
    import peft
    import torch
    import transformers
    from matplotlib.figure import Figure
    from peft import PeftModel
    from transformers.models.auto import auto_factory
    from transformers.utils import PushToHubMixin

    # TokenizersBackend (Transformers 5: every fast tokenizer) has a save_pretrained of its own before the base's;
    # Transformers copies PushToHubMixin.push_to_hub into each of its classes (copy_func, for the docstrings), and
    # _BaseAutoModelClass.from_pretrained into each auto class (auto_class_update).
    tokenizer_backend = getattr(transformers, "TokenizersBackend", None)
    models = (transformers.PreTrainedModel, transformers.PreTrainedTokenizerBase, transformers.ProcessorMixin)
    saving = [(cls, "save_pretrained", _redirecting("save_directory"))
              for cls in (*models, PeftModel, *filter(None, [tokenizer_backend]))]
    saving += [(transformers.Trainer, "save_model", _trainer_save_model),
               (transformers.Trainer, "_save_checkpoint", _trainer_checkpoint),
               (Figure, "savefig", _redirecting("fname")), (torch, "save", _redirecting("f", index=1)),
               (datasets.Dataset, "save_to_disk", _redirecting("dataset_path")),
               (datasets.DatasetDict, "save_to_disk", _redirecting("dataset_dict_path"))]
    pushing = [(cls, "push_to_hub", _skipping()) for cls in (*models, PushToHubMixin)]  # the mixin's: PEFT models'
    pushing += [(transformers.Trainer, "push_to_hub", _skipping(_trainer_repo))]
    pushing += [(owner, name, _skipping()) for owner in (huggingface_hub.hf_api.HfApi, huggingface_hub.hf_api,
                                                         huggingface_hub) for name in UPLOADS]
    auto = [cls for module in (transformers.models.auto.modeling_auto, transformers.models.auto.tokenization_auto,
                               transformers.models.auto.processing_auto, transformers.models.auto.configuration_auto)
            for cls in vars(module).values() if isinstance(cls, type) and "from_pretrained" in vars(cls)]
    loaders = (*models, transformers.PretrainedConfig, auto_factory._BaseAutoModelClass, *auto)
    reading = [(cls, "from_pretrained", _reading("pretrained_model_name_or_path")) for cls in loaders]
    reading += [(PeftModel, "from_pretrained", _reading("model_id", index=2)),
                (peft.config.PeftConfigMixin, "from_pretrained", _reading("pretrained_model_name_or_path")),
                (torch, "load", _reading("f", index=0)), (datasets, "load_from_disk", _reading("dataset_path", 0)),
                (datasets.load, "load_from_disk", _reading("dataset_path", index=0)),
                (datasets.Dataset, "load_from_disk", _reading("dataset_path", index=0)),
                (datasets.DatasetDict, "load_from_disk", _reading("dataset_dict_path", index=0))]
    saving += [(fallback_save, "write_executorch_config", _redirecting("directory", index=0))]
    unsloth_save = sys.modules.get("unsloth.save")  # the real Unsloth only: the hf backend has no such module
    if unsloth_save is not None:
        saving += [(unsloth_save, name, _redirecting("save_directory")) for name in UNSLOTH_SAVES]
        pushing += [(unsloth_save, name, _skipping()) for name in UNSLOTH_PUSHES]
        loaders = [getattr(sys.modules.get("unsloth"), name, None) for name in UNSLOTH_LOADERS]
        reading += [(cls, "from_pretrained", _reading("model_name", index=0))  # staticmethods
                    for cls in loaders if isinstance(vars(cls or object).get("from_pretrained"), staticmethod)]
    return saving + pushing + reading


def redirected(path):
    """Where a save to `path` goes (see above): `path` itself outside a smoke run; the same type back (str or Path).
    The first time a path is redirected, one line says where to."""
    target = _target(path)
    if target is None:
        return path
    absolute = Path(os.path.abspath(os.path.expanduser(path)))
    if absolute.parent.is_dir():  # %%writefile and savefig need their folder, which the training run would find
        target.parent.mkdir(parents=True, exist_ok=True)
    _say_once(absolute, f"nbddp: smoke run: save to {path} went to {_shown(target)} (the training run writes where "
                        "the notebook says)")
    if absolute.suffix == ".py":
        _keep_importable(absolute, target)
    return _like(path, target)


def _keep_importable(module: Path, target: Path) -> None:
    """A module the notebook writes where it imports from (`%%writefile reward.py`, then `import reward`): the
    smoke run's copy's folder goes ahead of that folder on sys.path."""
    on_path = [os.path.abspath(entry or os.curdir) for entry in sys.path]
    folder = os.path.abspath(target.parent)
    if str(module.parent) in on_path and folder not in on_path:
        sys.path.insert(on_path.index(str(module.parent)), folder)
        importlib.invalidate_caches()


def read_from(path):
    """Where a read of `path` looks: the smoke run's copy when this run saved one there (`redirected`), else `path`;
    the same type back. The first read of each copy prints where it came from."""
    target = _target(path)
    if target is None or not target.exists():
        return path
    _say_once(("read", target), f"nbddp: smoke run: {path} read from {_shown(target)}, where this smoke run saved it")
    return _like(path, target)


def notebook_open(file, mode="r", *args, **kwargs):
    """The cells' `open` in a smoke run: a write goes to `redirected(file)`, which an append or update (`a`, `+`)
    first fills with the file it changes; a read takes `read_from(file)`."""
    if not isinstance(file, (str, os.PathLike)):  # a file descriptor
        return io.open(file, mode, *args, **kwargs)
    if not set(mode) & set("wax+"):
        return io.open(read_from(file), mode, *args, **kwargs)
    original = Path(os.path.abspath(os.path.expanduser(file)))
    target = redirected(file)
    if set(mode) & set("a+") and original.is_file() and not Path(target).exists():
        shutil.copyfile(original, target)  # the smoke run changes its own copy
    return io.open(target, mode, *args, **kwargs)


def _target(path) -> Path | None:
    """The smoke folder's place for `path` (see above), relative to the working directory when `path` is relative;
    None where the path stays: outside a smoke run, in a Trainer's checkpoint, in the smoke folder or nbddp's model
    cache, or for what is not a local path (a buffer, a URL)."""
    smoke = smoke_dir()
    if smoke is None or _state["trainer_saving"] or not isinstance(path, (str, os.PathLike)) or "://" in str(path):
        return None
    absolute = Path(os.path.abspath(os.path.expanduser(path)))
    if absolute.is_relative_to(smoke) or absolute.is_relative_to(tiny_model.cache_root()):
        return None
    project = _state["project"] or Path.cwd()
    if absolute.is_relative_to(project):
        target = smoke / absolute.relative_to(project)
    else:
        target = smoke / OUTSIDE_PROJECT / absolute.relative_to(absolute.anchor)
    if not os.path.isabs(os.path.expanduser(path)) and target.is_relative_to(Path.cwd()):
        target = target.relative_to(Path.cwd())  # relative as the notebook's path was
    return target


def _like(path, target: Path):
    return target if isinstance(path, Path) else str(target)


def training_kwargs(config_name, kwargs):
    """The training arguments' keywords, with `push_to_hub=True` turned off in a smoke run (the Trainer would create
    the repository when built and push its checkpoints), saying so."""
    if smoke_dir() is None or not kwargs.get("push_to_hub"):
        return kwargs
    _skip(f"{config_name}(push_to_hub=True)", kwargs.get("hub_model_id"))
    return {**kwargs, "push_to_hub": False}


def _redirecting(parameter, index=1):
    """A wrap for a function whose argument `index` (1: the first after self), or keyword `parameter`, is the path it
    saves to; its `push_to_hub=True` is skipped."""

    def wrap(original):
        @functools.wraps(original)
        def save(*args, **kwargs):
            args, kwargs = _with_path(args, kwargs, index, parameter, redirected)
            if kwargs.get("push_to_hub") and smoke_dir() is not None:
                _skip(f"{original.__name__}(push_to_hub=True)", kwargs.get("repo_id"))
                kwargs["push_to_hub"] = False
            return original(*args, **kwargs)

        return save

    return wrap


def _reading(parameter, index=1):
    """A wrap for a function whose argument `index` (1: the first after cls), or keyword `parameter`, is the path it
    reads: `read_from` that path."""

    def wrap(original):
        @functools.wraps(original)
        def load(*args, **kwargs):
            args, kwargs = _with_path(args, kwargs, index, parameter, read_from)
            return original(*args, **kwargs)

        return load

    return wrap


def _with_path(args, kwargs, index, parameter, where):
    """`args` and `kwargs` with the path at `index` or in `parameter` replaced by `where(path)`."""
    if len(args) > index and isinstance(args[index], (str, os.PathLike)):
        return (*args[:index], where(args[index]), *args[index + 1:]), kwargs
    if isinstance(kwargs.get(parameter), (str, os.PathLike)):
        return args, {**kwargs, parameter: where(kwargs[parameter])}
    return args, kwargs


def _trainer_save_model(original):
    @functools.wraps(original)
    def save_model(self, output_dir=None, _internal_call=False):
        if _internal_call or _state["trainer_saving"]:  # a checkpoint's: the trainer's own, whole in its output_dir
            return original(self, output_dir, _internal_call)
        return original(self, redirected(output_dir or self.args.output_dir), _internal_call)

    return save_model


def _trainer_checkpoint(original):
    """Trainer._save_checkpoint: model, optimizer, scheduler and RNG states (torch.save) stay in its output_dir."""

    @functools.wraps(original)
    def save_checkpoint(*args, **kwargs):
        _state["trainer_saving"] = True
        try:
            return original(*args, **kwargs)
        finally:
            _state["trainer_saving"] = False

    return save_checkpoint


def _skipping(repo_of=None):
    """A wrap that skips the call in a smoke run, naming the repository (`repo_of(args, kwargs)`, else the first
    text argument)."""

    def wrap(original):
        @functools.wraps(original)  # keeps the signature: Unsloth builds its push_to_hub from inspect.signature
        def push(*args, **kwargs):
            if smoke_dir() is None:
                return original(*args, **kwargs)
            repo = (repo_of or _repo_argument)(args, kwargs)
            _skip(original.__name__, repo)
            return None

        return push

    return wrap


def _repo_argument(args, kwargs):
    return kwargs.get("repo_id") or next((value for value in args if isinstance(value, str)), None)


def _trainer_repo(args, kwargs):
    return args[0].args.hub_model_id


def _skip(what, repo):
    to = f" to {repo}" if repo else ""
    _say_once(("push", repo or what), f"nbddp: smoke run: {what}{to} skipped (the training run pushes)")


def _say_once(key, line):
    if key not in _announced:
        _announced.add(key)
        print(line, flush=True)


def _shown(path: Path) -> str:
    return str(path.relative_to(Path.cwd())) if path.is_absolute() and path.is_relative_to(Path.cwd()) else str(path)
