"""The fallback's `from unsloth import execute_with_time_limit` (and siblings): unsloth_zoo's own file, loaded
without running unsloth_zoo's __init__ (which refuses without Unsloth), or bad input saying what to install."""
import sys
import textwrap

import pytest

from nbddp.errors import UsageError
from nbddp.fallback import models, rl_environments


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.delitem(sys.modules, rl_environments.MODULE, raising=False)
    monkeypatch.delitem(sys.modules, "unsloth_zoo", raising=False)


def test_the_helpers_come_from_unsloth_zoos_file_without_its_init(fresh, tmp_path, monkeypatch):
    package = tmp_path / "unsloth_zoo"
    package.mkdir()
    (package / "__init__.py").write_text('raise ImportError("Please install Unsloth via `pip install unsloth`!")\n')
    (package / "rl_environments.py").write_text(textwrap.dedent("""\
        def execute_with_time_limit(seconds):
            return lambda function: ("limited", seconds, function)

        def check_python_modules(code):
            return "import os" in code, {}
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    limited = models.execute_with_time_limit(2)(print)
    assert limited == ("limited", 2, print)
    assert models.check_python_modules("import os")[0] is True
    assert "unsloth_zoo" not in sys.modules  # the package's __init__ never ran
    assert sys.modules[rl_environments.MODULE].__file__ == str(package / "rl_environments.py")


def test_without_unsloth_zoo_the_name_says_what_to_install(fresh, monkeypatch):
    monkeypatch.setattr(rl_environments.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UsageError, match=r"pip install --no-deps unsloth-zoo==2026\.10\.9"):
        models.create_locked_down_function
