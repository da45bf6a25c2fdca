"""Attention masks: which keys each query may look at (chapter 6).

Every mask in this package is boolean with **True = may attend**, the convention of
``torch.nn.functional.scaled_dot_product_attention``. (``nn.MultiheadAttention`` uses the opposite:
there True means *masked*, so pass ``~mask`` to it.)
"""

from __future__ import annotations

import torch
from torch import Tensor


def _check_length(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")
    return value


def causal_mask(q_len: int, k_len: int | None = None, *,
                device: torch.device | str | None = None) -> Tensor:
    """The mask that lets each position look only at itself and the positions before it.

    The queries are the *last* ``q_len`` of the ``k_len`` positions ("lower-right" alignment):
    key ``j`` is visible to query ``i`` when ``j <= i + k_len - q_len``. With ``k_len == q_len``
    this is the usual lower triangle; with ``k_len > q_len`` it is what generation with cached keys
    needs, where a few new queries follow many earlier keys. (PyTorch's ``is_causal=True`` aligns to
    the upper left instead.)

    Args:
        q_len: the number of queries L.
        k_len: the number of keys S (default: ``q_len``); at least ``q_len``.
        device: where to create the mask.

    Returns:
        A boolean tensor of shape ``(q_len, k_len)``, True where the query may attend to the key.

    Raises:
        TypeError: a length is not an int.
        ValueError: a length is below 1, or ``k_len < q_len`` (the first queries would see no key).
    """
    q_len = _check_length("q_len", q_len)
    k_len = q_len if k_len is None else _check_length("k_len", k_len)
    if k_len < q_len:
        raise ValueError(f"causal_mask needs k_len >= q_len, got q_len={q_len} and k_len={k_len}: "
                         f"the first {q_len - k_len} queries would have no key to attend to")
    query_positions = torch.arange(k_len - q_len, k_len, device=device)[:, None]  # (L, 1)
    key_positions = torch.arange(k_len, device=device)[None, :]                    # (1, S)
    return key_positions <= query_positions


def padding_mask(tokens: Tensor, pad_id: int) -> Tensor:
    """The mask that hides padding: True where the key is a real token.

    Args:
        tokens: integer token ids of shape ``(B, S)``, shorter sentences filled up with ``pad_id``.
        pad_id: the id used for padding.

    Returns:
        A boolean tensor of shape ``(B, 1, 1, S)``; it broadcasts over heads ``(B, h, L, S)``.

    Raises:
        TypeError: ``tokens`` is not an integer tensor, or ``pad_id`` is not an int.
        ValueError: ``tokens`` is not 2-D.
    """
    if not isinstance(tokens, Tensor) or tokens.is_floating_point() or tokens.is_complex() \
            or tokens.dtype == torch.bool:
        raise TypeError("padding_mask expects an integer tensor of token ids, got "
                        + (f"dtype {tokens.dtype}" if isinstance(tokens, Tensor)
                           else type(tokens).__name__))
    if isinstance(pad_id, bool) or not isinstance(pad_id, int):
        raise TypeError(f"pad_id must be an int, got {type(pad_id).__name__}")
    if tokens.ndim != 2:
        raise ValueError(f"padding_mask expects tokens of shape (B, S), got shape {tuple(tokens.shape)}")
    return (tokens != pad_id)[:, None, None, :]
