"""``python -m minitransformer download smollm2`` (issue 41): calls
``minitransformer.pretrained.download_smollm2()`` and prints the path; any failure (no
network, a bad hash) is one line and exit status 2. The function is replaced here: no test
reaches the network."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.error
from pathlib import Path

import pytest
from cli_helpers import run

from minitransformer import pretrained

ROOT = Path(__file__).resolve().parent.parent


def test_it_prints_the_path_of_the_cached_file(monkeypatch, tmp_path):
    path = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    calls = []
    monkeypatch.setattr(pretrained, "download_smollm2", lambda: calls.append(1) or path,
                        raising=False)
    status, stdout, stderr = run("download", "smollm2")
    assert (status, stdout, stderr) == (0, f"{path}\n", "")
    assert calls == [1]


@pytest.mark.parametrize("error, words", [
    (urllib.error.URLError("[Errno -3] Temporary failure in name resolution"),
     "Temporary failure in name resolution"),
    (ValueError("SmolLM2-135M-Instruct.Q4_1.gguf: SHA-256 abc..., expected b179c952..."),
     "expected b179c952"),
    (OSError(28, "No space left on device"), "No space left on device"),
    (RuntimeError("line one\nline two"), "line one line two"),
])
def test_a_failure_is_one_line_and_exit_2(monkeypatch, error, words):
    def fail():
        raise error
    monkeypatch.setattr(pretrained, "download_smollm2", fail, raising=False)
    status, stdout, stderr = run("download", "smollm2")
    assert status == 2 and stdout == "" and stderr.count("\n") == 1, stderr
    assert stderr.startswith("minitransformer: error: download smollm2 failed: ")
    assert words in stderr


def test_a_version_without_the_function_and_an_unknown_name_are_refused(monkeypatch):
    monkeypatch.delattr(pretrained, "download_smollm2", raising=False)
    status, _, stderr = run("download", "smollm2")
    assert status == 2 and "has no pretrained.download_smollm2()" in stderr
    status, _, stderr = run("download", "gpt5")
    assert status == 2 and stderr.count("\n") == 1 and "invalid choice: 'gpt5'" in stderr


def test_with_no_network_the_program_says_so_in_one_line(tmp_path):
    """The real function, in a process whose every connection fails at once and whose cache
    is an empty directory: one line, exit 2, nothing left half-written in the cache."""
    if not hasattr(pretrained, "download_smollm2"):
        pytest.skip("pretrained.download_smollm2 is the gguf branch's (merged later)")
    code = ("import socket, sys\n"
            "def refuse(*a, **k): raise OSError(101, 'Network is unreachable')\n"
            "socket.socket.connect = refuse\n"
            "socket.create_connection = refuse\n"
            "socket.getaddrinfo = refuse\n"
            "from minitransformer.cli import main\n"
            "sys.exit(main(['download', 'smollm2']))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(tmp_path),
           "XDG_CACHE_HOME": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-c", code], check=False,
                            capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 2 and result.stdout == "", result.stderr
    assert result.stderr.count("\n") == 1 and "download smollm2 failed" in result.stderr
