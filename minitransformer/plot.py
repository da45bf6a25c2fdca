"""Figures the book draws again and again: labelled matrices first (chapter 1 onwards).

Every function takes an optional matplotlib ``ax`` to draw into and returns the ``Axes`` it drew
on, so chapters can place several figures side by side.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np

# A matrix with at most this many cells gets its values written into the cells.
ANNOTATE_MAX_CELLS = 400


def _as_numpy(matrix) -> np.ndarray:
    """A numpy copy of a list, array or (possibly GPU, possibly grad-tracking) tensor."""
    if hasattr(matrix, "detach"):
        matrix = matrix.detach().cpu().numpy()
    return np.asarray(matrix, dtype=float)


def _format_cell(value: float) -> str:
    if value == int(value):
        return str(int(value))
    return f"{value:.2f}"


def heatmap(
    matrix,
    row_labels: Sequence[str] | None = None,
    col_labels: Sequence[str] | None = None,
    ax: plt.Axes | None = None,
    title: str | None = None,
    *,
    cmap: str = "Blues",
    annotate: bool | None = None,
    vmin: float | None = None,
    vmax: float | None = None,
) -> plt.Axes:
    """Draw a matrix as a grid of coloured cells with labelled rows and columns.

    Args:
        matrix: 2-D array-like or tensor of shape ``(rows, cols)``; a 1-D one is drawn as one row.
        row_labels: ``rows`` labels (for example the words the rows stand for).
        col_labels: ``cols`` labels.
        ax: the axes to draw into; a new figure is made when omitted.
        title: drawn above the matrix.
        cmap: a matplotlib colour map; a diverging one (``"RdBu"``) suits signed weights.
        annotate: write each value into its cell; by default only for small matrices.
        vmin, vmax: the ends of the colour scale (default: the data's range).

    Returns:
        The matplotlib ``Axes``.
    """
    values = _as_numpy(matrix)
    if values.ndim == 1:
        values = values[None, :]
    if values.ndim != 2:
        raise ValueError(f"heatmap draws a 2-D matrix, got shape {values.shape}")
    rows, cols = values.shape
    for name, labels, expected in (("row_labels", row_labels, rows), ("col_labels", col_labels, cols)):
        if labels is not None and len(labels) != expected:
            raise ValueError(f"{name} has {len(labels)} labels for a matrix of shape {values.shape}")
    if ax is None:
        _, ax = plt.subplots(figsize=(max(3.0, 0.55 * cols + 1.5), max(2.0, 0.45 * rows + 1.0)))
    image = ax.imshow(values, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
    ax.set_xticks(range(cols), col_labels if col_labels is not None else range(cols))
    ax.set_yticks(range(rows), row_labels if row_labels is not None else range(rows))
    if col_labels is not None and max((len(str(c)) for c in col_labels), default=0) > 3:
        ax.tick_params(axis="x", labelrotation=45)
        for label in ax.get_xticklabels():
            label.set_horizontalalignment("right")
    ax.tick_params(length=0)
    if annotate is None:
        annotate = rows * cols <= ANNOTATE_MAX_CELLS
    if annotate:
        low, high = image.get_clim()
        middle = (low + high) / 2
        diverging = cmap.lower().startswith(("rdbu", "coolwarm", "bwr", "seismic", "piyg", "prgn"))
        for r in range(rows):
            for c in range(cols):
                value = values[r, c]
                if diverging:
                    dark = abs(value - middle) > 0.3 * (high - low)
                else:
                    dark = value > middle
                ax.text(c, r, _format_cell(value), ha="center", va="center", fontsize=9,
                        color="white" if dark else "black")
    if title:
        ax.set_title(title)
    return ax
