"""Write nbddp/runtime/inputs/schemas/<stack key>.json: the training arguments' schema that `pipeline.py` checks
`--set` lines with, for the stack installed in the interpreter that runs this script.

The package ships one for each stack the project pins, so that a first `--set` check there starts no child process
importing transformers (training_overrides.cached_schema). After changing a pin (or the schema's code), run it with
each stack's interpreter and commit the files:

    .venv/bin/python tools/write_shipped_schema.py       # requirements.txt
    .venv-nb/bin/python tools/write_shipped_schema.py    # requirements-notebooks.txt

tests/runtime/test_training_overrides.py fails while the installed stack's file differs from a freshly built schema.
A file for a stack no longer pinned is left for you to delete.
"""
from nbddp.runtime.inputs import training_overrides


def main() -> None:
    path = training_overrides.shipped_schema_path()
    path.parent.mkdir(exist_ok=True)
    path.write_text(training_overrides.schema_text(training_overrides.live_schema()), encoding="utf-8")
    print(path)


if __name__ == "__main__":
    main()
