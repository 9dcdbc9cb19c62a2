"""`--set NAME=VALUE`: overrides of the training arguments, typed as Transformers' HfArgumentParser types them."""
import dataclasses
import importlib.metadata
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import TrainingArguments
from transformers.trainer_utils import IntervalStrategy, SchedulerType
from trl import DPOConfig, KTOConfig, SFTConfig

from nbddp.errors import UsageError
from nbddp.runtime.inputs import training_overrides
from nbddp.runtime.inputs.training_overrides import ENV, Override, apply, check, from_environment


def overrides(*lines):
    return [training_overrides.parse_line(line) for line in lines]


@pytest.fixture(params=["classes", "schema"])
def checked(request):
    """`check` as the runtime runs it (the classes themselves) and as `pipeline.py` does (their schema, importing
    nothing): the same outcome, the same message."""
    schema = training_overrides.live_schema() if request.param == "schema" else None
    return lambda lines, **kwargs: check(lines, schema=schema, **kwargs)


# from_environment


def test_the_environment_holds_one_line_per_override():
    environ = {ENV: "learning_rate=1e-4\n\nlr_scheduler_type=cosine\nrun_name=a=b\n"}
    assert from_environment(environ) == [Override("learning_rate", "1e-4"), Override("lr_scheduler_type", "cosine"),
                                         Override("run_name", "a=b")]  # only the first `=` splits


def test_a_later_line_for_the_same_name_wins():
    assert from_environment({ENV: "learning_rate=1e-4\nbf16=true\nlearning_rate=3e-4"}) == [
        Override("bf16", "true"), Override("learning_rate", "3e-4")]


def test_no_variable_no_overrides():
    assert from_environment({}) == [] and from_environment({ENV: ""}) == []


@pytest.mark.parametrize("line", ["learning_rate", "=1e-4", " =1"])
def test_a_line_without_a_name_and_value_is_a_usage_error(line):
    with pytest.raises(UsageError, match=f"^--set {line}: expected NAME=VALUE, e.g. --set learning_rate=1e-4$") as error:
        from_environment({ENV: f"bf16=true\n{line}"})
    assert error.value.exit_status == 2


def test_environment_value_appends_the_new_lines_after_the_environments():
    assert training_overrides.environment_value(["bf16=false"], {ENV: "learning_rate=1e-4\n"}) == \
        "learning_rate=1e-4\nbf16=false"
    assert training_overrides.environment_value([], {}) == ""
    with pytest.raises(UsageError, match="a value must fit on one line"):
        training_overrides.environment_value(["run_name=a\nb"], {})


# check


# Transformers 5 takes a fraction of the run's steps in warmup_steps (warmup_ratio's successor); 4.x an int only.
TRANSFORMERS_5 = int(importlib.metadata.version("transformers").split(".")[0]) >= 5


@pytest.mark.parametrize("line", [
    "learning_rate=1e-4", "max_steps=-1", "warmup_steps=0.1" if TRANSFORMERS_5 else "warmup_steps=3", "logging_steps=0.5", "seed=0", "bf16=true", "bf16=No", "bf16=0", "max_steps=10",
    "lr_scheduler_type=cosine", "eval_strategy=steps", "optim=adamw_torch", "eval_steps=0.5", "seed=3",
    "report_to=tensorboard", "label_names=labels other", "beta=0.2", "max_length=512", "num_generations=4",
])
def test_fields_of_the_training_arguments_family_pass(checked, line):
    checked(overrides(line))  # the assertions are in the failing cases below, which use the same path


@pytest.mark.parametrize("line, message", [
    ("learnin_rate=1e-4", "--set learnin_rate=1e-4: no training argument named learnin_rate (did you mean learning_rate?)"),
    ("bf16=maybe", "--set bf16=maybe: bf16 takes a bool (true or false), not 'maybe'"),
    ("max_steps=1.5", "--set max_steps=1.5: max_steps takes an int, not '1.5'"),
    ("learning_rate=fast", "--set learning_rate=fast: learning_rate takes a float, not 'fast'"),
    ("eval_strategy=sometimes", "--set eval_strategy=sometimes: eval_strategy takes one of no, steps, epoch, not 'sometimes'"),
    ("beta=high", "--set beta=high: DPOConfig's beta takes a float, not 'high'"),
    ("loss_weights=1 x", "--set loss_weights=1 x: DPOConfig's loss_weights takes a list of values separated by spaces, "
                         "each a float, not '1 x'"),
    # the ranges the training arguments accept, and finite numbers (issue 43)
    ("learning_rate=1e400", "--set learning_rate=1e400: learning_rate takes a finite number, not '1e400' (inf)"),
    ("learning_rate=nan", "--set learning_rate=nan: learning_rate takes a finite number, not 'nan'"),
    ("warmup_steps=-1", "--set warmup_steps=-1: warmup_steps takes a number from 0 (steps, or below 1 a fraction of "
                        "the run's steps), not '-1'"),
    ("logging_steps=0", "--set logging_steps=0: logging_steps takes steps (a whole number from 1) or a fraction of the "
                        "run's steps (above 0, below 1), not '0'"),
    ("save_steps=2.5", "--set save_steps=2.5: save_steps takes steps (a whole number from 1) or a fraction of the "
                       "run's steps (above 0, below 1), not '2.5'"),
    ("seed=-1", "--set seed=-1: seed takes a whole number from 0 to 4294967295, not '-1'"),
    ("max_steps=0", "--set max_steps=0: max_steps takes a whole number of steps from 1, or -1 to train for "
                    "num_train_epochs, not '0'"),
    ("per_device_train_batch_size=0", "--set per_device_train_batch_size=0: per_device_train_batch_size takes a whole "
                                      "number from 1, not '0'"),
    ("adam_beta2=1", "--set adam_beta2=1: adam_beta2 takes a number from 0 to below 1, not '1'"),
    ("beta=inf", "--set beta=inf: DPOConfig's beta takes a finite number, not 'inf'"),
    ("loss_weights=1 nan", "--set loss_weights=1 nan: DPOConfig's loss_weights takes a finite number, not '1 nan' "
                           "(nan)"),
])
def test_a_wrong_name_or_value_is_one_sentence_naming_the_flag(checked, line, message):
    with pytest.raises(UsageError) as error:
        checked(overrides("learning_rate=1e-4", line))
    assert str(error.value) == message
    assert error.value.exit_status == 2


def test_an_enum_field_lists_its_choices(checked):
    with pytest.raises(UsageError, match=r"^--set lr_scheduler_type=foo: lr_scheduler_type takes one of linear, cosine, "
                                         r"cosine_with_restarts, .*, not 'foo'$"):
        checked(overrides("lr_scheduler_type=foo"))


def test_a_name_nothing_is_close_to_names_the_configs(checked):
    with pytest.raises(UsageError, match=r"^--set zzzqqq=1: no training argument named zzzqqq \(none of "
                                         r"TrainingArguments, SFTConfig, DPOConfig, GRPOConfig, .* has such a field\)$"):
        checked(overrides("zzzqqq=1"))


def test_a_value_one_config_takes_passes_though_another_refuses_it(checked):
    # loss_type: KTOConfig's choices are kto and apo_zero_unpaired; DPOConfig's is a list of names, CPOConfig's hinge too.
    checked(overrides("loss_type=hinge"))


def test_the_message_can_name_where_the_override_came_from(checked):
    with pytest.raises(UsageError, match="^--suite s.yaml: case a: set bf16=maybe: bf16 takes a bool"):
        checked(overrides("bf16=maybe"), where="--suite s.yaml: case a: set")


TEXTS = ["1", "0", "-1", "2.5", "1e-4", "1e400", "nan", "inf", " 3 ", "true", "False", "YES", "t", "maybe", "", "None",
         "linear", "cosine", "steps", "no", "a b", "1 2", "-x", "0x10", "１"]


def test_the_schema_types_every_field_as_transformers_parser_does():
    # pipeline.py types from the schema without importing transformers: every field of every config, many texts,
    # the same value or the same refusal as HfArgumentParser (a field only it can type says so: NeedsTransformers).
    schema, typed, asked = training_overrides.live_schema(), 0, 0
    for config_class in training_overrides.config_classes():
        for name, field in schema[config_class.__name__].items():
            for text in [*TEXTS, *field.choices[:2]]:
                override = Override(name, text)
                try:
                    expected = training_overrides._typed(config_class, override)
                except training_overrides._ParseError:
                    expected = "refused"
                try:
                    got = training_overrides._typed_from(field, override)
                except training_overrides._ParseError:
                    got = "refused"
                except training_overrides.NeedsTransformers:
                    asked += 1
                    continue
                typed += 1
                if field.kind == "choice" and got != "refused":
                    expected, got = str(getattr(expected, "value", expected)), got  # the choice, by its text
                assert same(got, expected), (config_class.__name__, name, text, got, expected)
    assert typed > 10 * asked  # the schema types nearly everything itself


def same(got, expected):
    if isinstance(got, list) and isinstance(expected, list):
        return len(got) == len(expected) and all(map(same, got, expected))
    if isinstance(got, float) and math.isnan(got):
        return isinstance(expected, float) and math.isnan(expected)
    return got == expected and type(got) is type(expected)


def test_the_schema_is_cached_per_interpreter_and_versions(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(training_overrides, "SHIPPED", tmp_path / "shipped")  # versions the package ships none for
    assert training_overrides.cached_schema() is None
    path = training_overrides.schema_path()
    assert path.parent == tmp_path / "nbddp" / "training-arguments"
    training_overrides.write_schema(training_overrides.live_schema(), path)
    assert training_overrides.cached_schema() == training_overrides.live_schema()
    assert not [entry for entry in path.parent.iterdir() if entry != path]  # no temp file left
    monkeypatch.setattr(training_overrides.importlib.metadata, "version", lambda package: "0.0.0")
    assert training_overrides.schema_path() != path and training_overrides.cached_schema() is None


def test_the_cache_is_where_os_environ_says_when_asked(tmp_path, monkeypatch):
    # A notebook's Dataset.map(num_proc=...) can leave a new mapping in os.environ (datasets 4.8); one bound when
    # the module loaded would put the schema in the user's own cache instead of the XDG_CACHE_HOME set since.
    monkeypatch.setattr(os, "environ", {**os.environ, "XDG_CACHE_HOME": str(tmp_path)})
    assert training_overrides.schema_path().parent == tmp_path / "nbddp" / "training-arguments"


@pytest.mark.parametrize("text", ["", "{not json", "[1, 2]", json.dumps({"TrainingArguments": {"seed": 3}})])
def test_a_damaged_cache_is_no_schema(tmp_path, monkeypatch, text):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(training_overrides, "SHIPPED", tmp_path / "shipped")
    training_overrides.schema_path().parent.mkdir(parents=True)
    training_overrides.schema_path().write_text(text)
    assert training_overrides.cached_schema() is None


def test_the_shipped_schema_is_the_one_built_here():
    # tools/write_shipped_schema.py wrote it from this code; CI runs this on both pinned stacks. Byte for byte: the
    # order of the classes is the order a message names them in.
    if installed_versions() not in [pinned_versions(requirements) for requirements in REQUIREMENTS]:
        pytest.skip(f"{installed_versions()} is neither stack {' nor '.join(REQUIREMENTS)} pins")
    path, fix = training_overrides.shipped_schema_path(), f"run {sys.executable} tools/write_shipped_schema.py"
    assert path.is_file(), f"nbddp ships no schema for this stack: {fix}"
    assert path.read_text(encoding="utf-8") == training_overrides.schema_text(training_overrides.live_schema()), \
        f"{path.name} is not what this stack builds: {fix}"


def test_the_package_ships_a_schema_for_each_pinned_stack_and_no_other():
    # A file's name is its stack_key: python-3.x_transformers-X_trl-Y_..._schema-N.json (Python: where it was built).
    shipped = {path.name.split("_", 1)[1] for path in training_overrides.SHIPPED.glob("*.json")}
    pinned = {"_".join([*(f"{package}-{version}" for package, version in pinned_versions(requirements).items()),
                        f"schema-{training_overrides.SCHEMA_VERSION}.json"]) for requirements in REQUIREMENTS}
    assert shipped == pinned


def test_with_an_empty_cache_the_shipped_schema_is_read(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(training_overrides, "SHIPPED", tmp_path / "shipped")
    training_overrides.write_schema({"TrainingArguments": {"seed": training_overrides.Field("int", "int")}},
                                    training_overrides.shipped_schema_path())
    assert training_overrides.cached_schema() == {"TrainingArguments": {"seed": ("int", "int", (), None)}}
    training_overrides.write_schema({"SFTConfig": {}}, training_overrides.schema_path())
    assert training_overrides.cached_schema() == {"SFTConfig": {}}  # the user's cache first


REQUIREMENTS = ("requirements.txt", "requirements-notebooks.txt")


def pinned_versions(requirements):
    """{package: version} of SCHEMA_PACKAGES, as `requirements` (a file of the repository) pins them."""
    lines = (Path(__file__).resolve().parents[2] / requirements).read_text(encoding="utf-8").splitlines()
    pins = dict(line.split("#")[0].strip().split("==") for line in lines if "==" in line.split("#")[0])
    return {package: pins[package] for package in training_overrides.SCHEMA_PACKAGES}


def installed_versions():
    return {package: importlib.metadata.version(package) for package in training_overrides.SCHEMA_PACKAGES}


def test_a_cache_that_cannot_be_written_is_left_alone(tmp_path):
    (tmp_path / "afile").write_text("")
    training_overrides.write_schema({}, tmp_path / "afile" / "x.json")  # no error: the next check writes it again


def test_the_family_holds_transformers_and_trls_configs():
    names = [config_class.__name__ for config_class in training_overrides.config_classes()]
    assert names[:6] == ["TrainingArguments", "SFTConfig", "DPOConfig", "GRPOConfig", "KTOConfig", "RewardConfig"]
    assert {"CPOConfig", "ORPOConfig"} <= set(names)  # from trl.experimental in TRL 1.x


def test_nothing_to_check_imports_nothing():
    # The script reads its flags before setup imports Unsloth, which must come before transformers and trl.
    code = ("import sys; from nbddp.runtime.inputs import training_overrides as t; t.check([]); "
            "t.from_environment({'NBDDP_SET': 'learning_rate=1e-4'}); "
            "print(sorted(m for m in ('torch', 'transformers', 'trl') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


# apply


def test_apply_types_each_value_and_says_what_it_replaced():
    kwargs = {"learning_rate": 2e-4, "max_steps": 60, "output_dir": "outputs"}
    new, notes = apply(TrainingArguments, kwargs, overrides(
        "learning_rate=1e-4", "max_steps=5", "bf16=yes", "lr_scheduler_type=cosine", "eval_strategy=steps"))
    assert new == {"learning_rate": 1e-4, "max_steps": 5, "output_dir": "outputs", "bf16": True,
                   "lr_scheduler_type": "cosine", "eval_strategy": "steps"}
    assert type(new["learning_rate"]) is float and type(new["max_steps"]) is int and new["bf16"] is True
    assert notes == ["learning_rate=0.0001 (the notebook wrote 0.0002)", "max_steps=5 (the notebook wrote 60)",
                     "bf16=True (the notebook left it at its default False)",
                     "lr_scheduler_type='cosine' (the notebook left it at its default 'linear')",
                     "eval_strategy='steps' (the notebook left it at its default 'no')"]
    assert kwargs == {"learning_rate": 2e-4, "max_steps": 60, "output_dir": "outputs"}  # the notebook's, untouched


def test_the_config_built_from_them_holds_the_values():
    new, _ = apply(TrainingArguments, {"output_dir": "outputs", "eval_steps": 5},
                   overrides("learning_rate=3e-4", "lr_scheduler_type=cosine", "eval_strategy=steps",
                             "label_names=labels ids"))
    args = TrainingArguments(**new)
    assert args.learning_rate == 3e-4 and args.lr_scheduler_type is SchedulerType.COSINE
    assert args.eval_strategy is IntervalStrategy.STEPS and args.label_names == ["labels", "ids"]


def test_the_default_named_is_the_config_classs_own():
    _, notes = apply(SFTConfig, {}, overrides("learning_rate=1e-4", "bf16=false"))
    assert notes == ["learning_rate=0.0001 (the notebook left it at its default 2e-05)",
                     "bf16=False (the notebook left it at its default None)"]


def test_overrides_of_fields_the_class_lacks_are_left_for_another_config():
    new, notes = apply(TrainingArguments, {"seed": 1}, overrides("beta=0.5", "max_length=128", "seed=7"))
    assert new == {"seed": 7} and notes == ["seed=7 (the notebook wrote 1)"]
    new, _ = apply(DPOConfig, {}, overrides("beta=0.5", "max_length=128"))
    assert new == {"beta": 0.5, "max_length": 128}


def test_a_value_the_class_itself_refuses_names_the_class():
    with pytest.raises(UsageError, match=r"^--set loss_type=hinge: KTOConfig's loss_type takes one of kto, "
                                         r"apo_zero_unpaired, not 'hinge'$"):
        apply(KTOConfig, {}, overrides("loss_type=hinge"))


def test_no_overrides_no_change():
    assert apply(SFTConfig, {"max_steps": 3}, []) == ({"max_steps": 3}, [])


def test_parsers_are_built_once_per_class():
    assert training_overrides._parser(SFTConfig) is training_overrides._parser(SFTConfig)
    assert training_overrides._parser(SFTConfig) is not training_overrides._parser(TrainingArguments)


def test_a_subclass_hfargumentparser_cannot_read_is_typed_by_its_base():
    @dataclasses.dataclass
    class OwnConfig(TrainingArguments):
        mixed: int | float = 1  # HfArgumentParser refuses a Union of two types

    assert training_overrides._parser(OwnConfig).dataclass_types == [TrainingArguments]
    new, notes = apply(OwnConfig, {}, overrides("learning_rate=1e-3"))
    assert new == {"learning_rate": 1e-3} and notes == ["learning_rate=0.001 (the notebook left it at its default 5e-05)"]
