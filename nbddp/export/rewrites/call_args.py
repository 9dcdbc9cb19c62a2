"""Reading and editing a call's arguments, keeping the author's layout (one per line, trailing comma, comments)."""
import ast

import libcst as cst

NOT_A_LITERAL = object()
_NO_SPACES = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))


def code_of(node: cst.CSTNode) -> str:
    """The source text of `node`, as written."""
    return cst.Module([]).code_for_node(node)


def literal_value(node: cst.BaseExpression):
    """The value of a literal (`"auto"`, `0`, `{"": 0}`, `None`), or NOT_A_LITERAL for any other expression."""
    try:
        return ast.literal_eval(code_of(node))
    except (ValueError, SyntaxError):
        return NOT_A_LITERAL


def callee_name(call: cst.Call) -> str | None:
    """`f` for `f(...)`, `g` for `a.b.g(...)`; None for anything else (`f()(...)`, `x[0](...)`)."""
    if isinstance(call.func, cst.Name):
        return call.func.value
    if isinstance(call.func, cst.Attribute):
        return call.func.attr.value
    return None


def receiver_name(call: cst.Call) -> str | None:
    """`A` for `A.f(...)` and `m.A.f(...)`; None when the receiver is not a name or attribute."""
    if not isinstance(call.func, cst.Attribute):
        return None
    receiver = call.func.value
    if isinstance(receiver, cst.Name):
        return receiver.value
    if isinstance(receiver, cst.Attribute):
        return receiver.attr.value
    return None


def keyword(call: cst.Call, name: str) -> cst.Arg | None:
    return next((arg for arg in call.args if arg.keyword is not None and arg.keyword.value == name), None)


def has_double_star(call: cst.Call) -> bool:
    """`f(**options)`: the call may set any keyword we cannot see."""
    return any(arg.star == "**" for arg in call.args)


def set_keyword_value(call: cst.Call, name: str, value: cst.BaseExpression) -> cst.Call:
    return call.with_changes(
        args=[arg.with_changes(value=value) if arg is keyword(call, name) else arg for arg in call.args]
    )


def append_keyword(call: cst.Call, name: str, value: cst.BaseExpression) -> cst.Call:
    """`call` with `name=value` added last, laid out like the arguments already there: spaced around `=` as its last
    keyword argument is (Unsloth's notebooks write `load_in_4bit = True`), PEP 8's `name=value` without one."""
    equals = [code_of(arg.equal) for arg in call.args if isinstance(arg.equal, cst.AssignEqual)]
    spaced = equals[-1:] == [" = "]
    new = cst.Arg(keyword=cst.Name(name), value=value, equal=cst.AssignEqual() if spaced else _NO_SPACES)
    if not call.args:
        return call.with_changes(args=[new])
    *others, last = call.args
    between = _separator(call)
    has_comma = isinstance(last.comma, cst.Comma)
    closing = last.comma.whitespace_after if has_comma else last.whitespace_after_arg  # before ")"
    if isinstance(closing, cst.ParenthesizedWhitespace) and isinstance(between, cst.ParenthesizedWhitespace):
        # One argument per line: the old last line keeps its comment, the new line closes the call.
        last_comma = cst.Comma(
            whitespace_before=last.comma.whitespace_before if has_comma else cst.SimpleWhitespace(""),
            whitespace_after=closing.with_changes(indent=between.indent, last_line=between.last_line),
        )
        new_closing = cst.ParenthesizedWhitespace(indent=closing.indent, last_line=closing.last_line)
    else:
        last_comma = cst.Comma(whitespace_after=between)
        new_closing = closing
    last = last.with_changes(comma=last_comma, whitespace_after_arg=cst.SimpleWhitespace(""))
    if has_comma:
        new = new.with_changes(comma=cst.Comma(whitespace_after=new_closing))
    else:
        new = new.with_changes(whitespace_after_arg=new_closing)
    return call.with_changes(args=[*others, last, new])


def _separator(call: cst.Call):
    """The whitespace after a comma between two arguments of `call`, without any comment."""
    if len(call.args) >= 2 and isinstance(call.args[0].comma, cst.Comma):
        between = call.args[0].comma.whitespace_after
    else:
        between = call.whitespace_before_args
    if isinstance(between, cst.ParenthesizedWhitespace):
        return between.with_changes(first_line=cst.TrailingWhitespace(), empty_lines=[])
    return cst.SimpleWhitespace(" ")
