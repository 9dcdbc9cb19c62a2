from textwrap import dedent

import pytest

from nbddp.errors import NotebookError
from nbddp.export.rewrites.base import CellLocation, ExportContext
from nbddp.export.rewrites.convert_magics import convert_cell, to_python

LOCATION = CellLocation("notebooks/01_data_prep.ipynb", 3)


def convert(before, stages=()):
    module, changes = convert_cell(dedent(before), LOCATION, ExportContext(stage_notebooks=frozenset(stages)))
    assert all(change.rewrite == "convert-magics" for change in changes)
    return module.code, [(change.line, change.message) for change in changes]


def convert_error(before, stages=()) -> NotebookError:
    with pytest.raises(NotebookError) as raised:
        convert(before, stages)
    assert (raised.value.notebook, raised.value.cell) == ("notebooks/01_data_prep.ipynb", 3)
    return raised.value


def test_plain_python_is_left_exactly_as_written():
    before = """\
        # load   things
        import os ;  x = ( 1 +
            2 )   # odd spacing kept
        if x:
            pass
        """
    assert convert(before) == (dedent(before), [])


def test_pip_install_at_top_level_becomes_a_comment_on_its_own_line():
    code, changes = convert(
        """\
        import os
        !pip install -q datasets
        x = 1  # kept
        """
    )
    assert code == dedent(
        """\
        import os
        # nbddp: dropped !pip install -q datasets
        x = 1  # kept
        """
    )
    assert changes == [(2, "dropped `!pip install -q datasets` (install packages before running the script)")]


def test_unsloth_capture_cell_with_pip_in_if_else_keeps_one_pass_per_branch():
    code, changes = convert(
        """\
        %%capture
        import os
        if "COLAB_" not in "".join(os.environ.keys()):
            !pip install unsloth
        else:
            # Do this only in Colab notebooks! Otherwise use pip install unsloth
            !pip install --no-deps bitsandbytes accelerate peft trl
            !pip install --no-deps unsloth
        """
    )
    assert code == dedent(
        """\
        # nbddp: dropped %%capture
        import os
        if "COLAB_" not in "".join(os.environ.keys()):
            pass  # nbddp: dropped !pip install unsloth
        else:
            # Do this only in Colab notebooks! Otherwise use pip install unsloth
            pass  # nbddp: dropped 2 lines: !pip install --no-deps bitsandbytes accelerate peft trl; !pip install --no-deps unsloth
        """
    )
    assert [line for line, _ in changes] == [1, 4, 7, 8]  # each dropped line is reported at its own line
    assert changes[0] == (1, "dropped `%%capture`; its body is kept")


def test_a_block_of_dropped_lines_keeps_every_comment_above_its_one_pass():
    code, _ = convert(
        """\
        if True:
            # first
            !pip install a
            # second
            %matplotlib inline
        """
    )
    assert code == dedent(
        """\
        if True:
            # first
            # second
            pass  # nbddp: dropped 2 lines: !pip install a; %matplotlib inline
        """
    )


def test_a_dropped_line_beside_other_statements_in_a_block_becomes_a_comment():
    code, _ = convert(
        """\
        if True:
            x = 1
            !pip install a
        for i in range(2):
            !pip install b
            y = i
        """
    )
    assert code == dedent(
        """\
        if True:
            x = 1
            # nbddp: dropped !pip install a
        for i in range(2):
            # nbddp: dropped !pip install b
            y = i
        """
    )


@pytest.mark.parametrize(
    "magic",
    [
        "%pip install trl",
        "!pip3 install trl",
        "!python -m pip install trl",
        "!uv pip install trl",
        "%uv pip install trl",
        "!conda install -y trl",
        "%conda install trl",
        "!{sys.executable} -m pip install -q unsloth",
    ],
)
def test_every_kind_of_package_install_is_dropped(magic):
    code, changes = convert(magic + "\n")
    assert code == f"# nbddp: dropped {magic}\n"
    assert changes == [(1, f"dropped `{magic}` (install packages before running the script)")]


def test_continued_magic_lines_keep_the_following_lines_in_place():
    code, changes = convert("!pip install a \\\n    b\nx = 1\n%matplotlib inline\n")
    assert code.splitlines()[2:] == ["x = 1", "# nbddp: dropped %matplotlib inline"]
    assert [line for line, _ in changes] == [1, 4]


def test_a_cell_magic_after_colab_form_lines_is_read_as_colab_runs_it():
    code, changes = convert(
        """\
        #@title Colab Extra Install { display-mode: "form" }
        %%capture
        import os
        !pip install --upgrade -qqq uv
        """
    )
    assert code == dedent(
        """\
        #@title Colab Extra Install { display-mode: "form" }
        # nbddp: dropped %%capture
        import os
        # nbddp: dropped !pip install --upgrade -qqq uv
        """
    )
    assert [line for line, _ in changes] == [2, 4]


def test_a_cell_magic_after_an_ordinary_comment_is_still_an_error():
    # IPython reads it as the line magic `%%capture`, which does not exist: the cell fails in Jupyter too.
    error = convert_error("# install\n%%capture\nimport os\n")
    assert error.line == 2 and "%%capture" in str(error)


def test_leading_blank_lines_are_kept():
    code, changes = convert("\n\n%matplotlib inline\nx = 1\n")
    assert code == "\n\n# nbddp: dropped %matplotlib inline\nx = 1\n"
    assert changes == [(3, "dropped `%matplotlib inline` (interactive only)")]


@pytest.mark.parametrize("cell", ["%matplotlib inline", "%%capture\nx = 1", "\n%%capture\n"])
def test_a_missing_or_present_final_newline_is_kept(cell):
    code, _ = convert(cell)
    assert code.endswith("\n") == cell.endswith("\n")
    assert len(code.splitlines()) == len(cell.splitlines())


def test_env_sets_os_environ_and_imports_os_once():
    code, changes = convert(
        """\
        %env HF_HUB_OFFLINE=1
        %env TOKENIZERS_PARALLELISM false
        %env HF_HOME
        """
    )
    assert code == dedent(
        """\
        import os
        os.environ["HF_HUB_OFFLINE"] = "1"
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        # nbddp: dropped %env HF_HOME
        """
    )
    assert changes == [
        (1, '`%env HF_HUB_OFFLINE=1` -> os.environ["HF_HUB_OFFLINE"] = "1"'),
        (2, '`%env TOKENIZERS_PARALLELISM false` -> os.environ["TOKENIZERS_PARALLELISM"] = "false"'),
        (3, "dropped `%env HF_HOME` (interactive only)"),
    ]


@pytest.mark.parametrize(
    "magic, statement",
    [("%cd OpenEnv", 'os.chdir("OpenEnv")'), ("%cd ~/work dir", None), ("%cd {folder}", None), ("%cd '~/work dir'", 'os.chdir(os.path.expanduser("~/work dir"))')],
)
def test_cd_changes_directory_in_python(magic, statement):
    if statement is None:
        assert convert_error(magic + "\n").message == f"`{magic}` is not a plain `%cd path`"
        return
    code, changes = convert(f"!git clone https://github.com/meta-pytorch/OpenEnv.git\n{magic}\n")
    assert code == f'import os\nddp.shell("git clone https://github.com/meta-pytorch/OpenEnv.git")\n{statement}\n'
    assert changes[1] == (2, f"`{magic}` -> {statement}")


def test_env_does_not_import_os_twice():
    code, _ = convert("import os\n%env A=1\n")
    assert code == 'import os\nos.environ["A"] = "1"\n'


def test_env_with_a_python_expansion_is_an_error():
    error = convert_error("x = 1\n%env A=$x\n")
    assert error.line == 2
    assert "os.environ" in error.hint


def test_run_of_a_stage_notebook_is_dropped():
    code, changes = convert("%run ./01_data_prep.ipynb\nx = 1\n", stages={"01_data_prep.ipynb"})
    assert code == "# nbddp: dropped %run ./01_data_prep.ipynb\nx = 1\n"
    assert changes == [(1, "dropped `%run ./01_data_prep.ipynb` (that stage is part of the script)")]


def test_run_of_anything_else_is_an_error():
    error = convert_error("x = 1\n%run helpers.py\n", stages={"01_data_prep.ipynb"})
    assert error.line == 2
    assert "not a stage notebook" in error.message


def test_time_magics_keep_their_code():
    code, changes = convert(
        """\
        %%time
        x = 1
        %time y = x + 1
        """
    )
    assert code == "# nbddp: dropped %%time\nx = 1\ny = x + 1\n"
    assert changes == [
        (1, "dropped `%%time`; its body is kept"),
        (3, "dropped `%time` (timing only); kept `y = x + 1`"),
    ]


@pytest.mark.parametrize(
    "cell, line, message",
    [
        ("files = !ls\n", 1, "`!ls` has no equivalent in a script"),
        ("%timeit sum(range(9))\n", 1, "magic `%timeit sum(range(9))` has no equivalent in a script"),
        ("x = 1\nx?\n", 2, "magic `%pinfo x` has no equivalent in a script"),
        ("%%bash\nls\n", 1, "cell magic `%%bash` has no equivalent in a script"),
        ("%%writefile\nx = 1\n", 1, "`%%writefile` is not `%%writefile [-a] path`"),
        ("%%writefile a.py b.py\nx = 1\n", 1, "`%%writefile a.py b.py` is not `%%writefile [-a] path`"),
        ("%%writefile {out}/cfg.yaml\nx: 1\n", 1,
         "`%%writefile {out}/cfg.yaml` names its file with IPython's `{...}`/`$name` expansion, which the script cannot repeat"),
        ("%%writefile -a $name\nx\n", 1,
         "`%%writefile -a $name` names its file with IPython's `{...}`/`$name` expansion, which the script cannot repeat"),
    ],
)
def test_other_magics_are_errors_at_their_line(cell, line, message):
    error = convert_error(cell)
    assert (error.line, error.message) == (line, message)
    assert "notebook-only" in error.hint


def test_shell_commands_run_once_per_machine_on_their_lines():
    code, changes = convert(
        """\
        %%capture
        import os
        !git clone https://github.com/meta-pytorch/OpenEnv.git > /dev/null 2>&1
        if not os.path.exists("audio.mp3"):
            !wget -qqq https://example.org/speech.mp3 \\
                -O "audio.mp3"
        x = 1
        """
    )
    assert code == dedent(
        """\
        # nbddp: dropped %%capture
        import os
        ddp.shell("git clone https://github.com/meta-pytorch/OpenEnv.git > /dev/null 2>&1")
        if not os.path.exists("audio.mp3"):
            ddp.shell("wget -qqq https://example.org/speech.mp3          -O \\"audio.mp3\\"")

        x = 1
        """
    )
    assert [line for line, _ in changes] == [1, 3, 5]
    assert changes[1][1] == ("`!git clone https://github.com/meta-pytorch/OpenEnv.git > /dev/null 2>&1` -> ddp.shell(...): "
                             "runs once per machine, the other ranks wait")


@pytest.mark.parametrize("command", ["wget {url} -O data.json", "mkdir -p data/{pdf,html}", "echo $HOME $$"])
def test_a_shell_command_with_ipython_expansion_gets_the_scripts_variables(command):
    code, changes = convert(f"if True:\n    !{command}\n")
    assert code == f"if True:\n    ddp.shell({command!r}, {{**globals(), **locals()}})\n".replace("'", '"')
    assert changes[0][1].endswith("; {...}/$name filled in from the script's variables, as IPython does")


@pytest.mark.parametrize(
    "magic, call",
    [
        ("%%writefile export_model.py", 'ddp.write_file("export_model.py", (  # %%writefile export_model.py'),
        ("%%file -a notes.txt", 'ddp.write_file("notes.txt", (  # %%file -a notes.txt'),
    ],
)
def test_writefile_writes_the_cells_text_once_per_machine_one_line_per_line(magic, call):
    text = 'import os\nprint("it\'s \\\\ here")\n\n'
    code, changes = convert(f"{magic}\n{text}")
    append = ", append=True" if "-a" in magic else ""
    assert code == f"{call}\n    'import os\\n'\n    'print(\"it\\'s \\\\\\\\ here\")\\n'\n    '\\n'){append})\n"
    assert len(code.splitlines()) == len(f"{magic}\n{text}".splitlines())
    written = {}
    exec(code, {"ddp": type("Ddp", (), {"write_file": lambda self, path, text, append=False: written.update(
        path=path, text=text, append=append)})()})
    assert written["text"] == text and written["append"] == bool(append)
    assert changes[0][0] == 1 and "written once per machine" in changes[0][1]


def test_writefile_of_an_empty_cell_writes_an_empty_file():
    code, _ = convert("%%writefile empty.txt\n")
    assert code == 'ddp.write_file("empty.txt", "")  # %%writefile empty.txt\n'


def test_capture_into_a_variable_is_an_error():
    error = convert_error("%%capture output\n!pip install x\n")
    assert error.line == 1
    assert "variable" in error.message


def test_syntax_errors_name_the_line():
    error = convert_error("x = 1\n\ndef f(:\n    pass\n")
    assert error.line == 3
    assert error.message.startswith("not valid Python")


def test_to_python_keeps_line_numbers_of_line_magics():
    source = "\n!pip install a \\\n  b \\\n  c\n%pip install d\nx = 1\n"
    assert len(to_python(source).splitlines()) == len(source.splitlines())
    assert to_python(source).splitlines()[5] == "x = 1"


def test_get_ipython_calls_written_by_hand_are_errors_too():
    error = convert_error("x = 1\nget_ipython().run_line_magic('matplotlib', style)\n")
    assert error.line == 2
    assert "has no equivalent in a script" in error.message
