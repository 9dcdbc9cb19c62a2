"""Statements a rewrite drops: each leaves `# nbddp: dropped <what>` where it was.

A rewrite replaces the dropped line with `dropped_line(...)` (`pass  # nbddp: dropped <what>`) and, on leaving
each block and the module, calls `comment_out`: where the block has other statements the `pass` lines become
plain comment lines; a block of dropped lines only keeps one `pass` for them all, as Python needs a statement there
(`pass  # nbddp: dropped 3 lines: !pip install a; !pip install b; ...`). A comment that makes its line longer than
120 characters is cut short when the cell is done (`shorten_comments`), once its final indentation is known.
"""
import re

import libcst as cst

DROPPED = "# nbddp: dropped "
WIDTH = 120  # the longest line nbddp writes
_DROPPED_LINE = re.compile(rf"\s*(pass  )?{DROPPED}")  # the two lines this module writes


def dropped_line(line: cst.SimpleStatementLine, what: str) -> cst.SimpleStatementLine:
    """`pass  # nbddp: dropped <what>`, with the comments that stood above `line`."""
    return cst.SimpleStatementLine(
        body=[cst.Pass()],
        leading_lines=line.leading_lines,
        trailing_whitespace=cst.TrailingWhitespace(
            whitespace=cst.SimpleWhitespace("  "), comment=cst.Comment(DROPPED + what)
        ),
    )


def comment_out(body, footer, dropped, keep_statement):
    """`body` and `footer` with the `dropped` lines (the very nodes `dropped_line` made) turned into comments;
    `keep_statement`: a body of dropped lines only becomes one of them, saying what they all were (an indented block
    needs a statement), with the comments that stood above each."""

    def is_dropped(statement):
        return any(statement is line for line in dropped)

    if keep_statement and all(is_dropped(statement) for statement in body):
        return ([body[0]] if len(body) == 1 else [_one_line(body)]), footer
    kept, comments = [], []
    for statement in body:
        if is_dropped(statement):
            comment = statement.trailing_whitespace.comment
            comments += [*statement.leading_lines, cst.EmptyLine(comment=comment)]
        else:
            kept.append(statement.with_changes(leading_lines=[*comments, *statement.leading_lines]))
            comments = []
    return kept, [*comments, *footer]


def _one_line(lines):
    """One `pass  # nbddp: dropped N lines: a; b; ...` for the dropped `lines`, below all their comments."""
    what = "; ".join(line.trailing_whitespace.comment.value.removeprefix(DROPPED) for line in lines)
    comment = cst.Comment(f"{DROPPED}{len(lines)} lines: {what}")
    first = lines[0]
    return first.with_changes(
        leading_lines=[empty for line in lines for empty in line.leading_lines],
        trailing_whitespace=first.trailing_whitespace.with_changes(comment=comment),
    )


def shorten_comments(code: str) -> str:
    """`code` with each `# nbddp: dropped ...` comment that makes its line longer than WIDTH cut at a word, `…`
    marking the cut (what was dropped is in the export report and the notebook)."""
    lines = []
    for line in code.split("\n"):
        dropped = _DROPPED_LINE.match(line)
        if len(line) > WIDTH and dropped:
            head = line[: WIDTH - 2]
            cut = head.rfind(" ")
            line = (head[:cut] if cut > dropped.end() else head) + " …"
        lines.append(line)
    return "\n".join(lines)
