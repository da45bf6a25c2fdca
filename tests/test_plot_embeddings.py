"""The figures of chapter 5: embedding scatter, positional-encoding heatmap, probability bars."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from minitransformer import (  # noqa: E402
    embedding_scatter,
    positional_encoding_heatmap,
    probability_bars,
    sinusoidal_positional_encoding,
)


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def test_embedding_scatter_labels_every_point():
    points = torch.tensor([[0.0, 1.0], [2.0, -1.0], [1.5, 0.5]], requires_grad=True)
    ax = embedding_scatter(points, ["battery", "program", "ran"], title="words")
    assert [t.get_text() for t in ax.texts] == ["battery", "program", "ran"]
    assert ax.get_title() == "words" and ax.get_xlabel() == "dimension 0"
    assert ax.collections[0].get_offsets().tolist() == [[0.0, 1.0], [2.0, -1.0], [1.5, 0.5]]


def test_embedding_scatter_rejects_bad_shapes():
    with pytest.raises(ValueError, match=r"points of shape \(n, 2\), got shape \(3, 3\)"):
        embedding_scatter(torch.zeros(3, 3), ["a", "b", "c"])
    with pytest.raises(ValueError, match="got 2 labels for 3 points"):
        embedding_scatter(torch.zeros(3, 2), ["a", "b"])


def test_positional_encoding_heatmap_has_labelled_axes_and_colour_bar():
    ax = positional_encoding_heatmap(sinusoidal_positional_encoding(20, 16))
    assert ax.get_xlabel().startswith("dimension") and ax.get_ylabel().startswith("position")
    assert len(ax.figure.axes) == 2  # the matrix and its colour bar
    assert ax.images[0].get_array().shape == (20, 16)
    with pytest.raises(ValueError, match=r"got shape \(5,\)"):
        positional_encoding_heatmap(torch.zeros(5))


def test_probability_bars_heights_labels_and_values():
    probs = torch.tensor([0.7, 0.2, 0.1])
    ax = probability_bars(probs, ["Paris", "London", "city"], title="next word")
    assert [round(p.get_height(), 4) for p in ax.patches] == [0.7, 0.2, 0.1]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["Paris", "London", "city"]
    assert [t.get_text() for t in ax.texts] == ["0.700", "0.200", "0.100"]
    with pytest.raises(ValueError, match="got 2 labels for 3 values"):
        probability_bars(probs, ["Paris", "London"])
    with pytest.raises(ValueError, match=r"1-D vector, got shape \(1, 3\)"):
        probability_bars(probs[None], ["a", "b", "c"])
