"""tools/standin_urls.py and its hook: the URLs a notebook fetches answered from local files in a run, others not."""
import json
import os
import subprocess
import sys

import pytest

from tools import standin_urls
from tools.notebook_facts import read_facts

BOOK = "https://www.gutenberg.org/ebooks/2701.txt.utf-8"
CSV = "https://huggingface.co/datasets/unsloth/Support-Bot-Recommendation/raw/main/support_recs.csv"
IMAGE = "https://files.worldwildlife.org/wwfcmsprod/images/Sloth_Sitting/8l7pbjmj29_iStock_mini__1_.jpg"
SOUND = "https://www.nasa.gov/wp-content/uploads/2015/01/591240main_JFKmoonspeech.mp3"
UNKNOWN = "https://example.invalid/page.html"  # .invalid never resolves (RFC 2606): no stand-in, no network


def run_python(tmp_path, code: str, urls) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter of this environment, with the sweep's run variables for `urls`."""
    standins = standin_urls.build(tmp_path / "urls", urls)
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-home"),
                   **standin_urls.environment(standins, os.environ.get("PYTHONPATH"))}
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=environment, capture_output=True,
                          text=True, timeout=240)


def test_only_the_urls_of_a_known_kind_get_a_file_named_like_them(tmp_path):
    standins = standin_urls.build(tmp_path, [BOOK, CSV, IMAGE, SOUND, UNKNOWN, BOOK])
    assert list(standins) == [BOOK, CSV, IMAGE, SOUND]
    assert standins[BOOK] == (tmp_path / "www.gutenberg.org" / "ebooks" / "2701.txt.utf-8",
                              "text/plain; charset=utf-8")
    assert standin_urls.build(tmp_path / "again", [BOOK])[BOOK][0].read_bytes() == standins[BOOK][0].read_bytes()
    assert standin_urls.environment({}, "elsewhere") == {}


def test_the_clients_notebooks_fetch_with_get_the_stand_ins(tmp_path):
    code = f"""
import io, urllib.request
import requests, httpx
from PIL import Image
from IPython.display import Audio
from datasets import load_dataset
print("urllib", urllib.request.urlopen({BOOK!r}).read().decode().startswith("The Stand-in Book"))
urllib.request.urlretrieve({SOUND!r}, "audio.mp3")
print("urlretrieve", open("audio.mp3", "rb").read(4))
response = requests.get({BOOK!r})
print("requests", response.status_code, response.encoding, "CHAPTER 1" in response.text)
print("httpx", Image.open(io.BytesIO(httpx.get({IMAGE!r}).content)).format)
print("audio", len(Audio({SOUND!r}).data) > 1000)
rows = load_dataset("csv", data_files={{"train": {CSV!r}}}, column_names=["snippet", "recommendation"],
                    skiprows=1)["train"]
print("datasets", len(rows), rows[5]["snippet"].endswith("?"), rows[5]["recommendation"].endswith("."))
"""
    result = run_python(tmp_path, code, [BOOK, CSV, IMAGE, SOUND])
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == ["urllib True", "urlretrieve b'RIFF'", "requests 200 utf-8 True",
                                          "httpx JPEG", "audio True", "datasets 200 True True"]


@pytest.mark.parametrize("fetch", ["urllib.request.urlopen(url)", "requests.get(url)", "httpx.get(url)",
                                   "load_dataset('csv', data_files=url)"])
def test_a_url_without_a_stand_in_fails_as_without_the_hook(tmp_path, fetch):
    code = f"""
import urllib.request, requests, httpx
from datasets import load_dataset
url = {UNKNOWN!r}
try:
    {fetch}
except Exception as error:
    print(type(error).__name__)
"""
    hooked = run_python(tmp_path, code, [BOOK])
    plain = run_python(tmp_path, code, [])
    assert hooked.returncode == 0 and hooked.stdout == plain.stdout != "", hooked.stderr[-3000:]


def test_the_facts_list_the_urls_a_notebooks_code_names(tmp_path):
    notebook = tmp_path / "nb.ipynb"
    cells = [f'import requests\ntext = requests.get("{BOOK}").text  # https://www.gutenberg.org/ in a comment',
             f'!wget -qqq {SOUND} -O audio.mp3\nfrom IPython.display import Audio\nAudio("{SOUND}")',
             'load_dataset("unsloth/alpaca-cleaned")']
    notebook.write_text(json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
        {"cell_type": "code", "metadata": {}, "source": source, "outputs": [], "execution_count": None}
        for source in cells] + [{"cell_type": "markdown", "metadata": {}, "source": f"![x]({IMAGE})"}]}))
    assert read_facts(notebook).urls == [BOOK, SOUND]



def test_a_sweep_run_answers_the_urls_its_notebook_names_and_no_others(tmp_path):
    from tools import notebook_sweep

    def facts_of(name, cells):
        path = tmp_path / f"{name}.ipynb"
        path.write_text(json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
            {"cell_type": "code", "metadata": {}, "source": source, "outputs": [], "execution_count": None}
            for source in cells]}))
        return read_facts(path)

    books = facts_of("books", [f'import requests\ntext = requests.get("{BOOK}").text'])
    images = facts_of("images", [f'sloth_link = "{IMAGE}"'])
    args = notebook_sweep.build_parser().parse_args(["--work", str(tmp_path / "work")])
    args.nbddp = notebook_sweep.REPO
    runner = notebook_sweep.Runner(args, tmp_path / "logs", [books, images])
    assert list(json.loads(runner.environment(books)["NBDDP_SWEEP_URLS"])) == [BOOK]
    assert list(json.loads(runner.environment(images)["NBDDP_SWEEP_URLS"])) == [IMAGE]
    code = f'import requests\nprint(requests.get("{BOOK}").text.splitlines()[0])'
    ran = subprocess.run([sys.executable, "-c", code], env=runner.environment(books), capture_output=True, text=True)
    assert ran.stdout == "The Stand-in Book of 2701.txt.utf-8\n", ran.stderr[-3000:]
    refused = subprocess.run([sys.executable, "-c", code], env=runner.environment(images), capture_output=True,
                             text=True)
    assert "ConnectionError" in refused.stderr
