"""require_model: a model name that is neither on this machine nor on the Hub fails at once, naming it."""
import httpx
import pytest
from huggingface_hub import constants
from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

from nbddp.errors import UsageError
from nbddp.fallback import models as hf_backend
from nbddp.model_names import require_model


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """An empty Hugging Face cache in tmp_path; `answers` decides what the Hub says (default: unreachable)."""
    cache = tmp_path / "hub-cache"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    asked = []

    def model_info(name, timeout):
        asked.append(name)
        raise hub.answer

    hub.answer = httpx.ConnectError("[Errno -2] Name or service not known")
    hub.asked = asked
    hub.cache = cache
    monkeypatch.setattr("huggingface_hub.model_info", model_info)
    return hub


def test_a_local_model_directory_passes(tiny_llama_dir, hub):
    require_model(str(tiny_llama_dir))
    assert hub.asked == []


def test_a_mistyped_local_path_suggests_the_closest_folder(tiny_llama_dir, hub, monkeypatch):
    monkeypatch.chdir(tiny_llama_dir.parent)
    with pytest.raises(UsageError, match=r"^model 'tyny-llama/': no such directory"):
        require_model("tyny-llama/")
    (tiny_llama_dir.parent / "models").mkdir()
    (tiny_llama_dir.parent / "models" / "tiny-llama").mkdir()
    # `models/x` is shaped like a Hub id, but `models/` is a local folder: a local path, and a typo.
    with pytest.raises(UsageError, match=r"^model 'models/tyny-llama': no such directory \(did you mean 'models/tiny-llama'\?\)$"):
        require_model("models/tyny-llama")
    assert hub.asked == []


@pytest.mark.parametrize("name, message", [
    ("./nowhere/model", r"no such directory \(nowhere does not exist either; relative paths are read from .*, where the "
                        r"cells run\)"),
    ("/no/such/model", r"no such directory \(/no/such does not exist either\)"),
])
def test_paths_that_no_hub_id_looks_like(hub, tmp_path, monkeypatch, name, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match=message):
        require_model(name)
    assert hub.asked == []


def test_a_directory_or_file_that_is_no_model(tmp_path, hub):
    with pytest.raises(UsageError, match="the directory has no config.json or adapter_config.json"):
        require_model(str(tmp_path))
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(UsageError, match="a file, not a model directory"):
        require_model(str(tmp_path / "weights.bin"))


def test_a_hub_id_in_the_cache_passes_without_asking_the_hub(hub):
    snapshot = hub.cache / "models--acme--tiny" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (hub.cache / "models--acme--tiny" / "refs").mkdir()
    (hub.cache / "models--acme--tiny" / "refs" / "main").write_text("0" * 40)
    require_model("acme/tiny")
    assert hub.asked == []


def test_a_hub_id_neither_cached_nor_reachable(hub):
    with pytest.raises(UsageError) as error:
        require_model("acme/tiny")
    message = str(error.value)
    assert message.startswith("model 'acme/tiny': not a local directory, not in the Hugging Face cache (")
    assert "the Hub cannot be reached ([Errno -2] Name or service not known)" in message
    assert message.endswith("(`hf download acme/tiny`)")


@pytest.fixture
def fresh_hub_session():
    """huggingface_hub 0.x reads offline mode once, as it makes its cached HTTP session (1.x on every request):
    a session an earlier test made must not decide this test's mode, nor this test's the next ones'."""
    import huggingface_hub.utils

    reset = getattr(huggingface_hub.utils, "reset_sessions", lambda: None)
    reset()
    yield
    reset()


def test_offline_mode_is_named(monkeypatch, tmp_path, fresh_hub_session):
    # The real request path: huggingface_hub refuses to send it in offline mode.
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(UsageError, match="the Hub cannot be reached .*offline mode is enabled"):
        require_model("acme/tiny")


def _hub_error(kind):
    response = httpx.Response(404, request=httpx.Request("GET", "https://huggingface.co/api/models/acme/tiny"))
    return kind("404 Client Error", response=response)


def test_a_hub_id_the_hub_does_not_have(hub):
    hub.answer = _hub_error(RepositoryNotFoundError)
    with pytest.raises(UsageError, match="the Hugging Face Hub has no such model"):
        require_model("acme/tiny")


def test_a_gated_model_is_left_to_from_pretrained(hub):
    hub.answer = _hub_error(GatedRepoError)
    require_model("acme/tiny")
    assert hub.asked == ["acme/tiny"]


def test_the_hf_backend_checks_before_transformers_loads(tmp_path, monkeypatch):
    import transformers

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        lambda *args, **kwargs: pytest.fail("Transformers was asked to load a missing model"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match="model './missing': no such directory"):
        hf_backend.FastLanguageModel.from_pretrained("./missing")
