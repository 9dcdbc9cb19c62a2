"""The export report names what export could not make DDP-safe at its cell and line, and counts it apart."""
from rewrite_case import LOCATION

from nbddp.export.report import ExportReport
from nbddp.export.rewrites import apply

CELL = """\
%%time
Settings.llm = OpenAI(model = "gpt-4o")
for batch in batches:
    model(**batch).loss.backward()
    optimizer.step()
server = subprocess.Popen(["ollama", "serve"])
"""


def test_warnings_are_report_lines_at_the_authors_line_and_counted_apart_from_rewrites():
    _, changes = apply(CELL, LOCATION)
    report = ExportReport(entries=changes, notebooks=1, cells=1)
    lines = report.text("generated/train.py").splitlines()
    assert [line.split(" warning:")[0] for line in lines if "] warning:" in line] == [
        "notebooks/02_train.ipynb, cell 4, line 2: [warn-remote-generation]",
        "notebooks/02_train.ipynb, cell 4, line 4: [warn-own-training-loop]",
    ]
    assert any(line.startswith("notebooks/02_train.ipynb, cell 4, line 6: [start-processes-once]") for line in lines)
    assert lines[-1] == (f"wrote generated/train.py from 1 notebooks: 1 cells, {len(changes) - 2} rewrites, "
                         "2 warnings (the lines marked warning: above)")
