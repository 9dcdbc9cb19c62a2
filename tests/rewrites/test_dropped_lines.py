"""shorten_comments: a `# nbddp: dropped ...` comment never makes its line longer than 120 characters."""
from nbddp.export.rewrites.dropped_lines import WIDTH, shorten_comments

PIP = ("!pip install --no-deps bitsandbytes accelerate xformers==0.0.29.post3 peft trl triton cut_cross_entropy "
       "unsloth_zoo")


def test_a_long_dropped_comment_is_cut_at_a_word_within_120_characters():
    code = f"if x:\n    pass  # nbddp: dropped {PIP}\n# nbddp: dropped 2 lines: {PIP}; !pip install unsloth"
    lines = shorten_comments(code).splitlines()
    assert lines[0] == "if x:"
    assert lines[1] == "    pass  # nbddp: dropped !pip install --no-deps bitsandbytes accelerate xformers==0.0.29.post3 peft trl triton …"
    assert lines[2].startswith("# nbddp: dropped 2 lines: !pip install") and lines[2].endswith(" …")
    assert all(len(line) <= WIDTH for line in lines)


def test_short_lines_and_the_authors_own_lines_are_left_as_they_are():
    authors = 'message = "' + "x" * 100 + ' # nbddp: dropped ' + "y" * 20 + '"'  # the marker inside a string
    code = f"pass  # nbddp: dropped !pip install a\n{authors}\n    # nbddp: dropped %matplotlib inline"
    assert shorten_comments(code) == code
