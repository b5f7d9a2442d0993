"""Pictures of attention: labelled heatmaps, a grid of heads, curves (used from lesson 01 on)."""

from __future__ import annotations

import math

import numpy as np

from helpers._validate import positive_int

# One colour per role, shared by every heatmap here and every diagram in helpers.diagrams.
# Okabe & Ito (2008), "Color Universal Design": distinguishable with all common colour-vision
# deficiencies. Attention weights use viridis (also colour-blind safe and readable in grey).
ROLE_COLORS = {
    "query": "#D55E00",     # vermillion
    "key": "#0072B2",       # blue
    "value": "#009E73",     # bluish green
    "mask": "#CC79A7",      # reddish purple
    "position": "#E69F00",  # orange
    "weights": "#56B4E9",   # sky blue (attention weights and scores in diagrams)
    "other": "#7F7F7F",     # grey: layers without a role of their own (FFN, LayerNorm, ...)
}
WEIGHTS_CMAP = "viridis"


def mask_cmap():
    """Two-colour map for boolean masks: white = blocked (False), the mask colour = may attend (lesson 05)."""
    from matplotlib.colors import ListedColormap

    return ListedColormap(["#FFFFFF", ROLE_COLORS["mask"]], name="attention_mask")


def _as_numpy(x) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().to("cpu").float().numpy()
    return np.asarray(x, dtype=float)


def _check_labels(query_labels, key_labels, T: int, S: int, what: str) -> None:
    """One label per query row and per key column, or a clear error naming which list is off."""
    for name, labels, n in (("query_labels", query_labels, T), ("key_labels", key_labels, S)):
        if labels is not None and len(labels) != n:
            raise ValueError(f"{name} has {len(labels)} labels but {what} {n} along that axis")


def _label_positions(ax, T: int, S: int, query_labels, key_labels) -> None:
    """Tick every key column and query row (with its token when given) and name both axes."""
    ax.set_xticks(range(S), key_labels if key_labels is not None else range(S),
                  rotation=90 if key_labels is not None else 0)
    ax.set_yticks(range(T), query_labels if query_labels is not None else range(T))
    ax.set_xlabel("key position (attended to)")
    ax.set_ylabel("query position (attending)")


def attention_heatmap(weights, query_labels=None, key_labels=None, ax=None, title=None,
                      colorbar=True, vmax=None):
    """Draw a (T, S) attention-weight matrix with token labels: rows queries, columns keys (lesson 02)."""
    import matplotlib.pyplot as plt

    w = _as_numpy(weights)
    if w.ndim != 2:
        raise ValueError(f"weights must be 2-D (T, S), got shape {w.shape}; pick one head/item first")
    T, S = w.shape
    _check_labels(query_labels, key_labels, T, S, "weights have")
    if ax is None:
        _, ax = plt.subplots(figsize=(0.45 * S + 2.0, 0.45 * T + 1.5))
    top = float(w.max()) if vmax is None else float(vmax)
    image = ax.imshow(w, cmap=WEIGHTS_CMAP, vmin=0.0, vmax=max(1e-12, top), aspect="auto")
    _label_positions(ax, T, S, query_labels, key_labels)
    ax.set_title(title or "attention weights")
    if colorbar:
        ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="attention weight")
    return ax


def mask_heatmap(mask, query_labels=None, key_labels=None, ax=None, title=None, colorbar=True):
    """Draw a boolean (T, S) mask, True = may attend, with a two-colour bar saying so (lesson 05)."""
    import matplotlib.pyplot as plt

    m = _as_numpy(mask)
    if m.ndim != 2:
        raise ValueError(f"mask must be 2-D (T, S), got shape {m.shape}; pick one batch item and head first")
    if not np.isin(m, (0.0, 1.0)).all():
        raise ValueError("mask must be boolean (True = may attend) or hold only 0 and 1, "
                         f"got values {np.unique(m)[:5].tolist()}")
    T, S = m.shape
    _check_labels(query_labels, key_labels, T, S, "mask has")
    if ax is None:
        _, ax = plt.subplots(figsize=(0.45 * S + 2.5, 0.45 * T + 1.5))
    image = ax.imshow(m, cmap=mask_cmap(), vmin=0.0, vmax=1.0, aspect="auto")
    ax.set_xticks(np.arange(-0.5, S, 1), minor=True)
    ax.set_yticks(np.arange(-0.5, T, 1), minor=True)
    ax.grid(which="minor", color="#BBBBBB", linewidth=0.6)
    ax.tick_params(which="minor", length=0)
    _label_positions(ax, T, S, query_labels, key_labels)
    ax.set_title(title or "mask (True = may attend)")
    if colorbar:
        bar = ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04, ticks=[0.25, 0.75])
        bar.ax.set_yticklabels(["False:\nblocked", "True:\nmay attend"])
    return ax


def heads_grid(weights, query_labels=None, key_labels=None, ncols=4, title=None):
    """One heatmap panel per head for weights (H, T, S); returns the figure (lesson 04)."""
    import matplotlib.pyplot as plt

    w = _as_numpy(weights)
    if w.ndim != 3:
        raise ValueError(f"weights must be 3-D (H, T, S), got shape {w.shape}; pick one batch item")
    H = w.shape[0]
    if H == 0:
        raise ValueError(f"weights have no heads: shape {w.shape}, need (H, T, S) with H >= 1")
    ncols = min(positive_int(ncols, "ncols (panels per row)"), H)
    nrows = math.ceil(H / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.2 * ncols + 1.0, 3.0 * nrows), squeeze=False)
    top = max(1e-12, float(w.max()))  # one scale for all heads, so one colour bar reads them all
    for h, ax in enumerate(axes.flat):
        if h < H:
            attention_heatmap(w[h], query_labels, key_labels, ax=ax, title=f"head {h}", colorbar=False,
                              vmax=top)
        else:
            ax.axis("off")
    fig.suptitle(title or "attention weights, one panel per head")
    right = 1 - 1.0 / fig.get_size_inches()[0]  # keep the last inch for the colour bar and its label
    fig.tight_layout(rect=(0, 0, right, 1))
    cax = fig.add_axes((right + 0.1 / fig.get_size_inches()[0], 0.2, 0.15 / fig.get_size_inches()[0], 0.6))
    fig.colorbar(axes.flat[0].images[0], cax=cax, label="attention weight")
    return fig


def _plain_log_labels(axis):
    """Label a log axis with plain numbers (0.3, 1, 20), never "3x10^-1"; minor ticks only on short spans."""
    from matplotlib.ticker import FuncFormatter

    def plain(value, _):
        return f"{value:g}"

    def minor(value, _):
        low, high = sorted(abs(v) for v in axis.get_view_interval())
        if not (low > 0 and high / low < 30 and value > 0):  # 1.5 decades or more: the majors suffice
            return ""
        mantissa = round(value / 10 ** math.floor(math.log10(value)), 6)
        return f"{value:g}" if mantissa in (2, 3, 5) else ""  # 2, 3, 5: enough to read, never crowded

    axis.set_major_formatter(FuncFormatter(plain))
    axis.set_minor_formatter(FuncFormatter(minor))


def plot_curves(curves, xlabel, ylabel, title, ax=None, x=None, logx=False, logy=False,
                marker=None):
    """Plot named curves {label: values} on one titled, labelled axis (used by every lesson)."""
    import matplotlib.pyplot as plt

    if not curves:
        raise ValueError("curves is empty: pass {label: sequence of values}")
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 4))
    for label, values in curves.items():
        y = _as_numpy(values)
        xs = np.arange(len(y)) if x is None else _as_numpy(x)
        if len(xs) != len(y):
            raise ValueError(f"curve {label!r} has {len(y)} values but x has {len(xs)}")
        ax.plot(xs, y, label=label, marker=marker)
    ax.set_xscale("log" if logx else "linear")
    ax.set_yscale("log" if logy else "linear")
    for axis, log in ((ax.xaxis, logx), (ax.yaxis, logy)):
        if log:
            _plain_log_labels(axis)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    return ax


def encoding_image(pe, ax=None, title="sinusoidal positional encoding"):
    """Show a (length, d_model) positional encoding as an image: rows positions, columns features (lesson 06)."""
    import matplotlib.pyplot as plt

    pe = _as_numpy(pe)
    if pe.ndim != 2:
        raise ValueError(f"pe must be 2-D (length, d_model), got shape {pe.shape}")
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    image = ax.imshow(pe, cmap="RdBu", vmin=-1, vmax=1, aspect="auto")
    ax.set_xlabel("feature (even: sin, odd: cos)")
    ax.set_ylabel("position")
    ax.set_title(title)
    ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    return ax
