"""The position-wise feed-forward block: feature creation, ReLU, transition (chapter 4).

Chapter 4 sets its weights by hand so that it builds word-pair features and turns them into
next-word votes; later chapters use it, with learned weights, inside every transformer block.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU}


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


class FeedForward(nn.Module):
    """``FFN(x) = activation(x W1 + b1) W2 + b2``, applied to every position on its own.

    With ReLU this is ``max(0, x W1 + b1) W2 + b2`` of Vaswani et al. (2017), eq. 2. The
    sub-modules carry PyTorch's names (``linear1``, ``linear2``, as in
    ``nn.TransformerEncoderLayer``), so weights copy across one to one. Note that
    ``nn.Linear`` stores ``W1`` transposed: ``linear1.weight`` has shape ``(d_ff, d_model)``.

    Args:
        d_model: size of each input and output vector.
        d_ff: number of hidden features.
        dropout: probability of zeroing a hidden feature while training (``0.0`` = off).
        activation: ``"relu"`` or ``"gelu"``.

    Shapes:
        input ``(..., d_model)`` -> output ``(..., d_model)``; the hidden features are
        ``(..., d_ff)``.
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0, activation: str = "relu"):
        super().__init__()
        self.d_model = _positive_int("d_model", d_model)
        self.d_ff = _positive_int("d_ff", d_ff)
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be a probability in [0, 1), got {dropout!r}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        self.linear1 = nn.Linear(d_model, d_ff)
        self.activation = ACTIVATIONS[activation]()
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(d_ff, d_model)

    def features(self, x: Tensor) -> Tensor:
        """The hidden features ``activation(x W1 + b1)``, shape ``(..., d_ff)``."""
        self._check_input(x)
        return self.activation(self.linear1(x))

    def forward(self, x: Tensor) -> Tensor:
        """Apply the block to ``x`` of shape ``(..., d_model)``; returns ``(..., d_model)``."""
        return self.linear2(self.dropout(self.features(x)))

    def _check_input(self, x: Tensor) -> None:
        if not isinstance(x, Tensor) or not x.is_floating_point():
            raise TypeError("FeedForward expects a floating-point tensor, got "
                            + (f"dtype {x.dtype}" if isinstance(x, Tensor) else type(x).__name__))
        if x.dim() == 0 or x.shape[-1] != self.d_model:
            raise ValueError(f"FeedForward expects input of shape (..., {self.d_model}), "
                             f"got {tuple(x.shape)}")

    def set_weights(self, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor) -> "FeedForward":
        """Copy hand-set weights, written the way the equation reads, into the block.

        Args:
            w1: ``(d_model, d_ff)``, so that the features are ``x @ w1 + b1``.
            b1: ``(d_ff,)``.
            w2: ``(d_ff, d_model)``, so that the output is ``features @ w2 + b2``.
            b2: ``(d_model,)``.

        Returns:
            the block itself, for chaining.
        """
        expected = {"w1": (self.d_model, self.d_ff), "b1": (self.d_ff,),
                    "w2": (self.d_ff, self.d_model), "b2": (self.d_model,)}
        given = {"w1": w1, "b1": b1, "w2": w2, "b2": b2}
        for name, value in given.items():
            if not isinstance(value, Tensor):
                raise TypeError(f"{name} must be a tensor, got {type(value).__name__}")
            if tuple(value.shape) != expected[name]:
                raise ValueError(f"{name} must have shape {expected[name]}, got {tuple(value.shape)}")
        with torch.no_grad():
            self.linear1.weight.copy_(w1.T)
            self.linear1.bias.copy_(b1)
            self.linear2.weight.copy_(w2.T)
            self.linear2.bias.copy_(b2)
        return self

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, d_ff={self.d_ff}"
