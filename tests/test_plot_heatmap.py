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
    ax = heatmap([[0.0, 0.5], [1.0, 0.25]], row_labels=["my", "ran"],
                 col_labels=["files", "down"], title="T")
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
    with pytest.raises(ValueError,
                       match="row_labels has 1 labels for a matrix of shape \\(2, 2\\)"):
        heatmap(np.eye(2), row_labels=["a"])
    with pytest.raises(ValueError, match="col_labels has 3 labels"):
        heatmap(np.eye(2), col_labels=["a", "b", "c"])
    with pytest.raises(ValueError, match="2-D matrix, got shape \\(2, 2, 2\\)"):
        heatmap(np.zeros((2, 2, 2)))


def test_masked_scores_are_marked_not_coloured():
    scores = torch.tensor([[0.5, float("-inf"), float("-inf")],
                           [1.0, 2.0, float("nan")],
                           [float("-inf"), -1.0, 0.0]])
    ax = heatmap(scores, title="scores")                    # no OverflowError from int(-inf)
    image = ax.images[0]
    not_coloured = np.ma.getmaskarray(image.get_array())
    assert not_coloured.tolist() == [[False, True, True], [False, False, True],
                                     [True, False, False]]
    assert image.get_clim() == (-1.0, 2.0)                 # the scale spans the finite values
    hatched = [p for p in ax.patches if p.get_hatch()]
    assert sorted((p.get_x() + 0.5, p.get_y() + 0.5) for p in hatched) == [(0, 2), (1, 0), (2, 0)]
    texts = [t.get_text() for t in ax.texts]
    assert texts.count("−∞") == 3 and texts.count("NaN") == 1 and "0.50" in texts


def test_masked_cells_of_a_large_matrix_get_a_legend():
    scores = torch.randn(30, 30).masked_fill(~torch.ones(30, 30, dtype=torch.bool).tril(),
                                             float("-inf"))
    ax = heatmap(scores)
    assert len(ax.texts) == 0
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["masked (−∞)"]
    assert len([p for p in ax.patches if p.get_hatch()]) == 30 * 29 // 2


def test_a_matrix_with_no_finite_value_still_draws():
    ax = heatmap(np.full((2, 2), -np.inf))
    assert ax.images[0].get_clim() == (0.0, 1.0)
    assert [t.get_text() for t in ax.texts] == ["−∞"] * 4
