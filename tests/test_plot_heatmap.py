"""The labelled-matrix figure used throughout the book (minitransformer.plot.heatmap)."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from minitransformer import heatmap  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def test_labels_title_and_values_are_drawn():
    ax = heatmap([[0.0, 0.5], [1.0, 0.25]], row_labels=["my", "ran"], col_labels=["files", "down"], title="T")
    assert [t.get_text() for t in ax.get_yticklabels()] == ["my", "ran"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["files", "down"]
    assert ax.get_title() == "T"
    assert sorted(t.get_text() for t in ax.texts) == ["0", "0.25", "0.50", "1"]


def test_large_matrices_are_not_annotated_and_tensors_are_accepted():
    ax = heatmap(torch.ones(30, 30, requires_grad=True))
    assert len(ax.texts) == 0
    assert ax.images[0].get_array().shape == (30, 30)


def test_draws_into_a_given_axes_and_accepts_a_vector():
    _, axes = plt.subplots(1, 2)
    assert heatmap(np.arange(3.0), ax=axes[1]) is axes[1]
    assert axes[1].images[0].get_array().shape == (1, 3)


def test_wrong_label_count_or_rank_is_an_error():
    with pytest.raises(ValueError, match="row_labels has 1 labels for a matrix of shape \\(2, 2\\)"):
        heatmap(np.eye(2), row_labels=["a"])
    with pytest.raises(ValueError, match="col_labels has 3 labels"):
        heatmap(np.eye(2), col_labels=["a", "b", "c"])
    with pytest.raises(ValueError, match="2-D matrix, got shape \\(2, 2, 2\\)"):
        heatmap(np.zeros((2, 2, 2)))
