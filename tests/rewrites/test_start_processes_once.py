from rewrite_case import assert_rewrites, assert_unchanged

from nbddp.export.rewrites.start_processes_once import StartProcessesOnce

MESSAGE = ("{} starts a process: it starts once per machine (ddp.start_process), and the machine's other ranks get a "
           "handle on it (pid, poll, wait, terminate, kill)")


def test_a_server_a_cell_starts_starts_once_per_machine():
    # Meta-Synthetic-Data-Llama3.1_(8B), cell 9: vLLM's OpenAI server on :8000; the next cell polls it and reads
    # `server.poll()`, `server.returncode`, `server.terminate()`, `server.wait(timeout = 30)`, `server.kill()`.
    changes = assert_rewrites(
        StartProcessesOnce,
        """\
        server = subprocess.Popen(
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
             "--port", "8000"],
            stdout = open("vllm.log", "w"), stderr = subprocess.STDOUT,
        )
        """,
        """\
        server = ddp.start_process(lambda: subprocess.Popen(
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
             "--port", "8000"],
            stdout = open("vllm.log", "w"), stderr = subprocess.STDOUT,
        ))
        """,
    )
    assert changes == [(1, MESSAGE.format("subprocess.Popen(...)"))]


def test_every_popen_of_the_cell_is_started_once_under_conditions_and_in_functions_too():
    # Llama3_(8B)-Ollama's `subprocess.Popen(["ollama", "serve"])`, its handle unused; NeMo-Gym's under a condition.
    changes = assert_rewrites(
        StartProcessesOnce,
        """\
        from subprocess import Popen
        Popen(["ollama", "serve"])
        if not running():
            ng_process = subprocess.Popen(["bash", "-c", "ng_run"], cwd = GYM_DIR)
        def restart():
            return Popen(["ollama", "serve"])
        """,
        """\
        from subprocess import Popen
        ddp.start_process(lambda: Popen(["ollama", "serve"]))
        if not running():
            ng_process = ddp.start_process(lambda: subprocess.Popen(["bash", "-c", "ng_run"], cwd = GYM_DIR))
        def restart():
            return ddp.start_process(lambda: Popen(["ollama", "serve"]))
        """,
    )
    assert [line for line, _ in changes] == [2, 4, 6]


def test_other_subprocess_calls_and_popens_are_left_alone():
    assert_unchanged(StartProcessesOnce, """\
        subprocess.run(["git", "clone", url], check = True)
        process = psutil.Popen(["ls"])
        status = subprocess.call("true", shell = True)
        """)
