"""nbddp's functions stay short enough to read at once: none is longer than 80 lines (issue 39's limit; the
longest had been `construct_chat_template`'s 109)."""
import ast
from pathlib import Path

NBDDP = Path(__file__).resolve().parent.parent / "nbddp"
LONGEST = 80


def test_no_function_is_longer_than_80_lines():
    long = []
    for path in sorted(NBDDP.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([node.lineno, *(decorator.lineno for decorator in node.decorator_list)])
                if node.end_lineno - start + 1 > LONGEST:
                    long.append(f"{path.relative_to(NBDDP.parent)}:{node.lineno}: {node.name}, "
                                f"{node.end_lineno - start + 1} lines")
    assert long == []
