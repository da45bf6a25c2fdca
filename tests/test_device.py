"""default_device and its environment override (minitransformer.device)."""

import os

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


def test_deterministic_kernels_on_cuda_only_and_given_back(device):
    """On CUDA the block runs on deterministic kernels (warning where one has none) and
    attention on its math kernel, and the settings before it come back, after an error too; on
    the CPU nothing changes. (On an H200, chapter 15's resumed run differed from the straight
    one with the fused memory-efficient attention's backward.)"""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from minitransformer.device import deterministic_kernels

    every = [SDPBackend.MATH, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION]
    cuda = device.type == "cuda"
    with sdpa_kernel(every):       # the `device` fixture chose the math kernel: undo that
        assert not torch.are_deterministic_algorithms_enabled()
        with pytest.raises(KeyError):
            with deterministic_kernels(device):
                assert torch.are_deterministic_algorithms_enabled() == cuda
                assert torch.backends.cuda.mem_efficient_sdp_enabled() != cuda
                assert torch.backends.cuda.flash_sdp_enabled() != cuda
                if cuda:
                    assert torch.is_deterministic_algorithms_warn_only_enabled()
                    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
                raise KeyError("inside")
        assert not torch.are_deterministic_algorithms_enabled()
        assert not torch.is_deterministic_algorithms_warn_only_enabled()
        assert torch.backends.cuda.mem_efficient_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled()
