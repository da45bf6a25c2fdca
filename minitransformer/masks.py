"""Attention masks: which keys each query may look at (chapter 6).

Every mask in this package is boolean with **True = may attend**, the convention of
``torch.nn.functional.scaled_dot_product_attention``. (``nn.MultiheadAttention`` uses the opposite:
there True means *masked*, so pass ``~mask`` to it.)
"""

from __future__ import annotations

import torch
from torch import Tensor

from minitransformer._checks import check_device, check_int, check_int_tensor


def causal_mask(q_len: int, k_len: int | None = None, *,
                device: torch.device | str | None = None) -> Tensor:
    """The mask that lets each position look only at itself and the positions before it.

    The queries are the *last* ``q_len`` of the ``k_len`` positions ("lower-right" alignment):
    key ``j`` is visible to query ``i`` when ``j <= i + k_len - q_len``. With ``k_len == q_len``
    this is the usual lower triangle; with ``k_len > q_len`` it is what generation with cached keys
    needs, where a few new queries follow many earlier keys. (PyTorch's ``is_causal=True`` aligns to
    the upper left instead.)

    Args:
        q_len: the number of queries T_q.
        k_len: the number of keys T_k (default: ``q_len``); at least ``q_len``.
        device: where to create the mask (default: the CPU, whatever torch's default device).

    Returns:
        A boolean tensor of shape ``(q_len, k_len)``, True where the query may attend to the key.

    Raises:
        TypeError: a length is not an int.
        ValueError: a length is below 1, or ``k_len < q_len`` (the first queries would see no key).
    """
    q_len = check_int("q_len", q_len)
    k_len = q_len if k_len is None else check_int("k_len", k_len)
    if k_len < q_len:
        raise ValueError(f"causal_mask needs k_len >= q_len, got q_len={q_len} and k_len={k_len}: "
                         f"the first {q_len - k_len} queries would have no key to attend to")
    device = check_device(device) or torch.device("cpu")
    query_positions = torch.arange(k_len - q_len, k_len, device=device)[:, None]  # (T_q, 1)
    key_positions = torch.arange(k_len, device=device)[None, :]                    # (1, T_k)
    return key_positions <= query_positions


def padding_mask(tokens: Tensor, pad_id: int) -> Tensor:
    """The mask that hides padding: True where the key is a real token.

    Args:
        tokens: integer token ids of shape ``(B, T_k)``, shorter sentences filled up with
            ``pad_id``.
        pad_id: the id used for padding.

    Returns:
        A boolean tensor of shape ``(B, 1, 1, T_k)`` on the device of ``tokens``; it broadcasts
        over heads and queries ``(B, h, T_q, T_k)``.

    Raises:
        TypeError: ``tokens`` is not an integer tensor, or ``pad_id`` is not an int.
        ValueError: ``tokens`` is not 2-D, or ``pad_id`` is negative.
    """
    check_int_tensor("tokens", tokens, ndim=2)
    check_int("pad_id", pad_id, low=0)
    return (tokens != pad_id)[:, None, None, :]     # (B, 1, 1, T_k)
