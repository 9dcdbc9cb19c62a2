"""Statements a rewrite drops: each leaves `# nbddp: dropped <what>` where it was.

A rewrite replaces the dropped line with `dropped_line(...)` (`pass  # nbddp: dropped <what>`) and, on leaving
each block and the module, calls `comment_out`: where the block has other statements the `pass` lines become
plain comment lines; a block of dropped lines only keeps them, as Python needs a statement there.
"""
import libcst as cst

DROPPED = "# nbddp: dropped "


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
    `keep_statement`: a body of dropped lines only is left as it is (an indented block needs a statement)."""

    def is_dropped(statement):
        return any(statement is line for line in dropped)

    if keep_statement and all(is_dropped(statement) for statement in body):
        return body, footer
    kept, comments = [], []
    for statement in body:
        if is_dropped(statement):
            comment = statement.trailing_whitespace.comment
            comments += [*statement.leading_lines, cst.EmptyLine(comment=comment)]
        else:
            kept.append(statement.with_changes(leading_lines=[*comments, *statement.leading_lines]))
            comments = []
    return kept, [*comments, *footer]
