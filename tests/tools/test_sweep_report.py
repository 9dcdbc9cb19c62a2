"""tools/sweep_report.py: the first error of a failing command, and the tables the sweep prints and writes."""
import json

from tools.sweep_report import (Outcome, after_failed_download, cause, counts, first_error, limit, markdown, merge, read,
                                table, write)

ORIGIN = "nbddp: ../out/train.py line {line} comes from /w/X/01_nb.ipynb, cell {cell}, line 3"


def rank(number, text):
    return "".join(f"[rank {number}] {line}\n" for line in text.splitlines())


def traceback(exception, cell):
    return (f'Traceback (most recent call last):\n  File "/w/X/out/train.py", line 40, in <module>\n'
            f'    x = f()\n{exception}\n{ORIGIN.format(line=40, cell=cell)}')


def test_nbddp_paragraph_first_line_with_its_cell():
    stderr = ("nbddp: backend=hf (requested) world_size=2 device=cpu\n"
              + rank(0, "nbddp: error: unsloth.chat_templates.get_chat_template is Unsloth's; set "
                        "tokenizer.chat_template\n  " + ORIGIN.format(line=88, cell=12).removeprefix("nbddp: ")))
    assert first_error(stderr) == ("unsloth.chat_templates.get_chat_template is Unsloth's; set "
                                   "tokenizer.chat_template [01_nb.ipynb, cell 12, line 3]")


def test_exception_of_the_rank_that_failed_not_of_the_one_that_lost_it():
    stderr = (rank(1, traceback("RuntimeError: [gloo/pair.cc:553] Connection closed by peer [127.0.0.1]:13703", 30))
              + rank(0, "Traceback (most recent call last):\n  ...\nKeyError: 'shape'\n\nDuring handling of the "
                        "above exception, another exception occurred:\n\n" + traceback("AttributeError", 29))
              + "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
              + "  traceback : " + rank(0, traceback("AttributeError", 29)).lstrip())
    assert first_error(stderr) == "AttributeError [01_nb.ipynb, cell 29, line 3]"


def test_export_error_first_line():
    stderr = ("error: /w/X/01_nb.ipynb, cell 9, line 2: syntax error: f-string: expecting '}'\n"
              "  hint: a newer Python's grammar accepts this cell\n")
    assert first_error(stderr) == "/w/X/01_nb.ipynb, cell 9, line 2: syntax error: f-string: expecting '}'"


def test_without_nbddp_lines_the_last_exception_line_then_the_last_line():
    stderr = 'File "train.py", line 3\n    x = (\n        ^\nSyntaxError: \'(\' was never closed\n'
    assert first_error(stderr) == "SyntaxError: '(' was never closed"
    assert first_error("starting\nKilled\n") == "Killed"
    assert first_error("") == "no output"


def test_an_assertion_error_shows_what_was_asserted():
    asserted = ('Traceback (most recent call last):\n  File "/w/X/out/train.py", line 89, in <module>\n'
                '    assert transformers.__version__ == "5.15.0", transformers.__version__\n'
                "           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\nAssertionError: 4.56.2\n")
    expected = 'AssertionError: 4.56.2 (`assert transformers.__version__ == "5.15.0", transformers.__version__`)'
    assert first_error(rank(1, asserted + ORIGIN.format(line=89, cell=7))) == expected + " [01_nb.ipynb, cell 7, line 3]"
    assert first_error(asserted) == expected
    assert first_error(traceback("AssertionError: 4.56.2", 7)) == "AssertionError: 4.56.2 [01_nb.ipynb, cell 7, line 3]"


def test_a_long_error_is_cut():
    assert len(first_error("ValueError: " + "x" * 1000)) == 300


def outcomes():
    return [Outcome("A-Alpaca", "alpaca-sft", True, True, True, True, seconds=9.4),
            Outcome("B-Alpaca", "alpaca-sft", True, True, True, False, "run", "KeyError: 0 [01_nb.ipynb, cell 3, line 1]"),
            Outcome("C-GRPO", "grpo", True, True, True, False, "run", "KeyError: 0 [01_nb.ipynb, cell 7, line 2]"),
            Outcome("D-TTS", "audio", False, stage="export", error="01_nb.ipynb, cell 2, line 1: unknown magic"),
            Outcome("E-GRPO", "grpo", True, True, True, False, "run",
                    "ModuleNotFoundError: No module named 'vllm' [01_nb.ipynb, cell 4, line 1]")]


def test_counts_per_category_in_order_then_all():
    assert counts(outcomes()) == {
        "alpaca-sft": {"notebooks": 2, "exported": 2, "compiled": 2, "ran": 2, "passed": 1, "limited": 0},
        "grpo": {"notebooks": 2, "exported": 2, "compiled": 2, "ran": 2, "passed": 0, "limited": 1},
        "audio": {"notebooks": 1, "exported": 0, "compiled": 0, "ran": 0, "passed": 0, "limited": 0},
        "all": {"notebooks": 5, "exported": 4, "compiled": 4, "ran": 4, "passed": 1, "limited": 1}}


def test_limit_names_what_the_sandbox_lacks_and_nothing_for_nbddps_own_failures():
    assert limit("ModuleNotFoundError: No module named 'vllm'") == "a package outside the tested stacks"
    assert limit("huggingface_hub.errors.LocalEntryNotFoundError: Cannot find ...") == "the network (a hub or web download)"
    assert limit("RuntimeError: sglang needs an NVIDIA GPU, and this session has none.") == "a GPU"
    assert limit("ImportError: To support decoding audio data, please install 'torchcodec'. "  # Whisper.ipynb's
                 "[01_nb.ipynb, cell 10, line 26]") == "an audio decoder"
    assert limit("FileNotFoundError: [Errno 2] No such file or directory: 'ollama' [01_nb.ipynb, cell 44, line 6]") \
        == "the network (a hub or web download)"  # installed by the notebook from ollama.com
    assert limit('AssertionError: 5.17.0 (`assert transformers.__version__ == "5.15.0", transformers.__version__`) '
                 "[01_nb.ipynb, cell 8, line 6]") == "transformers 5.15.0 (the exact version the notebook asserts)"
    assert limit("nbddp.errors.UsageError: unsloth.dataprep.SyntheticDataKit serves the model with vLLM (a CUDA GPU) to "
                 "generate question-answer pairs ...") == "a GPU"  # the fallback's refusal (fallback/dataprep.py)
    assert limit("AssertionError: expected 3 rows [01_nb.ipynb, cell 8, line 6]") is None
    assert limit("ModuleNotFoundError: No module named 'nbddp.runtime.oops'") is None
    assert limit("KeyError: 0 [01_nb.ipynb, cell 3, line 1]") is None and limit(None) is None


def test_table_lists_each_failure_with_its_stage():
    text = table(outcomes())
    assert text.splitlines()[1].split() == ["alpaca-sft", "2", "2", "2", "2", "1", "0"]
    assert "  D-TTS (audio, export): 01_nb.ipynb, cell 2, line 1: unknown magic" in text
    assert "A-Alpaca (" not in text


def test_markdown_groups_failures_by_cause_across_cells():
    assert cause("KeyError: 0 [01_nb.ipynb, cell 3, line 1]") == "KeyError: 0"
    text = markdown(outcomes(), {"nbddp": "abc1234"})
    assert "- nbddp: abc1234" in text
    assert "| run | KeyError: 0 | - | 2: B-Alpaca, C-GRPO |" in text
    assert "| run | ModuleNotFoundError: No module named 'vllm' | a package outside the tested stacks | 1: E-GRPO |" in text
    assert "| A-Alpaca | alpaca-sft | main |  | yes | yes | yes | yes | 9 |  |" in text


def test_read_gives_back_what_write_wrote_and_merge_replaces_by_name(tmp_path):
    write(tmp_path, outcomes(), {"date": "today"})
    environment, previous = read(tmp_path)
    assert environment == {"date": "today"} and previous == outcomes()
    rerun = [Outcome("C-GRPO", "grpo", True, True, True, True, nbddp="abc1234"), Outcome("F-New", "other")]
    merged = merge(previous, rerun)
    assert [o.notebook for o in merged] == ["A-Alpaca", "B-Alpaca", "C-GRPO", "D-TTS", "E-GRPO", "F-New"]
    assert merged[2].passed and merged[2].nbddp == "abc1234" and merged[1] == previous[1]
    assert read(tmp_path / "none") is None


def test_write_json_and_markdown(tmp_path):
    json_path, markdown_path = write(tmp_path / "results", outcomes(), {"date": "today"})
    summary = json.loads(json_path.read_text())
    assert summary["environment"] == {"date": "today"} and summary["counts"]["all"]["passed"] == 1
    assert [row["notebook"] for row in summary["notebooks"]] == ["A-Alpaca", "B-Alpaca", "C-GRPO", "D-TTS", "E-GRPO"]
    assert markdown_path.read_text().startswith("# nbddp sweep")


def test_an_error_after_a_failed_download_says_so_and_counts_as_the_network():
    output = ("nbddp: warning: `!git clone https://github.com/meta-pytorch/OpenEnv.git > /dev/null 2>&1` exited with "
              "status 128; the script goes on, as a notebook does\n")
    error = after_failed_download("FileNotFoundError: 'OpenEnv' [01_nb.ipynb, cell 7, line 7]", output)
    assert error.endswith("(after `!git clone https://github.com/meta-pytorch/OpenEnv.git > /dev/null 2>&1` failed: "
                          "no network)")
    assert limit(error) == "the network (a hub or web download)"
    assert after_failed_download("KeyError: 0", "nbddp: warning: `!ls x` exited with status 2") == "KeyError: 0"
