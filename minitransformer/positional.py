"""Where a word sits in the sentence: sinusoidal positional encodings (chapter 5).

Chapter 5 adds them to the word embeddings; the ``offset`` argument serves a generator that
encodes one new position at a time.
"""

from __future__ import annotations

import torch
from torch import Tensor

from minitransformer._checks import check_int, check_number, factory_kwargs


def sinusoidal_positional_encoding(
    num_positions: int,
    d_model: int,
    *,
    base: float = 10000.0,
    offset: int = 0,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """The fixed position vectors of Vaswani et al. (2017), section 3.5.

    For position ``pos`` and column pair ``i``::

        PE[pos, 2i]     = sin(pos / base ** (2i / d_model))
        PE[pos, 2i + 1] = cos(pos / base ** (2i / d_model))

    Each pair of columns turns round a circle at its own speed: fast in the first columns, slower
    and slower further right.

    Args:
        num_positions: how many positions (rows) to encode; 0 gives an empty ``(0, d_model)``.
        d_model: the vector size; must be even, as columns come in sin/cos pairs.
        base: the wavelength scale (10000 in the paper).
        offset: the first position encoded; rows are positions ``offset`` to
            ``offset + num_positions - 1`` (a generator with a cache encodes one new position at a
            time).
        device: where the table should live, usually ``x.device`` of the embeddings it is added
            to (default: the CPU, whatever torch's default device).
        dtype: a floating-point dtype, usually ``x.dtype`` (default: ``torch.get_default_dtype()``).

    Returns:
        float tensor of shape ``(num_positions, d_model)`` on ``device`` in ``dtype``; the values
        are the same on every device.

    Raises:
        TypeError: a count, size or offset that is not an int, a base that is not a number, or a
            ``dtype`` that is not a floating-point dtype.
        ValueError: a negative count or offset, an odd or non-positive ``d_model``, or a base that
            is not a positive finite number.
    """
    check_int("num_positions", num_positions, low=0)
    check_int("d_model", d_model)
    check_int("offset", offset, low=0)
    if d_model % 2:
        raise ValueError(f"d_model must be even (sin and cos columns come in pairs), got {d_model}")
    check_number("base", base, positive=True)
    factory_kwargs(device, dtype)
    # Angles in float64, explicitly on the CPU: positions in the thousands lose digits in float32
    # before the sine, and every device then receives the same numbers.
    cpu = {"dtype": torch.float64, "device": "cpu"}
    positions = torch.arange(offset, offset + num_positions, **cpu)[:, None]  # (P, 1)
    two_i = torch.arange(0, d_model, 2, **cpu)                                # (d_model/2,)
    angles = positions / base ** (two_i / d_model)                            # (P, d_model/2)
    encoding = torch.empty(num_positions, d_model, **cpu)
    encoding[:, 0::2] = torch.sin(angles)
    encoding[:, 1::2] = torch.cos(angles)
    return encoding.to(device="cpu" if device is None else device,
                       dtype=torch.get_default_dtype() if dtype is None else dtype)
