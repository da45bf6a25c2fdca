"""``python -m minitransformer serve`` (chapter 18): the program around the server.

It refuses bad flags, a missing model and a port in use with one line on stderr and exit
status 2; it listens on 127.0.0.1 unless told otherwise; it answers the official ``openai``
client as ``generate`` writes; SIGTERM lets the answer in flight finish, then it exits with 0.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("fastapi", reason="the serve extra is not installed")
pytest.importorskip("uvicorn", reason="the serve extra is not installed")
openai = pytest.importorskip("openai", reason="the openai client is not installed")
httpx = pytest.importorskip("httpx", reason="the openai client's httpx is not installed")

from minitransformer.cli import main  # noqa: E402
from test_server import build_model_dir, cli_generate  # noqa: E402  (tests/ is on sys.path)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_model_dir(tmp_path_factory.mktemp("serve-cli"))


@pytest.fixture(scope="module")
def slow_model_dir(tmp_path_factory) -> Path:
    """A model that takes a second or two for 400 tokens, and never writes <|end|>."""
    return build_model_dir(tmp_path_factory.mktemp("serve-slow"), context_length=512,
                           d_model=128, num_layers=4, end_scale=0.0)


def refused(capsys, *argv) -> str:
    """The one line that ``serve`` with these flags prints on stderr, exiting with 2."""
    status = main(["serve", *map(str, argv)])
    out, err = capsys.readouterr()
    assert status == 2 and out == "", (status, out, err)
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("minitransformer"), err
    return err


def test_a_missing_model_directory_is_refused(capsys, tmp_path):
    assert "--model" in refused(capsys, "--model", tmp_path / "nowhere")


def test_no_model_serves_smollm2_and_says_how_to_get_it_when_it_is_missing(
        capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("MINITRANSFORMER_CACHE", str(tmp_path))
    err = refused(capsys, "--port", 0)
    assert "no --model given, and the default model is not here" in err
    assert "download smollm2" in err


def test_a_directory_without_a_model_is_refused(capsys, tmp_path):
    assert refused(capsys, "--model", tmp_path, "--port", 0)


def test_a_gguf_file_is_loaded_as_chat_and_generate_load_it(capsys, tmp_path):
    """serve's --model goes through common.load_model: a .gguf file is read as one (a damaged
    one refused by name), a missing one refused in the same words as chat's."""
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"GGUF" + bytes(20))
    assert f"--model {fake}: {fake} is GGUF version 0" in refused(capsys, "--model", fake,
                                                                   "--port", 0)
    assert "no such directory or .gguf file" in refused(capsys, "--model", tmp_path / "x.gguf")


def test_a_port_in_use_is_refused_by_number(capsys, model_dir):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        err = refused(capsys, "--model", model_dir, "--port", port)
    assert f"--port {port}" in err and "cannot listen" in err, err


@pytest.mark.parametrize("flags, words", [
    (["--max-batch", "0"], "--max-batch"),
    (["--max-batch", "many"], "--max-batch"),
    (["--kv-blocks", "-3"], "--kv-blocks"),
    (["--port", "70000"], "--port"),
    (["--port", "http"], "--port"),
    (["--threads", "0"], "--threads"),
    (["--device", "tpu"], "--device"),
])
def test_a_bad_flag_is_refused_by_name(capsys, model_dir, flags, words):
    assert words in refused(capsys, "--model", model_dir, *flags)


def test_without_the_serve_extra_it_says_what_to_install(capsys, model_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "uvicorn", None)          # import uvicorn fails
    assert "pip install 'minitransformer[serve]'" in refused(capsys, "--model", model_dir)


@pytest.mark.parametrize("flags, packed", [((), True), (("--no-pack-weights",), False)])
def test_the_engine_packs_the_weights_unless_told_not_to(model_dir, monkeypatch, flags, packed):
    import minitransformer.cli.serve as serve_module
    import minitransformer.serving as serving

    made, engine_class = [], serving.Engine

    def recorded(*args, **kwargs):
        made.append(kwargs)
        return engine_class(*args, **kwargs)

    monkeypatch.setattr(serving, "Engine", recorded)
    monkeypatch.setattr(serve_module, "serve", lambda app, sock, uvicorn: None)  # no loop
    assert main(["serve", "--model", str(model_dir), "--port", "0", "--device", "cpu",
                 *flags]) == 0
    assert [kwargs["pack_weights"] for kwargs in made] == [packed]


@pytest.mark.parametrize("flags, caching", [((), False), (("--prefix-caching",), True)])
def test_prefix_caching_is_off_unless_asked_for(model_dir, monkeypatch, flags, caching):
    import minitransformer.cli.serve as serve_module
    import minitransformer.serving as serving

    made, engine_class = [], serving.Engine

    def recorded(*args, **kwargs):
        made.append(kwargs)
        return engine_class(*args, **kwargs)

    monkeypatch.setattr(serving, "Engine", recorded)
    monkeypatch.setattr(serve_module, "serve", lambda app, sock, uvicorn: None)  # no loop
    assert main(["serve", "--model", str(model_dir), "--port", "0", "--device", "cpu",
                 *flags]) == 0
    assert [kwargs["prefix_caching"] for kwargs in made] == [caching]


def test_a_file_that_is_not_a_gguf_model_is_refused_in_one_line(capsys, tmp_path):
    text = tmp_path / "model.txt"
    text.write_text("hello")
    assert "no such directory or .gguf file" in refused(capsys, "--model", text)
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"not a gguf file at all")
    assert str(fake) in refused(capsys, "--model", fake, "--port", 0)


def test_a_kv_cache_past_the_free_memory_is_refused_in_one_line(capsys, model_dir):
    err = refused(capsys, "--model", model_dir, "--kv-blocks", 1_000_000_000_000,
                  "--device", "cpu")
    assert "--kv-blocks 1000000000000" in err and "GB" in err and "blocks fit" in err, err


def test_weights_with_nan_are_refused_in_one_line(capsys, model_dir, tmp_path):
    import shutil

    from minitransformer import GPT

    broken = tmp_path / "broken"
    shutil.copytree(model_dir, broken)
    model = GPT.from_pretrained(broken)
    with torch.no_grad():
        model.token_embedding.weight[7, 0] = float("nan")
    model.save_pretrained(broken)
    err = refused(capsys, "--model", broken, "--port", 0, "--device", "cpu")
    assert "token_embedding.weight holds NaN" in err, err


@pytest.mark.parametrize("flags, words", [
    (["--max-queue", "-1"], "--max-queue"),
    (["--max-queue", "many"], "--max-queue"),
    (["--allowed-origins", "localhost:3000"], "--allowed-origins"),
    (["--allowed-origins", "http://a.example/path"], "--allowed-origins"),
    (["--allowed-origins"], "--allowed-origins"),
    (["--api-key", " "], "--api-key"),
])
def test_a_bad_server_flag_is_refused_by_name(capsys, model_dir, flags, words):
    assert words in refused(capsys, "--model", model_dir, "--port", "0", "--device", "cpu",
                            *flags)


@pytest.mark.parametrize("flags, env, expected", [
    ((), {}, {"api_key": None, "allowed_origins": ()}),
    (("--max-queue", "3"), {}, {"max_queue": 3}),
    (("--max-queue", "0"), {}, {"max_queue": 0}),
    (("--api-key", "k1"), {"MINITRANSFORMER_API_KEY": "k2"}, {"api_key": "k1"}),
    ((), {"MINITRANSFORMER_API_KEY": "k2"}, {"api_key": "k2"}),
    ((), {"MINITRANSFORMER_API_KEY": ""}, {"api_key": None}),
    (("--allowed-origins", "http://localhost:3000", "*"), {},
     {"allowed_origins": ["http://localhost:3000", "*"]}),
])
def test_the_server_flags_reach_the_app(model_dir, monkeypatch, flags, env, expected):
    import minitransformer.cli.serve as serve_module
    import minitransformer.server as server

    made, create_app = [], server.create_app

    def recorded(*args, **kwargs):
        made.append(kwargs)
        return create_app(*args, **kwargs)

    monkeypatch.delenv("MINITRANSFORMER_API_KEY", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(server, "create_app", recorded)
    monkeypatch.setattr(serve_module, "serve", lambda app, sock, uvicorn: None)  # no loop
    assert main(["serve", "--model", str(model_dir), "--port", "0", "--device", "cpu",
                 *flags]) == 0
    (kwargs,) = made
    assert {k: kwargs.get(k, server.MAX_QUEUE if k == "max_queue" else None)
            for k in expected} == expected, kwargs


def test_the_help_states_the_server_s_queue_default():
    import contextlib
    import io

    import minitransformer.server as server

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["serve", "--help"])
    assert f"(default {server.MAX_QUEUE})" in " ".join(out.getvalue().split())


class Served:
    """``python -m minitransformer serve`` in a subprocess, on a free port."""

    def __init__(self, folder: Path, *flags: str) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT),
               "HF_HUB_OFFLINE": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "minitransformer", "serve", "--model", str(folder),
             "--port", "0", "--device", "cpu", *flags],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        ready, _, _ = select.select([self.proc.stdout], [], [], 60)
        assert ready, "serve printed nothing in 60 s"
        self.banner = self.proc.stdout.readline()
        assert self.banner.startswith("serving "), self.banner + self.proc.stderr.read()
        self.url = self.banner.split(" at ")[1].split("/v1")[0]
        self.port = int(self.url.rsplit(":", 1)[1])
        self.client = openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused",
                                    max_retries=0)

    def stop(self) -> tuple[int, str]:
        """SIGTERM; the exit status and what was left on stderr."""
        self.proc.send_signal(signal.SIGTERM)
        status = self.proc.wait(timeout=30)
        return status, self.proc.stderr.read()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()
        self.proc.stderr.close()


def listening_addresses(port: int) -> set[str]:
    """The local addresses that listen on ``port``, from /proc/net/tcp (hex, as the kernel
    writes them: 0100007F is 127.0.0.1, 00000000 is every address)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:          # 0A: LISTEN
                found.add(address)
    return found


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="needs Linux's /proc")
def test_it_listens_on_127_0_0_1_answers_as_generate_and_stops_on_sigterm(model_dir):
    served = Served(model_dir, "--name", "tiny-chat")
    try:
        assert served.url.startswith("http://127.0.0.1:")
        assert listening_addresses(served.port) == {"0100007F"}
        (model,) = served.client.models.list().data
        assert model.id == "tiny-chat"
        answer = served.client.completions.create(model=model.id, prompt="Once upon",
                                                  max_tokens=9, temperature=0)
        assert answer.choices[0].text == cli_generate(model_dir, "Once upon", 9)
        page = httpx.get(served.url + "/", timeout=30)
        assert page.status_code == 200 and "<script>" in page.text
        status, err = served.stop()
        assert status == 0, err
        assert "0 answers in flight" in err and "Traceback" not in err, err
    finally:
        served.close()


def test_sigterm_lets_the_answer_in_flight_finish_then_exits_cleanly(slow_model_dir):
    served = Served(slow_model_dir)
    try:
        stream = served.client.completions.create(
            model=slow_model_dir.name, prompt="The cat", max_tokens=400, temperature=0,
            stream=True, stream_options={"include_usage": True})
        chunks = iter(stream)
        first = next(chunks)
        started = time.monotonic()
        served.proc.send_signal(signal.SIGTERM)
        rest = list(chunks)
        assert time.monotonic() - started < 30
        text = first.choices[0].text + "".join(c.choices[0].text for c in rest if c.choices)
        reasons = [c.choices[0].finish_reason for c in rest if c.choices]
        assert reasons[-1] == "length" and rest[-1].usage.completion_tokens == 400
        assert text == cli_generate(slow_model_dir, "The cat", 400)
        status = served.proc.wait(timeout=30)
        err = served.proc.stderr.read()
        assert status == 0, err
        assert "1 answer in flight finishes first" in err and "Traceback" not in err, err
        with pytest.raises(httpx.ConnectError):
            httpx.get(served.url + "/v1/models", timeout=5)
    finally:
        served.close()


def _get(port: int, path: str = "/health") -> tuple[int, dict[str, str], bytes]:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def test_while_the_model_loads_every_request_gets_503_starting(model_dir, monkeypatch):
    """A probe during the load is answered at once (503, Retry-After, {"status": "starting"}),
    not left in the socket's backlog; after the load the same socket serves (here the app's
    own /health, through a stand-in for uvicorn's loop)."""
    import json

    import minitransformer.cli.serve as serve_module

    sockets, during, after = [], [], []
    listen, load = serve_module.listen, serve_module.load

    def recorded_listen(host, port):
        sockets.append(listen(host, port))
        return sockets[-1]

    def probed_load(folder, where, **dtype):
        port = sockets[0].getsockname()[1]
        during.append(_get(port))
        during.append(_get(port, "/v1/models"))
        return load(folder, where, **dtype)

    def one_request(app, sock, uvicorn):      # the socket still listens: a client connects
        client = socket.create_connection(sock.getsockname()[:2], timeout=5)
        conn, _ = sock.accept()
        after.append(conn is not None)
        conn.close()
        client.close()

    monkeypatch.setattr(serve_module, "listen", recorded_listen)
    monkeypatch.setattr(serve_module, "load", probed_load)
    monkeypatch.setattr(serve_module, "serve", one_request)
    assert main(["serve", "--model", str(model_dir), "--port", "0", "--device", "cpu"]) == 0
    for status, headers, body in during:
        assert status == 503 and headers["Retry-After"] == "1"
        assert json.loads(body) == {"status": "starting"}
    assert len(during) == 2 and after == [True]


def test_answering_while_loading_stops_and_leaves_the_socket_listening():
    from minitransformer.cli.serve import answering_while_loading, listen

    sock = listen("127.0.0.1", 0)
    try:
        port = sock.getsockname()[1]
        with answering_while_loading(sock):
            assert _get(port)[0] == 503
            assert _get(port, "/anything")[0] == 503
        client = socket.create_connection(("127.0.0.1", port), timeout=5)
        ready, _, _ = select.select([sock], [], [], 5)
        assert ready                                # waits for the real server, unanswered
        sock.accept()[0].close()
        client.close()
    finally:
        sock.close()
