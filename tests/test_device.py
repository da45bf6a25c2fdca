"""default_device and its environment override (minitransformer.device)."""

import pytest
import torch

from minitransformer import default_device


def test_default_device_follows_cuda_availability(monkeypatch):
    monkeypatch.delenv("MINITRANSFORMER_DEVICE", raising=False)
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert default_device().type == expected


def test_environment_variable_overrides(monkeypatch):
    monkeypatch.setenv("MINITRANSFORMER_DEVICE", "cpu")
    assert default_device() == torch.device("cpu")
    monkeypatch.setenv("MINITRANSFORMER_DEVICE", "meta")
    assert default_device() == torch.device("meta")


def test_blank_variable_is_ignored(monkeypatch):
    monkeypatch.setenv("MINITRANSFORMER_DEVICE", "  ")
    assert default_device().type in {"cpu", "cuda"}


def test_unknown_device_name_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("MINITRANSFORMER_DEVICE", "toaster")
    with pytest.raises(ValueError, match="MINITRANSFORMER_DEVICE='toaster'"):
        default_device()
