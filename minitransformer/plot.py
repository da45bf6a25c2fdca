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


# How a cell that is not a number to colour is drawn: -inf is a masked score (chapters 6-11).
MASKED_LABEL = "−∞"
MASKED_STYLE = {"facecolor": "#d9d9d9", "edgecolor": "#969696", "hatch": "///", "linewidth": 0}


def _format_cell(value: float) -> str:
    if np.isnan(value):
        return "NaN"
    if np.isinf(value):
        return MASKED_LABEL if value < 0 else "+∞"
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

    Cells that are not finite are not coloured as values: ``-inf`` (a masked score) is drawn
    grey and hatched, labelled "−∞" (or in a legend, when values are not written in the cells);
    NaN and ``+inf`` are left blank and labelled. The colour scale spans the finite values.

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
    for name, labels, expected in (("row_labels", row_labels, rows),
                                   ("col_labels", col_labels, cols)):
        if labels is not None and len(labels) != expected:
            raise ValueError(f"{name} has {len(labels)} labels for a matrix of shape "
                             f"{values.shape}")
    if ax is None:
        _, ax = plt.subplots(figsize=(max(3.0, 0.55 * cols + 1.5), max(2.0, 0.45 * rows + 1.0)))
    finite = np.isfinite(values)
    if not finite.any():  # nothing to scale the colours by
        vmin, vmax = (0.0 if vmin is None else vmin), (1.0 if vmax is None else vmax)
    colours = plt.get_cmap(cmap).with_extremes(bad="white")
    image = ax.imshow(np.ma.masked_invalid(values), cmap=colours, vmin=vmin, vmax=vmax,
                      aspect="auto")
    masked = np.argwhere(np.isneginf(values))
    for r, c in masked:
        ax.add_patch(plt.Rectangle((c - 0.5, r - 0.5), 1, 1, label="masked", **MASKED_STYLE))
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
                if not finite[r, c]:
                    dark = False
                elif diverging:
                    dark = abs(value - middle) > 0.3 * (high - low)
                else:
                    dark = value > middle
                ax.text(c, r, _format_cell(value), ha="center", va="center", fontsize=9,
                        color="white" if dark else "black")
    elif len(masked):
        ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, **MASKED_STYLE)],
                  labels=[f"masked ({MASKED_LABEL})"], loc="upper left",
                  bbox_to_anchor=(1.01, 1), fontsize=8, frameon=False)
    if title:
        ax.set_title(title)
    return ax


def _chain_layers(edges: dict[int, list[int]], nodes: list[int]) -> dict[int, int]:
    """A column for each node: the longest path to it from a start, ignoring edges that close a
    loop."""
    state: dict[int, int] = {}  # 1 = on the current path, 2 = done
    order: list[int] = []
    loop_edges: set[tuple[int, int]] = set()

    def visit(node: int) -> None:
        state[node] = 1
        for nxt in edges[node]:
            if state.get(nxt) == 1:
                loop_edges.add((node, nxt))
            elif nxt not in state:
                visit(nxt)
        state[node] = 2
        order.append(node)

    has_incoming = {j for i in nodes for j in edges[i] if j != i}
    for node in [n for n in nodes if n not in has_incoming] + nodes:
        if node not in state:
            visit(node)
    layer = {node: 0 for node in nodes}
    for node in reversed(order):  # a topological order of the graph without its loop edges
        for nxt in edges[node]:
            if nxt != node and (node, nxt) not in loop_edges:
                layer[nxt] = max(layer[nxt], layer[node] + 1)
    return layer


def _arc_middle(ax: plt.Axes, p1: tuple[float, float], p2: tuple[float, float], rad: float):
    """Where the middle of matplotlib's ``arc3`` curve from p1 to p2 lands, worked out at draw
    time: the curve bends in display coordinates, which change when the figure is laid out."""
    from matplotlib.transforms import Affine2D

    def transform(renderer) -> Affine2D:
        start, end = ax.transData.transform([p1, p2])
        dx, dy = end - start
        middle = (start + end) / 2 + 0.5 * rad * np.array([dy, -dx])
        return Affine2D().translate(*middle)
    return transform


def chain_graph(
    matrix,
    vocab: Sequence[str],
    ax: plt.Axes | None = None,
    title: str | None = None,
    *,
    decimals: int = 2,
) -> plt.Axes:
    """Draw a first-order Markov model as a chain: words as boxes, arrows labelled with
    probabilities.

    Words are placed in columns from left to right by how far they are from a starting word (one
    nothing leads to); an arrow is drawn for every non-zero transition, thicker for likelier ones,
    curved when it skips a column or runs backwards. A word with no arrows in or out is left out.

    Args:
        matrix: array-like or tensor of shape ``(N, N)``: row = current word, column = next word.
        vocab: the N words (a list or a :class:`~minitransformer.vocab.Vocabulary`).
        ax: the axes to draw into; a new figure is made when omitted.
        title: drawn above the chain.
        decimals: how many decimals the edge labels show.

    Returns:
        The matplotlib ``Axes``.
    """
    values = _as_numpy(matrix)
    words = list(vocab)
    if values.ndim != 2 or values.shape[0] != values.shape[1]:
        raise ValueError(f"chain_graph draws a square transition matrix, got shape {values.shape}")
    if values.shape[0] != len(words):
        raise ValueError(f"matrix of shape {values.shape} does not match {len(words)} words")
    if not np.all(np.isfinite(values)) or np.any(values < 0):
        raise ValueError("chain_graph expects finite, non-negative transition probabilities")
    n = len(words)
    edges = {i: [j for j in range(n) if values[i, j] > 0] for i in range(n)}
    nodes = [i for i in range(n) if edges[i] or values[:, i].any()]
    layer = _chain_layers(edges, nodes)
    columns: dict[int, list[int]] = {}
    for node in nodes:
        columns.setdefault(layer[node], []).append(node)
    pos: dict[int, tuple[float, float]] = {}
    for column in sorted(columns):
        members = columns[column]
        # order a column by where its predecessors sit, so arrows cross as little as possible
        def height(node: int) -> float:
            before = [pos[i][1] for i in nodes if node in edges[i] and i in pos]
            return -np.mean(before) if before else float(node)
        members.sort(key=height)
        for k, node in enumerate(members):
            pos[node] = (float(column), (len(members) - 1) / 2 - k)
    width, height_ = max(columns) + 1, max(len(m) for m in columns.values())
    if ax is None:
        _, ax = plt.subplots(figsize=(max(4.0, 1.9 * width), max(2.0, 1.1 * height_ + 0.8)))
    ax.set_xlim(-0.6, width - 0.4)
    ax.set_ylim(-height_ / 2 - 0.1, height_ / 2 + 0.25)
    boxes = {node: ax.text(*pos[node], words[node], ha="center", va="center", fontsize=10,
                           bbox=dict(boxstyle="round,pad=0.35", facecolor="#deebf7",
                                     edgecolor="#3182bd"))
             for node in nodes}
    for i in nodes:
        for j in edges[i]:
            p = values[i, j]
            label = f"{p:.{decimals}f}"
            if i == j:
                ax.text(pos[i][0], pos[i][1] + 0.3, f"↻ {label}", ha="center", va="bottom",
                        fontsize=8, color="#08519c")
                continue
            straight = layer[j] == layer[i] + 1
            rad = 0.0 if straight else 0.35
            ax.annotate("", xy=(0.5, 0.5), xycoords=boxes[j], xytext=(0.5, 0.5),
                        textcoords=boxes[i],
                        arrowprops=dict(arrowstyle="-|>", color="#08519c", lw=0.8 + 2.2 * p,
                                        shrinkA=1, shrinkB=1, patchA=boxes[i].get_bbox_patch(),
                                        patchB=boxes[j].get_bbox_patch(),
                                        connectionstyle=f"arc3,rad={rad}"))
            ax.annotate(label, xy=(0, 0), xycoords=_arc_middle(ax, pos[i], pos[j], rad),
                        ha="center", va="center", fontsize=8, color="#08519c",
                        bbox=dict(boxstyle="round,pad=0.15", facecolor="white", edgecolor="none"))
    ax.set_axis_off()
    if title:
        ax.set_title(title)
    return ax


def embedding_scatter(
    points,
    labels: Sequence[str],
    ax: plt.Axes | None = None,
    title: str | None = None,
    *,
    xlabel: str = "dimension 0",
    ylabel: str = "dimension 1",
) -> plt.Axes:
    """Draw 2-D word vectors as labelled points (chapter 5).

    Args:
        points: array-like or tensor of shape ``(n, 2)``, one row per word.
        labels: the ``n`` words, written next to their points.
        ax: the axes to draw into; a new figure is made when omitted.
        title: drawn above the plot.
        xlabel, ylabel: names of the two axes.

    Returns:
        The matplotlib ``Axes``.
    """
    values = _as_numpy(points)
    if values.ndim != 2 or values.shape[1] != 2:
        raise ValueError(f"embedding_scatter draws points of shape (n, 2), got shape "
                         f"{values.shape}")
    if len(labels) != len(values):
        raise ValueError(f"embedding_scatter got {len(labels)} labels for {len(values)} points")
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 4.5))
    ax.scatter(values[:, 0], values[:, 1], color="tab:blue", zorder=2)
    for (x, y), label in zip(values, labels):
        ax.annotate(str(label), (x, y), xytext=(4, 4), textcoords="offset points", fontsize=9)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.set_aspect("equal", adjustable="datalim")
    if title:
        ax.set_title(title)
    return ax


def positional_encoding_heatmap(
    encoding,
    ax: plt.Axes | None = None,
    title: str | None = "Sinusoidal positional encoding",
) -> plt.Axes:
    """Draw a positional encoding, positions down and dimensions across, with a colour bar
    (chapter 5).

    Args:
        encoding: array-like or tensor of shape ``(num_positions, d_model)``.
        ax: the axes to draw into; a new figure is made when omitted.
        title: drawn above the matrix.

    Returns:
        The matplotlib ``Axes``.
    """
    values = _as_numpy(encoding)
    if values.ndim != 2:
        raise ValueError(f"positional_encoding_heatmap draws a (positions, d_model) matrix, "
                         f"got shape {values.shape}")
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    image = ax.imshow(values, cmap="RdBu", vmin=-1, vmax=1, aspect="auto", interpolation="nearest")
    ax.figure.colorbar(image, ax=ax, label="value")
    ax.set_xlabel("dimension (column of the encoding)")
    ax.set_ylabel("position in the sentence")
    if title:
        ax.set_title(title)
    return ax


def probability_bars(
    probabilities,
    labels: Sequence[str],
    ax: plt.Axes | None = None,
    title: str | None = None,
    *,
    ylabel: str = "probability",
    annotate: bool = True,
) -> plt.Axes:
    """Draw one bar per word, its height the word's probability (chapter 5).

    Args:
        probabilities: array-like or tensor of shape ``(n,)``.
        labels: the ``n`` words under the bars.
        ax: the axes to draw into; a new figure is made when omitted.
        title: drawn above the bars.
        ylabel: name of the vertical axis.
        annotate: write each value (3 decimals) above its bar.

    Returns:
        The matplotlib ``Axes``.
    """
    values = _as_numpy(probabilities)
    if values.ndim != 1:
        raise ValueError(f"probability_bars draws a 1-D vector, got shape {values.shape}")
    if len(labels) != len(values):
        raise ValueError(f"probability_bars got {len(labels)} labels for {len(values)} values")
    if ax is None:
        _, ax = plt.subplots(figsize=(max(3.0, 0.6 * len(values) + 1.5), 3))
    bars = ax.bar(range(len(values)), values, color="tab:blue")
    ax.set_xticks(range(len(values)), [str(label) for label in labels])
    ax.set_ylabel(ylabel)
    if values.size and values.min() >= 0:
        ax.set_ylim(0, max(1.0, float(values.max())) * 1.12)
    if annotate:
        ax.bar_label(bars, labels=[f"{v:.3f}" for v in values], fontsize=8)
    if title:
        ax.set_title(title)
    return ax
