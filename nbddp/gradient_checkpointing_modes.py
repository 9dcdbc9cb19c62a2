"""The values of the notebooks' `use_gradient_checkpointing`, read here for both rooms that take them: the runtime's
choice from memory (`runtime.memory.gradient_checkpointing`, through `parse_mode`) and the fallback's
`get_peft_model` (`peft_mode`).

The parameter is a string, so that flags (`--use_gradient_checkpointing false`) and papermill carry every value as
typed: "auto", "unsloth", "true" or "false" (their meanings: runtime.memory.gradient_checkpointing); a bool reads as
"true" or "off", as Unsloth's `get_peft_model` takes it.
"""
from nbddp.errors import UsageError

PARAMETER_VALUES = ("auto", "unsloth", "true", "false")


def parse_mode(value) -> str:
    """"auto", "off", "true" or "unsloth" for a parameter value (a string in any case, or a bool)."""
    if isinstance(value, bool):
        return "true" if value else "off"
    word = value.strip().lower() if isinstance(value, str) else None
    if word in ("auto", "unsloth", "true"):
        return word
    if word == "false":
        return "off"
    raise UsageError(f"--use_gradient_checkpointing must be one of {', '.join(PARAMETER_VALUES)}, not {value!r}")


def peft_mode(value) -> str:
    """The mode for a `get_peft_model(use_gradient_checkpointing=value)` call: "off", "true" or "unsloth"."""
    mode = parse_mode(value)
    if mode == "auto":
        raise UsageError(
            "use_gradient_checkpointing='auto' depends on the batch, which get_peft_model does not know: pass "
            "nbddp.runtime.memory.gradient_checkpointing.choose_gradient_checkpointing(...)'s result to get_peft_model "
            "instead"
        )
    return mode
