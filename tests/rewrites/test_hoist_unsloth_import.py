from rewrite_case import assert_rewrites, assert_unchanged

from nbddp.export.rewrites.hoist_unsloth_import import HoistUnslothImport


def test_unsloth_import_moves_above_the_first_patched_import():
    changes = assert_rewrites(
        HoistUnslothImport,
        """\
        import torch
        # training libraries
        from transformers import TrainingArguments
        from trl import SFTTrainer
        # fast kernels
        from unsloth import FastLanguageModel, is_bfloat16_supported  # keep me
        x = 1
        """,
        """\
        import torch
        # training libraries
        # fast kernels
        from unsloth import FastLanguageModel, is_bfloat16_supported  # keep me
        from transformers import TrainingArguments
        from trl import SFTTrainer
        x = 1
        """,
    )
    assert changes == [(6, "moved the unsloth import above the first transformers/trl/peft one")]


def test_every_late_unsloth_import_moves_in_order():
    changes = assert_rewrites(
        HoistUnslothImport,
        """\
        import peft.tuners
        import unsloth
        import transformers as tf
        from unsloth.chat_templates import get_chat_template
        """,
        """\
        import unsloth
        from unsloth.chat_templates import get_chat_template
        import peft.tuners
        import transformers as tf
        """,
    )
    assert [line for line, _ in changes] == [2, 4]


def test_nothing_to_do_when_unsloth_comes_first_or_alone():
    assert_unchanged(HoistUnslothImport, "from unsloth import FastModel\nfrom trl import SFTTrainer\n")
    assert_unchanged(HoistUnslothImport, "from trl import SFTTrainer\nimport torch\n")
    assert_unchanged(HoistUnslothImport, "from unsloth import FastModel\n")


def test_nested_or_mixed_lines_are_left_alone():
    # Only whole top-level lines that import nothing but unsloth are moved.
    assert_unchanged(
        HoistUnslothImport,
        """\
        import trl
        x = 1; import unsloth
        if True:
            import unsloth
        """,
    )
