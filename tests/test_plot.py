"""helpers.plot: the attention heatmap and the grid of heads."""

import matplotlib
import pytest
import torch

matplotlib.use("Agg")


def test_plot_heatmap_and_grid():
    from helpers.plot import attention_heatmap, heads_grid

    ax = attention_heatmap(torch.rand(3, 4), ["a", "b", "c"], list("wxyz"))
    assert ax.get_title() == "attention weights" and ax.get_xlabel() and ax.get_ylabel()
    with pytest.raises(ValueError, match=r"key_labels has 2 labels but weights have 4"):
        attention_heatmap(torch.rand(3, 4), None, ["a", "b"])
    fig = heads_grid(torch.rand(3, 4, 4))
    assert len([a for a in fig.axes if a.get_title().startswith("head")]) == 3
    for bad in (0, -2, 1.5):
        with pytest.raises(ValueError, match=rf"ncols \(panels per row\) must be a positive int, got {bad}"):
            heads_grid(torch.rand(3, 4, 4), ncols=bad)
    with pytest.raises(ValueError, match=r"weights have no heads: shape \(0, 4, 4\)"):
        heads_grid(torch.rand(0, 4, 4))
    fig = heads_grid(torch.rand(3, 4, 4), ncols=2)  # 2 + 1 panels, the fourth slot left blank
    assert [a.get_title() for a in fig.axes if a.get_title().startswith("head")] == ["head 0", "head 1", "head 2"]
    assert fig.axes[0].get_subplotspec().get_gridspec().get_geometry() == (2, 2)
    matplotlib.pyplot.close("all")
