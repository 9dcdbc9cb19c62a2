"""The instruction and response markers that the hf backend's `train_on_responses_only` masks by.

Unsloth's rules (unsloth_zoo/dataset_utils.py, 2026.10.9), so both backends train on the same tokens:

- `template_markers(tokenizer)`: with no markers given, read them off the chat template. A three-turn conversation
  of sentinel texts is rendered; the response marker is the generation prompt (what `add_generation_prompt` adds),
  the instruction marker the text between an answer and the next question, less the end-of-turn tokens that the
  two gaps share. Each marker must then be found, as tokens, in the tokenized conversation.
- `marker_tokens(text, tokenizer, force_match)`: a marker's ids as a `Marker`: the `core` that must match, and
  `left`/`right` ids taken along where present. Its edges are optional where the text next to them could merge into
  them (a trailing "\\n" with a following newline), provided an added token anchors the core. `force_match=False`
  also probes the marker with newlines and spaces around it and keeps the ids all variants share.

Not carried over: the probes for multimodal templates (an image inside a turn, ERNIE's differing last header).
"""
import dataclasses
import re
from collections import Counter

from nbddp.errors import UsageError

# Texts no template changes (|trim keeps them) and no tokenizer merges with its neighbours' pieces.
PROBE_USER, PROBE_ASSISTANT = "\u2060USERPROBE7q\u2060", "\u2060ASSTPROBE4z\u2060"
EDGE_PROBES = ("\\", "{", "a", "A", "1", "(", ".", "<", "}", ">")


@dataclasses.dataclass(frozen=True)
class Marker:
    """A marker as token ids: `core` must match; the optional `left` and `right` ids around it are taken along."""

    core: tuple
    left: tuple = ()
    right: tuple = ()

    def at(self, ids, index) -> bool:
        """Whether the core starts at `index` of `ids` (a list)."""
        return ids[index] == self.core[0] and tuple(ids[index : index + len(self.core)]) == self.core

    def extend_right(self, ids, end) -> int:
        for token in self.right:
            if end >= len(ids) or ids[end] != token:
                break
            end += 1
        return end

    def extend_left(self, ids, start) -> int:
        for token in reversed(self.left):
            if start < 1 or ids[start - 1] != token:
                break
            start -= 1
        return start


@dataclasses.dataclass(frozen=True)
class TurnEnds:
    """What else ends an answer: the EOS token (trained on), the BOS token, and `opener`, the special tokens that
    open every turn (Llama 3's <|start_header_id|>, ChatML's <|im_start|>: a tool or system turn ends it too)."""

    eos_id: int | None
    bos_id: int | None
    opener: tuple = ()


def turn_ends(tokenizer, instruction: Marker, response: Marker) -> TurnEnds:
    """The `TurnEnds` of `tokenizer`; the opener is the markers' shared start, where it is all special tokens."""
    opener = []
    for a, b in zip(instruction.core, response.core):
        if a != b:
            break
        opener.append(a)
    added = tokenizer.added_tokens_decoder
    special = {i for i, token in added.items() if token.special} | set(tokenizer.all_special_ids)
    if not all(i in special for i in opener) or not any(i in added and added[i].content.strip() for i in opener):
        opener = []
    return TurnEnds(tokenizer.eos_token_id, tokenizer.bos_token_id, tuple(opener))


def marker_tokens(text: str, tokenizer, force_match=True) -> Marker:
    """`text`'s ids as a `Marker` (an empty core where none can be found)."""
    encode = lambda piece: tokenizer(piece, add_special_tokens=False)["input_ids"]  # noqa: E731
    original = encode(text)
    if force_match:
        core = original
    else:
        left_text = " " if text.startswith(" ") else "\n" if text.startswith("\n") else ""
        right_text = " " if text.endswith(" ") else "\n" if text.endswith("\n") else ""
        stripped = text.strip()
        variants = []
        for left in range(3):
            for right in range(3):
                variants.append(encode(left * left_text + stripped + right * right_text))
                variants.append(encode(left * "\n" + stripped + right * "\n"))
        core = _shared_core(variants)
    where = next((i for i in range(len(original)) if original[i : i + len(core)] == core), None) if core else None
    if where is None:
        return Marker(())
    start, end = _stable_edges(text, original, encode)
    new_start, new_end = max(where, start), min(where + len(core), end)
    if new_end > new_start and (new_start, new_end) != (where, where + len(core)):
        added = tokenizer.added_tokens_decoder
        if any(str(added.get(i, "")).strip() for i in original[new_start:new_end]):
            return Marker(tuple(original[new_start:new_end]), tuple(original[:new_start]), tuple(original[new_end:]))
    return Marker(tuple(core), tuple(original[:where]), tuple(original[where + len(core) :]))


def _shared_core(variants: list[list[int]]) -> list[int]:
    """Unsloth's core of `force_match=False`: the longest id run that every variant (plus a trailing 0) contains,
    or the variants' one tokenization where they agree and it is that run less the 0."""
    padded = [ids + [0] for ids in variants]
    core = []
    for length in range(min(map(len, padded)), 0, -1):
        runs = set.intersection(*({tuple(ids[i : i + length]) for i in range(len(ids) - length + 1)} for ids in padded))
        if runs:
            core = list(min(runs))
            break
    if core == [0] and len(variants[0]) == 1 and all(variants[0][0] in ids for ids in variants):
        return variants[0]  # a marker that is one token ([INST]) is its own core
    if len({str(ids) for ids in variants}) == 1 and core == variants[0] + [0]:
        return variants[0]  # a template without whitespace around its markers (Phi-4)
    return core


def _stable_edges(text: str, original: list[int], encode) -> tuple[int, int]:
    """(start, end): the span of `original` whose ids stay the same whatever text comes right before or after."""
    start, end = 0, len(original)
    for probe in EDGE_PROBES:
        right = encode(text + probe)
        k = 0
        while k < min(len(original), len(right)) and right[k] == original[k]:
            k += 1
        end = min(end, k)
        left = encode(probe + text)
        k = 0
        while k < min(len(original), len(left)) and left[-1 - k] == original[-1 - k]:
            k += 1
        start = max(start, len(original) - k)
    return start, end


def template_markers(tokenizer) -> tuple[str, str]:
    """(instruction_part, response_part) read off `tokenizer.chat_template`; UsageError where it cannot be done."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise UsageError("train_on_responses_only: the tokenizer has no chat_template to read the markers from; "
                         "pass instruction_part and response_part")
    render = lambda messages, generation: tokenizer.apply_chat_template(  # noqa: E731
        messages, tokenize=False, add_generation_prompt=generation)
    specials = sorted({str(token) for token in [*tokenizer.all_special_tokens, *tokenizer.get_added_vocab()] if token},
                      key=len, reverse=True)
    eos, bos = tokenizer.eos_token or "", tokenizer.bos_token or ""

    def strip_lead(text, *prefixes):
        changed = True
        while changed:
            changed = False
            for prefix in prefixes:
                if prefix and text.startswith(prefix):
                    text, changed = text[len(prefix) :], True
        return text

    def strip_shared(a, b):  # drop the whitespace and special tokens both start with
        while True:
            space_a, space_b = re.match(r"\s+", a), re.match(r"\s+", b)
            if space_a and space_b and space_a.group() == space_b.group():
                a, b = a[space_a.end() :], b[space_b.end() :]
                continue
            token = next((special for special in specials if a.startswith(special)), None)
            if token and b.startswith(token):
                a, b = a[len(token) :], b[len(token) :]
                continue
            return a, b

    conversation, full = _render_probe(render)
    starts = lambda text, needle: [m.start() for m in re.finditer(re.escape(needle), text)]  # noqa: E731
    ends = lambda text, needle: [m.end() for m in re.finditer(re.escape(needle), text)]  # noqa: E731

    def gap(from_ends, to_starts):  # the most common text between the end of one kind of turn and the next other
        gaps = [full[end : min(start for start in to_starts if start >= end)]
                for end in from_ends if any(start >= end for start in to_starts)]
        return Counter(gaps).most_common(1)[0][0] if gaps else ""

    instruction_gap = gap(ends(full, PROBE_ASSISTANT), starts(full, PROBE_USER))
    response_gap = gap(ends(full, PROBE_USER), starts(full, PROBE_ASSISTANT))
    # The generation prompt, after the last user turn; a template without one (Mistral's [INST]) has none.
    tail = lambda text: text[text.rfind(PROBE_USER) + len(PROBE_USER) :] if PROBE_USER in text else ""  # noqa: E731
    prompted, unprompted = render(conversation[:-1], True), render(conversation[:-1], False)
    header = "" if prompted == unprompted else strip_shared(tail(prompted), tail(unprompted))[0]
    if header and response_gap.endswith(header) and len(header) < len(response_gap):
        # Llama, Gemma, Qwen, Phi-4: the response gap is the turn's end, then the header.
        response_part = header
        instruction_part = strip_lead(instruction_gap, response_gap[: -len(header)])
    elif header and header == response_gap:  # Phi-3: the end of the turn came with the header
        response_part, instruction_part = strip_shared(header, instruction_gap)
        instruction_part = strip_lead(instruction_part, " ", "\t", eos, bos)
    else:  # no header: the gaps themselves, less separators
        response_part = strip_lead(response_gap, " ", "\t", eos, bos)
        instruction_part = strip_lead(instruction_gap, " ", "\t", eos, bos)
    response_part = _without_reasoning_scaffold(response_part, render)
    instruction_part = strip_lead(instruction_part, " ", "\t").rstrip(" \t")
    response_part = strip_lead(response_part, " ", "\t").rstrip(" \t")
    if not instruction_part or not response_part:
        raise UsageError("train_on_responses_only: reading the chat template gave an empty marker; "
                         "pass instruction_part and response_part")
    probe_ids = tokenizer(full, add_special_tokens=False)["input_ids"]
    return _found_in(instruction_part, "instruction_part", probe_ids, tokenizer), \
        _found_in(response_part, "response_part", probe_ids, tokenizer)


def _render_probe(render) -> tuple[list, str]:
    """Three user/assistant turns of sentinel texts, as plain strings or as text parts (what renders them)."""
    as_text = lambda text: text  # noqa: E731
    as_parts = lambda text: [{"type": "text", "text": text}]  # noqa: E731
    for user, assistant in ((as_text, as_text), (as_parts, as_parts), (as_parts, as_text)):
        conversation = [{"role": "user", "content": user(PROBE_USER)},
                        {"role": "assistant", "content": assistant(PROBE_ASSISTANT)}] * 3
        try:
            full = render(conversation, False)
        except Exception:  # a template refuses this content shape: try the next
            continue
        if PROBE_USER in full and PROBE_ASSISTANT in full:
            return conversation, full
    raise UsageError("train_on_responses_only: the chat template did not render a test conversation; "
                     "pass instruction_part and response_part")


def _without_reasoning_scaffold(response_part: str, render) -> str:
    """The response marker less an empty thinking block that the generation prompt adds but a real answer lacks
    ("<|im_start|>assistant\\n<think>\\n\\n</think>" of Qwen3-Thinking, "<|assistant|></think>" of GLM-4)."""
    match = re.search(r"<([^\s/>]+)>\s*</\1>\s*$", response_part) or re.search(r"</([^\s/>]+)>\s*$", response_part)
    if not match or match.start() == 0:
        return response_part
    tag, header, scaffold = match.group(1), response_part[: match.start()], response_part[match.start() :]
    try:
        filled = render([{"role": "user", "content": PROBE_USER},
                         {"role": "assistant", "content": f"<{tag}>rZ9</{tag}>{PROBE_ASSISTANT}"}], False)
    except Exception:
        return response_part
    where = filled.rfind(header)
    return header if where != -1 and not filled[where + len(header) :].startswith(scaffold) else response_part


def _found_in(part: str, name: str, probe_ids: list[int], tokenizer) -> str:
    """`part`, or its variant with a leading space or newline, that the probe's ids contain twice (else once)."""
    def count(candidate):
        core = list(marker_tokens(candidate, tokenizer).core)
        return sum(probe_ids[i : i + len(core)] == core for i in range(len(probe_ids) - len(core) + 1)) if core else 0

    counts = [(candidate, count(candidate)) for candidate in (part, " " + part, "\n" + part)]
    for candidate, matches in counts:
        if matches >= 2:
            return candidate
    for candidate, matches in counts[:2]:
        if matches >= 1:
            return candidate
    raise UsageError(f"train_on_responses_only: {name} read from the chat template ({part!r}) is not found in its "
                     "tokenized test conversation; pass instruction_part and response_part")
