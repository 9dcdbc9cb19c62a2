"""The hf backend's `unsloth.chat_templates`: `train_on_responses_only`, so the loss counts only the answers.

    from unsloth.chat_templates import train_on_responses_only
    trainer = train_on_responses_only(
        trainer,
        instruction_part="<|start_header_id|>user<|end_header_id|>\\n\\n",
        response_part="<|start_header_id|>assistant<|end_header_id|>\\n\\n",
    )

It does what Unsloth's (unsloth_zoo/dataset_utils.py) does with its default `force_match=True`: each marker is
tokenized on its own, and in every row of the trainer's tokenized datasets the labels are the tokens from just after a
response marker up to the next instruction marker (or the end of the row), -100 elsewhere. Rows left with no label
are dropped, since their loss would be 0/0. TRL's collator pads a `labels` column as it is, so the collator stays.

Not carried over from Unsloth, which would make this a port rather than a fallback: reading the markers from the chat
template when none are given, the fuzzy matching of `force_match=False` (newline and space variants of the markers),
datasets that the trainer left untokenized, and vision collators. `get_chat_template` (Unsloth's table of chat
templates, with its token remapping) and the dataset converters are not here either; importing one is bad input
that says what to do instead (set `tokenizer.chat_template`, or use the unsloth backend on a GPU).
"""
import warnings

from nbddp.errors import UsageError

# The rest of `unsloth.chat_templates`' public names.
UNSLOTH_ONLY = ("get_chat_template", "standardize_sharegpt", "standardize_data_formats", "to_sharegpt",
                "apply_chat_template", "remove_special_tokens", "test_chat_templates", "test_hf_gguf_equivalence",
                "test_construct_chat_template")


def __getattr__(name):
    # `from unsloth.chat_templates import get_chat_template` ends here (PEP 562); an error other than
    # AttributeError reaches the user as it is, instead of Python's bare "cannot import name".
    if name in UNSLOTH_ONLY:
        raise UsageError(
            f"unsloth.chat_templates.{name} is Unsloth's; nbddp's Transformers+PEFT fallback (--backend hf) has only "
            "train_on_responses_only. Set tokenizer.chat_template to the template's Jinja text (a model's tokenizer "
            "may already have one), or run on a GPU with Unsloth installed (--backend unsloth)")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

IGNORE_INDEX = -100  # the label that cross-entropy skips


def train_on_responses_only(
    trainer,
    instruction_part=None,
    response_part=None,
    force_match=True,
    tokenizer=None,
    return_function=False,
    num_proc=None,
    last_response_only=False,
):
    """Mask everything but the responses in `trainer`'s datasets; returns `trainer` (or, if asked, the batch function)."""
    if instruction_part is None or response_part is None:
        raise ValueError(
            "train_on_responses_only needs both instruction_part and response_part on the hf backend "
            "(Unsloth can guess them from the chat template; this fallback cannot)"
        )
    if not force_match:
        warnings.warn("train_on_responses_only(force_match=False): the hf backend matches the markers exactly", stacklevel=2)
    tokenizer = tokenizer or trainer.processing_class
    instruction_ids = _marker_ids(tokenizer, instruction_part, "instruction_part")
    response_ids = _marker_ids(tokenizer, response_part, "response_part")

    def add_response_labels(batch):
        old_labels = batch["labels"] if "labels" in batch else batch["input_ids"]
        return {
            "labels": [
                response_labels(ids, labels, instruction_ids, response_ids, last_response_only)
                for ids, labels in zip(batch["input_ids"], old_labels)
            ]
        }

    if return_function:
        return add_response_labels

    def relabel(dataset, name):
        dataset = dataset.map(add_response_labels, batched=True, num_proc=num_proc)
        kept = dataset.filter(lambda row: any(label != IGNORE_INDEX for label in row["labels"]), num_proc=num_proc)
        if len(kept) == 0:
            raise ValueError(f"train_on_responses_only: no row of {name} contains response_part {response_part!r}")
        if len(kept) < len(dataset):
            print(f"nbddp: dropped {len(dataset) - len(kept)} of {len(dataset)} rows of {name} with no response to train on")
        return kept

    trainer.train_dataset = relabel(trainer.train_dataset, "train_dataset")
    if isinstance(trainer.eval_dataset, dict):
        trainer.eval_dataset = {key: relabel(split, f"eval_dataset[{key!r}]") for key, split in trainer.eval_dataset.items()}
    elif trainer.eval_dataset is not None:
        trainer.eval_dataset = relabel(trainer.eval_dataset, "eval_dataset")
    return trainer


def response_labels(input_ids, labels, instruction_ids, response_ids, last_response_only=False) -> list[int]:
    """`labels` where they follow a response marker, up to the next instruction marker; IGNORE_INDEX elsewhere."""
    spans = []
    marker = _find(input_ids, response_ids, 0)
    while marker is not None:
        start = marker + len(response_ids)
        end = _find(input_ids, instruction_ids, start)
        end = len(input_ids) if end is None else end
        spans.append((start, end))
        marker = _find(input_ids, response_ids, end)
    masked = [IGNORE_INDEX] * len(input_ids)
    for start, end in spans[-1:] if last_response_only else spans:
        masked[start:end] = labels[start:end]
    return masked


def _marker_ids(tokenizer, text: str, name: str) -> list[int]:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if not ids:
        raise ValueError(f"train_on_responses_only: {name} {text!r} tokenizes to nothing")
    return ids


def _find(ids, marker, start: int) -> int | None:
    """The first index from `start` where `marker` begins in `ids`, or None."""
    for index in range(start, len(ids) - len(marker) + 1):
        if list(ids[index : index + len(marker)]) == marker:
            return index
    return None
