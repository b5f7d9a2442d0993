"""Architecture diagrams drawn from the lesson's own sizes (lessons 01-13).

Every diagram function takes the sizes it labels and returns a matplotlib ``Figure``, so a
picture cannot disagree with the numbers of the lesson that draws it. Colours follow
``helpers.plot.ROLE_COLORS`` (queries, keys, values, masks, positions, weights), the same
colours the heatmaps use.

Diagrams, by lesson:

- 01 ``seq2seq_diagram``: RNN encoder-decoder with one fixed context vector, beside the same
  with attention (a new context per output step, lines weighted by the attention weights).
- 01/02 ``rnn_vs_attention_path_diagram``: the sequential path of an RNN beside self-attention.
- 02 ``qkv_diagram``: one query's journey, X -> Q, K, V -> scores -> scale -> softmax -> sum.
- 04 ``multi_head_diagram``: split C into H heads of D, attend per head, concatenate, W_o.
- 05 ``mask_diagram``: which (query, key) pairs causal, padding and both masks keep.
- 06 ``positional_rotation_diagram``: a sinusoid pair on a circle, and RoPE rotating q and k.
- 07 ``pre_post_ln_diagram``: Post-LN and Pre-LN blocks side by side.
- 08 ``encoder_decoder_diagram``: the whole encoder-decoder Transformer of a config.
- 09 ``kv_cache_diagram``: a KV cache growing by one key/value per generated token.
- 12 ``gpt_diagram``: a decoder-only GPT, its tied embedding and one KV cache per block.
- 13 ``induction_circuit_diagram``: a previous-token head in layer 1 and an induction head in
  layer 2 that reads its output through the keys (K-composition).
"""

from __future__ import annotations

import math

import numpy as np

from helpers._validate import as_int, check_heads, positive_int, require_choice
from helpers.plot import ROLE_COLORS, mask_cmap

__all__ = ["seq2seq_diagram", "rnn_vs_attention_path_diagram", "qkv_diagram", "softmax_gradient_diagram",
           "multi_head_diagram", "mask_diagram", "positional_rotation_diagram", "pre_post_ln_diagram",
           "encoder_decoder_diagram", "kv_cache_diagram", "flash_tiles_diagram", "minilm_diagram", "gpt_diagram",
           "box", "arrow", "token_row", "tensor", "legend", "canvas"]

FONT = 10  # points; at 100 dpi every label stays readable at 100 % zoom
SMALL = 9


# --- the order test's tags ----------------------------------------------------------------------


def _flow(column: int, direction: str, *kinds: str) -> str:
    """The tag of a box that stands for sub-modules ``kinds`` of a model, in the order its forward calls them.

    Architecture diagrams tag their boxes so that ``tests/test_diagrams.py`` can read them in the
    order of the arrows (``direction`` "up" or "right" within ``column``) and compare that order with
    the calls the model's forward makes (forward hooks). Kinds: "embed", "pos", "norm", "attn"
    (self-attention), "cross" (cross-attention), "ff", "head" (the output layer), or a sub-module's name.
    """
    return f"flow:{column}:{direction}:{','.join(kinds)}"


def _frame(column: int, times: int) -> str:
    """The tag of a frame whose boxes stand for ``times`` repetitions (a layer drawn once, run ``times``)."""
    return f"frame:{column}:{times}"


# --- validation --------------------------------------------------------------------------------


def _heads(d_model, n_heads) -> int:
    d_model = positive_int(d_model, "d_model")
    n_heads = positive_int(n_heads, "n_heads")
    check_heads(d_model, n_heads)
    return d_model // n_heads


def _labels(name: str, tokens, n: int, default: str) -> list[str]:
    if tokens is None:
        return [default.format(i) for i in range(n)]
    tokens = [str(t) for t in tokens]
    if len(tokens) != n:
        raise ValueError(f"{name} has {len(tokens)} entries but the diagram has {n} positions")
    return tokens


def _sizes(config, **given):
    """Sizes from a TransformerConfig-like object, overridden by explicit keyword values, each a positive int.

    With d_model and n_heads among them, the head width is added as "D" (d_model must divide by n_heads).
    """
    out = {}
    for name, value in given.items():
        if value is None and config is not None:
            value = getattr(config, name, None)
        if value is None:
            raise ValueError(f"{name} is missing: pass a TransformerConfig as config or {name}=...")
        out[name] = value if name in ("d_model", "n_heads") else positive_int(value, name)
    if "d_model" in out and "n_heads" in out:
        out["D"] = _heads(out["d_model"], out["n_heads"])
    return out


# --- primitives --------------------------------------------------------------------------------


def _tint(color, amount: float = 0.75):
    """The colour mixed with white (amount 0 = colour, 1 = white), for light box fills."""
    from matplotlib.colors import to_rgb

    r, g, b = to_rgb(color)
    return (r + (1 - r) * amount, g + (1 - g) * amount, b + (1 - b) * amount)


def canvas(width: float, height: float, title: str):
    """A blank figure whose data coordinates are inches, with a title (lesson 01)."""
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(width, height), dpi=100)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.axis("off")
    ax.text(width / 2, height - 0.12, title, ha="center", va="top", fontsize=FONT + 2, weight="bold")
    return fig, ax


def _fit_height(fig, ax, height):
    """Crop or extend a canvas to a new height in inches, keeping the title on top."""
    width = fig.get_size_inches()[0]
    fig.set_size_inches(width, height)
    ax.set_ylim(0, height)
    ax.texts[0].set_y(height - 0.12)


def box(ax, x, y, w, h, text="", role="other", fontsize=FONT, fill=True, lw=1.5, flow=None, **text_kw):
    """A rounded box centred at (x, y), coloured by role, with centred text (lesson 01).

    ``flow`` tags a box of an architecture diagram with the sub-modules it stands for (see ``_flow``).
    """
    from matplotlib.patches import FancyBboxPatch

    color = ROLE_COLORS.get(role, role)
    patch = FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0,rounding_size=0.06",
                           facecolor=_tint(color) if fill else "white", edgecolor=color, linewidth=lw, gid=flow)
    ax.add_patch(patch)
    if text:
        ax.text(x, y, text, ha="center", va="center", fontsize=fontsize, **text_kw)
    return patch


def arrow(ax, start, end, role="other", lw=1.4, alpha=1.0, text=None, style="-|>", fontsize=SMALL,
          text_offset=(0.0, 0.12), **kw):
    """An arrow from start to end, coloured by role, with an optional label at its middle (lesson 01)."""
    from matplotlib.patches import FancyArrowPatch

    color = ROLE_COLORS.get(role, role)
    patch = FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=11, color=color, linewidth=lw,
                            alpha=alpha, shrinkA=1, shrinkB=1, **kw)
    ax.add_patch(patch)
    if text:
        mx, my = (start[0] + end[0]) / 2 + text_offset[0], (start[1] + end[1]) / 2 + text_offset[1]
        ax.text(mx, my, text, ha="center", va="bottom", fontsize=fontsize, color="black")
    return patch


def token_row(ax, tokens, x0, y, width, h=0.36, role="other", fontsize=FONT, max_w=0.6):
    """A row of small boxes, one per token, left edge x0, spread over width; returns their centres (lesson 01)."""
    n = len(tokens)
    step = min(width / max(n, 1), max_w + 0.1)
    w = step * 0.85
    centres = []
    for i, tok in enumerate(tokens):
        x = x0 + step * (i + 0.5)
        box(ax, x, y, w, h, str(tok), role=role, fontsize=fontsize)
        centres.append(x)
    return centres


def tensor(ax, x, y, w, h, name, shape, role="other", fontsize=FONT, flow=None):
    """A tensor as a labelled block: its name on top, its shape below, coloured by role (lesson 02)."""
    box(ax, x, y, w, h, role=role, flow=flow)
    ax.text(x, y + 0.11, name, ha="center", va="center", fontsize=fontsize + 1, weight="bold")
    ax.text(x, y - 0.14, shape, ha="center", va="center", fontsize=SMALL)


def legend(ax, x, y, roles, fontsize=SMALL):
    """A one-line legend of role colours starting at (x, y) (lesson 02)."""
    for role, label in roles:
        box(ax, x + 0.12, y, 0.22, 0.2, role=role)
        t = ax.text(x + 0.3, y, label, ha="left", va="center", fontsize=fontsize)
        x += 0.45 + 0.075 * len(label)
    return t


# --- 01: encoder-decoder with and without attention --------------------------------------------


def seq2seq_diagram(source, target, weights=None, hidden_size=None, values="states"):
    """RNN encoder-decoder: one fixed context vector vs a new context per step from attention (lesson 01).

    ``source`` and ``target`` are token sequences (or lengths S and T); ``weights`` (T, S), if
    given, sets the darkness of each line from encoder state j to decoder step i. ``values`` says
    what the weights sum: "states" h_j (Bahdanau et al. 2015) or "embeddings" e(x_j) (lesson 01's model).
    """
    require_choice(values, "values", ("states", "embeddings"))
    src = _labels("source", range(source), source, "{}") if isinstance(source, int) else [str(t) for t in source]
    tgt = _labels("target", range(target), target, "{}") if isinstance(target, int) else [str(t) for t in target]
    S, T = as_int(len(src), "len(source)", 1, 40), as_int(len(tgt), "len(target)", 1, 40)
    if weights is not None:
        w = np.asarray(weights.detach().cpu() if hasattr(weights, "detach") else weights, dtype=float)
        if w.shape != (T, S):
            raise ValueError(f"weights must have shape (T, S) = ({T}, {S}), got {w.shape}")
    else:
        w = np.full((T, S), 1.0 / S)
    hid = "" if hidden_size is None else f", {positive_int(hidden_size, 'hidden_size')} numbers"
    width = 10.5
    fig, ax = canvas(width, 8.7, f"RNN encoder-decoder, S = {S} source tokens, T = {T} output steps")
    def half(y0, attention):
        x0, span = 1.65, width - 1.95
        ax.text(0.15, y0 + 1.75, "encoder", fontsize=FONT, va="center")
        ax.text(0.15, y0 + 2.95, "decoder", fontsize=FONT, va="center")
        xs = token_row(ax, src, x0, y0 + 1.1, span, role="other", fontsize=SMALL)
        hs = token_row(ax, [f"h{j}" for j in range(S)], x0, y0 + 1.75, span, role="key", fontsize=SMALL)
        for a, b in zip(hs[:-1], hs[1:], strict=True):
            arrow(ax, (a + 0.2, y0 + 1.75), (b - 0.2, y0 + 1.75), role="key", lw=1)
        for x in xs:
            arrow(ax, (x, y0 + 1.29), (x, y0 + 1.56), lw=1)
        # s_0 = tanh(W_init c) starts the decoder and writes nothing; step i (from 1) writes output i from s_i
        ys = token_row(ax, [f"s{i + 1}" for i in range(T)], x0, y0 + 2.95, span, role="query", fontsize=SMALL)
        s0 = x0 - 0.5
        box(ax, s0, y0 + 2.95, 0.42, 0.36, "s0", role="query", fontsize=SMALL)
        ax.text(s0, y0 + 3.2, "start", ha="center", va="bottom", fontsize=SMALL - 1)
        chain = [s0] + list(ys)
        for a, b in zip(chain[:-1], chain[1:], strict=True):  # the decoder is recurrent too: s_i reads s_(i-1)
            arrow(ax, (a + 0.2, y0 + 2.95), (b - 0.2, y0 + 2.95), role="query", lw=1)
        outs = token_row(ax, tgt, x0, y0 + 3.6, span, fontsize=SMALL)
        for x in outs:
            arrow(ax, (x, y0 + 3.14), (x, y0 + 3.41), lw=1)
        if not attention:
            cx = x0 + span + 0.05
            box(ax, cx, y0 + 2.35, 0.45, 0.36, "c", role="value")
            arrow(ax, (hs[-1] + 0.2, y0 + 1.8), (cx, y0 + 2.16), role="key")
            for x in [s0] + list(ys):  # c sets s_0 and is read again at every step
                arrow(ax, (cx - 0.22, y0 + 2.35), (x, y0 + 2.76), role="value", lw=0.9)
            ax.text(x0, y0 + 0.55, f"one context vector c (the encoder's final states{hid}) sets s0 and is read "
                    f"at all {T} steps:\nevery output must come from it", fontsize=FONT, va="center")
        else:
            top = max(float(w.max()), 1e-12)
            for i, xi in enumerate(ys):
                for j, xj in enumerate(hs):
                    if w[i, j] > 0.02 * top:
                        ax.plot([xj, xi], [y0 + 1.93, y0 + 2.76], color="#222222",
                                lw=0.4 + 2.0 * w[i, j] / top, alpha=0.15 + 0.85 * w[i, j] / top)
            what = "weights given" if weights is not None else "uniform weights (none given)"
            read = "c_i = sum_j a_ij h_j" if values == "states" else "c_i = sum_j a_ij e(x_j), the source embeddings"
            ax.text(x0, y0 + 0.55, f"step i scores all {S} encoder states h_j and reads its own context "
                    f"{read};\nline darkness and width = a_ij ({what})", fontsize=FONT, va="center")

    ax.text(0.15, 7.95, "without attention (Cho et al. 2014)", fontsize=FONT + 1, weight="bold")
    half(4.0, attention=False)
    ax.text(0.15, 3.75, "with attention (Bahdanau et al. 2015)", fontsize=FONT + 1, weight="bold")
    half(-0.2, attention=True)
    return fig


# --- 01/02: path lengths -----------------------------------------------------------------------


def rnn_vs_attention_path_diagram(T, tokens=None):
    """An RNN's T sequential steps (path length T - 1) beside self-attention's one step (lesson 02)."""
    T = as_int(T, "T", 1, 24)
    labels = _labels("tokens", tokens, T, "x{}")
    width = 10.0
    fig, ax = canvas(width, 5.8, f"How far apart are the first and the last of T = {T} tokens?")
    x0, span = 1.6, width - 1.9
    ax.text(0.15, 4.6, "RNN", fontsize=FONT + 1, weight="bold")
    xs = token_row(ax, labels, x0, 3.75, span, fontsize=SMALL)
    hs = token_row(ax, [f"h{t}" for t in range(T)], x0, 4.45, span, role="key", fontsize=SMALL)
    for a, b in zip(hs[:-1], hs[1:], strict=True):
        arrow(ax, (a + 0.18, 4.45), (b - 0.18, 4.45), role="query", lw=2)
    for x in xs:
        arrow(ax, (x, 3.94), (x, 4.26), lw=1)
    ax.text(x0, 3.2, f"{T} steps one after another: token 0 reaches h{T - 1} through {T - 1} recurrent steps\n"
            "(path length grows with T), and the steps cannot run in parallel", fontsize=FONT, va="center")
    ax.text(0.15, 2.45, "self-attention", fontsize=FONT + 1, weight="bold")
    xs = token_row(ax, labels, x0, 0.95, span, fontsize=SMALL)
    ys = token_row(ax, [f"y{t}" for t in range(T)], x0, 2.3, span, role="weights", fontsize=SMALL)
    for xi in ys:
        for xj in xs:
            ax.plot([xj, xi], [1.14, 2.11], color="#BBBBBB", lw=0.6, zorder=0)
    arrow(ax, (xs[0], 1.14), (ys[-1], 2.11), role="query", lw=2.4)
    ax.text(x0, 0.35, f"every output sees all {T} tokens through one (T, T) = ({T}, {T}) matrix of weights:\n"
            "token 0 reaches the last output in 1 step (path length 1, whatever T is)", fontsize=FONT, va="center")
    return fig


# --- 02: one query's journey --------------------------------------------------------------------


def qkv_diagram(T, C, D, query_index=None, S=None):
    """One query's journey: X -> W_Q, W_K, W_V -> scores -> / sqrt(D) -> softmax -> sum of values (lesson 02)."""
    T, C, D = positive_int(T, "T"), positive_int(C, "C"), positive_int(D, "D")
    S = T if S is None else positive_int(S, "S")
    t = T - 1 if query_index is None else query_index
    t = as_int(t, "query_index (a position in [0, T))", 0, T - 1)
    self_attn = "self-attention, S = T" if S == T else "S keys from another sequence"
    fig, ax = canvas(11.0, 5.75, f"one query's journey: T = {T}, S = {S} ({self_attn}), C = {C}, D = {D}")
    # inputs and projections
    tensor(ax, 0.85, 2.6, 1.3, 0.8, "X", f"(T, C) = ({T}, {C})")
    rows = {"query": 4.0, "key": 2.6, "value": 1.2}
    names = {"query": ("W_Q", "Q", f"(T, D) = ({T}, {D})"), "key": ("W_K", "K", f"(S, D) = ({S}, {D})"),
             "value": ("W_V", "V", f"(S, D) = ({S}, {D})")}
    for role, y in rows.items():
        w_name, out, shape = names[role]
        arrow(ax, (1.5, 2.6), (2.15, y), role=role)
        tensor(ax, 2.8, y, 1.25, 0.7, w_name, f"(C, D) = ({C}, {D})", role=role)
        arrow(ax, (3.43, y), (3.9, y), role=role)
        tensor(ax, 4.6, y, 1.35, 0.7, out, shape, role=role)
    # the chosen query row
    tensor(ax, 4.6, 4.85, 1.35, 0.55, f"q = Q[{t}]", f"(D,) = ({D},)", role="query")
    arrow(ax, (4.6, 4.35), (4.6, 4.57), role="query")
    # scores, scale, softmax, sum
    tensor(ax, 6.3, 3.3, 1.5, 0.75, "scores K q", f"(S,) = ({S},)", role="weights")
    arrow(ax, (5.28, 4.85), (5.55, 3.55), role="query")
    arrow(ax, (5.28, 2.6), (5.55, 3.1), role="key")
    tensor(ax, 7.95, 3.3, 1.3, 0.75, "/ sqrt(D)", f"sqrt({D}) = {math.sqrt(D):.3g}", role="weights")
    arrow(ax, (7.05, 3.3), (7.3, 3.3), role="weights")
    tensor(ax, 9.6, 3.3, 1.7, 0.75, "softmax", f"a: (S,) = ({S},), sums to 1", role="weights")
    arrow(ax, (8.6, 3.3), (8.75, 3.3), role="weights")
    tensor(ax, 9.6, 1.2, 1.6, 0.75, "sum_s a_s V[s]", f"(D,) = ({D},)", role="value")
    arrow(ax, (9.6, 2.92), (9.6, 1.58), role="weights", text="weights a", text_offset=(0.45, -0.1))
    arrow(ax, (5.28, 1.2), (8.8, 1.2), role="value")
    ax.text(0.2, 0.3, f"output row {t} = softmax(K q / sqrt(D)) V; all {T} rows at once: "
            f"softmax(Q K^T / sqrt(D)) V, shape (T, D) = ({T}, {D})", fontsize=FONT)
    legend(ax, 5.7, 5.05, [("query", "queries"), ("key", "keys"), ("value", "values"),
                           ("weights", "scores and weights")])
    return fig


# --- 03: scaling and the softmax's gradient ------------------------------------------------------


def softmax_gradient_diagram(d_k, S=8, seed=0):
    """Scores -> softmax -> Jacobian for one random query and S keys, unscaled and scaled by sqrt(d_k) (lesson 03).

    The query and keys have d_k independent standard-normal components, drawn from numpy's generator
    ``seed``: unscaled scores have standard deviation sqrt(d_k), scaled ones 1.
    """
    d_k, S = positive_int(d_k, "d_k"), as_int(S, "S", 1, 64)
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal(d_k), rng.standard_normal((S, d_k))
    scores = k @ q  # (S,)
    fig, ax = canvas(11.0, 5.4, f"from scores to softmax to gradient: one query, S = {S} keys, d_k = {d_k}")
    rows = [("unscaled", scores, f"scores s = q.k\nstd sqrt(d_k) = {np.sqrt(d_k):.3g}", 3.55),
            ("scaled", scores / np.sqrt(d_k), "scores s / sqrt(d_k)\nstd 1", 1.35)]
    for name, row, label, y in rows:
        p = np.exp(row - row.max())
        p /= p.sum()  # (S,)
        jac = np.diag(p) - np.outer(p, p)  # (S, S): dp_i / ds_j
        ax.text(0.15, y + 0.95, name, fontsize=FONT + 1, weight="bold")
        box(ax, 1.35, y, 2.1, 0.9, label, role="query", fontsize=SMALL)
        # forward: the softmax turns the scores into p; backward: the gradient on p goes back through J
        arrow(ax, (2.45, y + 0.22), (3.45, y + 0.22), text="softmax")
        arrow(ax, (3.45, y - 0.22), (2.45, y - 0.22), role="mask", text="J dL/dp", text_offset=(0.0, -0.36))
        inset = ax.inset_axes((4.15, y - 0.75, 2.5, 1.5), transform=ax.transData)  # its axis labels fill 3.5-4.15
        inset.bar(np.arange(S), p, color=ROLE_COLORS["weights"])
        inset.set_ylim(0, 1)
        inset.set_xticks(range(S))
        inset.tick_params(labelsize=7)
        inset.set_xlabel("key", fontsize=7, labelpad=1)
        inset.set_ylabel("p", fontsize=7, labelpad=1)
        inset.set_title(f"p: largest {p.max():.2f}", fontsize=SMALL)
        norm = np.linalg.norm(jac)
        shown = "< 1e-6" if norm < 1e-6 else f"= {norm:.2g}"
        box(ax, 8.95, y, 3.5, 1.05, f"J = diag(p) - p p^T = d p / d s\n||J||_F {shown}: how much of a\n"
            "gradient on p gets back to the scores", role="mask" if p.max() > 0.99 else "weights", fontsize=SMALL)
    ax.text(0.15, 0.2, "Forward: scores -> softmax -> p. Backward: dL/ds = J dL/dp. A one-hot p gives J = 0: "
            "that row passes no gradient back to its scores.", fontsize=FONT)
    return fig


# --- 04: multi-head attention -------------------------------------------------------------------


def multi_head_diagram(T, d_model, n_heads, B=1):
    """Split C into H heads of D, attend per head, concatenate, W_o: (B, T, C) -> (B, H, T, D) (lesson 04)."""
    T, B = positive_int(T, "T"), positive_int(B, "B")
    D = _heads(d_model, n_heads)
    H, C = n_heads, d_model
    fig, ax = canvas(11.0, 5.6, f"multi-head attention: B = {B}, T = {T}, C = d_model = {C}, "
                     f"H = n_heads = {H}, D = C / H = {D}")
    tensor(ax, 0.8, 2.7, 1.3, 0.8, "x", f"(B, T, C)\n= ({B}, {T}, {C})")
    ys = {"query": 4.1, "key": 2.7, "value": 1.3}
    for role, y in ys.items():
        name = {"query": "W_Q", "key": "W_K", "value": "W_V"}[role]
        arrow(ax, (1.45, 2.7), (1.9, y), role=role)
        tensor(ax, 2.5, y, 1.15, 0.7, name, f"(C, C) = ({C}, {C})", role=role,
               flow=_flow(0, "right", "w_" + name[-1].lower()))
        arrow(ax, (3.08, y), (3.4, y), role=role)
        tensor(ax, 4.25, y, 1.6, 0.75, f"split {name[-1]}", f"(B, H, T, D)\n= ({B}, {H}, {T}, {D})", role=role)
    # heads
    shown = list(range(H)) if H <= 4 else [0, 1, None, H - 1]
    top, bottom = 4.5, 0.9
    step = (top - bottom) / len(shown)
    box(ax, 6.45, (top + bottom) / 2, 2.0, top - bottom + 0.2, role="weights", fill=False, lw=1)
    for k, h in enumerate(shown):
        y = top - step * (k + 0.5)
        if h is None:
            ax.text(6.45, y, f"... {H - 3} more heads ...", ha="center", va="center", fontsize=FONT)
            continue
        box(ax, 6.45, y, 1.75, min(0.7, step * 0.8), f"head {h + 1}: attend\n(B, T, D) = ({B}, {T}, {D})",
            role="weights", fontsize=SMALL)
    # every head reads its own slice of Q, K and V: each split fans out to every head
    box_h = min(0.7, step * 0.8)
    for k, h in enumerate(shown):
        if h is None:
            continue
        y_head = top - step * (k + 0.5)
        for offset, (role, y) in zip((0.22, 0.0, -0.22), ys.items(), strict=True):
            arrow(ax, (5.05, y), (5.58, y_head + offset * box_h), role=role, lw=1.0, alpha=0.8)
    ax.text(6.45, 0.55, f"{H} heads in parallel, weights (B, H, T, T)", ha="center", fontsize=SMALL)
    arrow(ax, (7.45, 2.7), (7.8, 2.7))
    tensor(ax, 8.45, 2.7, 1.3, 0.95, "concat", f"(B, T, H D)\n= ({B}, {T}, {H * D})")
    arrow(ax, (9.1, 2.95), (9.4, 3.4))
    tensor(ax, 10.1, 3.5, 1.4, 0.7, "W_o", f"(C, C) = ({C}, {C})", flow=_flow(0, "right", "w_o"))
    arrow(ax, (10.1, 3.14), (10.1, 2.3))
    tensor(ax, 10.1, 1.9, 1.4, 0.75, "out", f"(B, T, C)\n= ({B}, {T}, {C})")
    ax.text(0.2, 0.25, f"each projection reads all C = {C} input features; each head gets its own D = {D} of the "
            f"C projected features of Q, K and V.\nThe heads cost no more than one head of width C (the same four "
            "C x C matrices).", fontsize=FONT)
    return fig


# --- 05: masks ----------------------------------------------------------------------------------


def mask_diagram(T, length, tokens=None):
    """Which (query, key) pairs the causal mask, the padding mask and both keep; True = may attend (lesson 05)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    T = as_int(T, "T", 1, 24)
    length = as_int(length, f"length (real tokens, at most the padded length T={T})", 1, T)
    labels = _labels("tokens", tokens, T, "{}") if tokens is None or len(tokens) == T else None
    if labels is None:
        labels = _labels("tokens", list(tokens) + ["<pad>"] * (T - len(tokens)), T, "{}")
    causal = np.tril(np.ones((T, T), dtype=bool))
    padding = np.broadcast_to(np.arange(T) < length, (T, T))
    masks = {f"causal_mask({T})\nkey s <= query t": causal,
             f"padding mask, length {length} of {T}\nkey s < {length}": padding,
             "both: causal & padding\n(the decoder's mask)": causal & padding}
    fig, axes = plt.subplots(1, 3, figsize=(10.5, 4.8), dpi=100)
    for ax, (name, m) in zip(axes, masks.items(), strict=True):
        ax.imshow(m, cmap=mask_cmap(), vmin=0, vmax=1)
        ax.set_xticks(np.arange(-0.5, T, 1), minor=True)
        ax.set_yticks(np.arange(-0.5, T, 1), minor=True)
        ax.grid(which="minor", color="#BBBBBB", linewidth=0.6)
        ax.tick_params(which="minor", length=0, labelsize=SMALL)
        ax.set_xticks(range(T), labels, rotation=90, fontsize=SMALL)
        ax.set_yticks(range(T), labels, fontsize=SMALL)
        ax.set_xlabel("key s (attended to)", fontsize=FONT)
        ax.set_ylabel("query t (attending)", fontsize=FONT)
        ax.set_title(f"{name}\nkeeps {int(m.sum())} of {T * T} pairs", fontsize=FONT)
    fig.suptitle(f"which (query, key) pairs each mask keeps, T = {T}: True = may attend",
                 fontsize=FONT + 2, weight="bold")
    fig.legend(handles=[Patch(facecolor=ROLE_COLORS["mask"], edgecolor="#888888", label="True: may attend"),
                        Patch(facecolor="white", edgecolor="#888888", label="False: blocked (score set to -inf)")],
               loc="lower center", bbox_to_anchor=(0.5, 0.0), ncol=2, fontsize=FONT, frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


# --- 06: positions as rotations -----------------------------------------------------------------


def positional_rotation_diagram(d_model, pair=0, n_positions=8, m=1, n=3, shift=2, base=10000.0):
    """A sinusoid pair as a point turning on a circle; RoPE turning q and k so q.k depends on n - m (lesson 06)."""
    import matplotlib.pyplot as plt

    d_model = positive_int(d_model, "d_model")
    if d_model % 2:
        raise ValueError(f"d_model must be even (sin/cos pairs), got {d_model}")
    pair = as_int(pair, "pair (in [0, d_model / 2))", 0, d_model // 2 - 1)
    n_positions = as_int(n_positions, "n_positions", 1, 16)
    for name, v in (("m", m), ("n", n), ("shift", shift)):
        as_int(v, f"{name} (a position)", minimum=0)
    omega = base ** (-2 * pair / d_model)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10.0, 5.6), dpi=100)
    theta = np.linspace(0, 2 * np.pi, 200)
    for ax in (left, right):
        ax.plot(np.cos(theta), np.sin(theta), color="#CCCCCC", lw=1)
        ax.set_aspect("equal")
        ax.set_xlim(-1.45, 1.45)
        ax.set_ylim(-1.45, 1.45)
        ax.axhline(0, color="#DDDDDD", lw=0.8)
        ax.axvline(0, color="#DDDDDD", lw=0.8)
    p = np.arange(n_positions)
    left.plot(np.cos(p * omega), np.sin(p * omega), "o", color=ROLE_COLORS["position"], ms=8)
    for k in p:
        left.annotate(f"p={k}", (np.cos(k * omega), np.sin(k * omega)), xytext=(1.17 * np.cos(k * omega),
                      1.17 * np.sin(k * omega)), ha="center", va="center", fontsize=SMALL)
    left.set_xlabel(f"PE[p, {2 * pair + 1}] = cos(p ω)", fontsize=FONT)
    left.set_ylabel(f"PE[p, {2 * pair}] = sin(p ω)", fontsize=FONT)
    left.set_title(f"sinusoidal pair {pair} of d_model = {d_model}\n"
                   f"ω = {omega:.3g} rad per position, wavelength {2 * np.pi / omega:.3g} positions\n"
                   f"positions 0..{n_positions - 1}: each step turns the point by ω", fontsize=FONT)
    # RoPE on one 2-D pair: q = k = (1, 0) direction before rotation, different lengths to tell them apart
    q0, k0 = np.array([1.0, 0.0]), np.array([0.8, 0.35])

    def rot(v, a):
        return np.array([v[0] * np.cos(a) - v[1] * np.sin(a), v[0] * np.sin(a) + v[1] * np.cos(a)])

    dots = []
    for (mm, nn), style in (((m, n), "-"), ((m + shift, n + shift), "--")):
        q, k = rot(q0, mm * omega), rot(k0, nn * omega)
        dots.append(float(q @ k))
        for v, role, lab in ((q, "query", f"q at m={mm}"), (k, "key", f"k at n={nn}")):
            right.annotate("", xy=v, xytext=(0, 0), arrowprops=dict(arrowstyle="-|>", color=ROLE_COLORS[role],
                           lw=2, linestyle=style))
            right.text(*(v * 1.22), lab, ha="center", va="center", fontsize=SMALL, color="black")
    right.set_xlabel("feature 2i", fontsize=FONT)
    right.set_ylabel("feature 2i + 1", fontsize=FONT)
    right.set_title(f"RoPE on the same pair: q turned by m ω, k by n ω\n"
                    f"solid m={m}, n={n}; dashed: both moved by {shift}\n"
                    f"q.k = {dots[0]:.3f} (solid), {dots[1]:.3f} (dashed): only n - m = {n - m} matters", fontsize=FONT)
    fig.suptitle("positions as rotations", fontsize=FONT + 2, weight="bold")
    fig.tight_layout()
    return fig


# --- 07: Post-LN vs Pre-LN ----------------------------------------------------------------------


def pre_post_ln_diagram(config=None, *, d_model=None, n_heads=None, d_ff=None):
    """Post-LN and Pre-LN Transformer blocks side by side: residual paths and where LayerNorm sits (lesson 07)."""
    s = _sizes(config, d_model=d_model, n_heads=n_heads, d_ff=d_ff)
    C, H, D, F = s["d_model"], s["n_heads"], s["D"], s["d_ff"]
    fig, ax = canvas(10.0, 7.0, f"one encoder block, two placements of LayerNorm "
                     f"(C = {C}, H = {H}, D = {D}, d_ff = {F})")
    attn = f"multi-head self-attention\nH = {H} heads of D = {D}"
    ffn = f"feed-forward\nC -> d_ff -> C = {C} -> {F} -> {C}"

    def column(x, pre):
        col = int(pre)
        ax.text(x, 6.45, "Pre-LN (norm_first=True)" if pre else "Post-LN (Vaswani et al. 2017)",
                ha="center", fontsize=FONT + 1, weight="bold")
        box(ax, x, 0.45, 1.6, 0.42, f"x (B, T, C = {C})", fontsize=SMALL)
        y = 0.66
        plan = (["LN", attn, "+", "LN", ffn, "+"] if pre else [attn, "+", "LN", ffn, "+", "LN"])
        ys = {}
        for k, item in enumerate(plan):
            yk = 1.25 + 0.82 * k
            ys[k] = yk
            if item == "+":
                ax.add_patch(__import__("matplotlib.patches", fromlist=["Circle"]).Circle(
                    (x, yk), 0.17, facecolor="white", edgecolor="black", lw=1.3))
                ax.text(x, yk, "+", ha="center", va="center", fontsize=FONT + 2)
                h = 0.34
            elif item == "LN":
                box(ax, x, yk, 1.4, 0.42, "LayerNorm", role="mask", fontsize=FONT, flow=_flow(col, "up", "norm"))
                h = 0.42
            else:
                box(ax, x, yk, 2.4, 0.56, item, role="weights" if item == attn else "other", fontsize=SMALL,
                    flow=_flow(col, "up", "attn" if item == attn else "ff"))
                h = 0.56
            arrow(ax, (x, y), (x, yk - h / 2))
            y = yk + h / 2
        arrow(ax, (x, y), (x, y + 0.3))
        ax.text(x, y + 0.42, "out (B, T, C)" + ("  -> final LayerNorm after the last block" if pre else ""),
                ha="center", fontsize=SMALL)
        # residual paths: from the input of each sub-layer block to its "+"
        plus = [k for k, it in enumerate(plan) if it == "+"]
        starts = [0.66, ys[plus[0]] + 0.17] if pre else [0.66, ys[plus[0] + 1] + 0.21]
        for start, k in zip(starts, plus, strict=True):
            xr = x + 1.45
            ax.plot([x, xr, xr], [start + 0.1, start + 0.1, ys[k]], color="black", lw=1.3)
            arrow(ax, (xr, ys[k]), (x + 0.17, ys[k]))
        ax.text(x + 1.5, (starts[0] + ys[plus[0]]) / 2, "residual", rotation=90, va="center", fontsize=SMALL)

    column(2.6, pre=False)
    column(7.4, pre=True)
    ax.text(0.2, 0.1, "Post-LN normalises the residual stream itself; Pre-LN normalises only each branch's "
            "input, so the identity path runs clean from input to output.", fontsize=SMALL)
    return fig


# --- 08: the encoder-decoder --------------------------------------------------------------------


def encoder_decoder_diagram(config, S=None, T=None):
    """The encoder-decoder of a TransformerConfig: stacks, memory to every cross-attention, output head (lesson 08)."""
    sz = _sizes(config, d_model=None, n_heads=None, d_ff=None, n_encoder_layers=None, n_decoder_layers=None,
                src_vocab_size=None, tgt_vocab_size=None)
    C, H, D, F = sz["d_model"], sz["n_heads"], sz["D"], sz["d_ff"]
    n_enc, n_dec = sz["n_encoder_layers"], sz["n_decoder_layers"]
    V_src, V_tgt = sz["src_vocab_size"], sz["tgt_vocab_size"]
    S_txt = "S" if S is None else f"S = {positive_int(S, 'S')}"
    T_txt = "T" if T is None else f"T = {positive_int(T, 'T')}"
    pre = bool(getattr(config, "norm_first", False))
    fig, ax = canvas(10.5, 8.6, f"encoder-decoder Transformer: C = {C}, H = {H} (D = {D}), d_ff = {F}, "
                     f"{n_enc} + {n_dec} layers, {'Pre' if pre else 'Post'}-LN")
    xe, xd = 2.6, 7.3

    def column(x, w, ids, seq, n, name, h_max, inner):
        """Ids, embedding and n layers (at most 3 drawn) at x; inner(yc) fills a layer. Returns the y above them."""
        col = int(name == "decoder")
        box(ax, x, 0.5, w, 0.45, ids, fontsize=SMALL)
        box(ax, x, 1.2, w, 0.5, f"embedding x sqrt(C) + sinusoidal positions\n(B, {seq}, C = {C})",
            role="position", fontsize=SMALL, flow=_flow(col, "up", "embed", "pos"))
        arrow(ax, (x, 0.72), (x, 0.95))
        y = 1.45
        drawn = list(range(n)) if n <= 3 else [0, None, n - 1]
        h_layer = min(h_max, 4.6 / len(drawn))
        for i in drawn:
            yc = y + 0.2 + h_layer / 2
            if i is None:
                ax.text(x, yc, f"... layers 2 to {n - 1} ...", ha="center", va="center", fontsize=FONT)
            else:  # layer 1 stands for itself and the layers elided after it
                times = n - 1 if (n > 3 and i == 0) else 1
                box(ax, x, yc, w, h_layer - 0.1, fill=False, flow=_frame(col, times))
                ax.text(x - w / 2 + 0.1, yc + h_layer / 2 - 0.2, f"{name} layer {i + 1}", fontsize=SMALL,
                        weight="bold")
                inner(yc)
            arrow(ax, (x, y), (x, y + 0.2))
            y += 0.2 + h_layer
        return y

    # Inside a layer the sub-layers run bottom-up, like the layers themselves: attention first.
    def encoder_layer(yc):
        box(ax, xe, yc - 0.35, 2.8, 0.32, "self-attention (padding mask)", role="key", fontsize=SMALL,
            flow=_flow(0, "up", "attn"))
        box(ax, xe, yc + 0.05, 2.8, 0.28, f"feed-forward {C} -> {F} -> {C}", fontsize=SMALL, flow=_flow(0, "up", "ff"))

    def decoder_layer(yc):
        box(ax, xd, yc - 0.45, 3.0, 0.26, "causal self-attention (causal & padding)", role="mask", fontsize=SMALL,
            flow=_flow(1, "up", "attn"))
        box(ax, xd, yc - 0.1, 3.0, 0.26, "cross-attention: Q here, K V = memory", role="query", fontsize=SMALL,
            flow=_flow(1, "up", "cross"))
        box(ax, xd, yc + 0.25, 3.0, 0.24, f"feed-forward {C} -> {F} -> {C}", fontsize=SMALL, flow=_flow(1, "up", "ff"))
        arrow(ax, (xe + 1.6, mem_y), (xd - 1.5, yc - 0.1), role="value", lw=1.6, connectionstyle="arc3,rad=-0.15")

    y = column(xe, 3.2, f"source ids (B, {S_txt}), vocab {V_src}", S_txt, n_enc, "encoder", 1.3, encoder_layer)
    box(ax, xe, y + 0.45, 3.2, 0.5, f"memory (B, {S_txt}, C = {C})", role="value", fontsize=FONT)
    arrow(ax, (xe, y), (xe, y + 0.2))
    mem_y = y + 0.45
    y = column(xd, 3.4, f"target ids, shifted right: <s> y0 ... (B, {T_txt})", T_txt, n_dec, "decoder", 1.55,
               decoder_layer)
    box(ax, xd, y + 0.45, 3.4, 0.5, f"head Linear(C, V) = ({C}, {V_tgt})\nlogits (B, {T_txt}, V = {V_tgt})",
        role="weights", fontsize=SMALL, flow=_flow(1, "up", "head"))
    arrow(ax, (xd, y), (xd, y + 0.2))
    top = max(y + 0.75, mem_y + 0.3)
    ax.text(xe, top + 0.2, "encoder", ha="center", fontsize=FONT + 1, weight="bold")
    ax.text(xd, top + 0.2, "decoder", ha="center", fontsize=FONT + 1, weight="bold")
    ax.text(5.0, top + 0.65, f"memory (green) feeds the cross-attention of every one of the {n_dec} decoder layers",
            ha="center", fontsize=FONT)
    _fit_height(fig, ax, top + 1.35)
    return fig


# --- 10: FlashAttention's tiles ----------------------------------------------------------------


def flash_tiles_diagram(T, S, D, block_q, block_k, causal=False, query_block=None):
    """Q, K, V tiles streaming from slow memory through on-chip memory, one query block at a time (lesson 10).

    The grid on the right has one square per (query block, key block) tile; with ``causal``
    (bottom-right aligned when T != S, as in lesson 10) the tiles above the diagonal are skipped.
    """
    from matplotlib.patches import Rectangle

    T, S, D = positive_int(T, "T"), positive_int(S, "S"), positive_int(D, "D")
    block_q, block_k = positive_int(block_q, "block_q"), positive_int(block_k, "block_k")
    n_q, n_k = -(-T // block_q), -(-S // block_k)
    if n_q > 16 or n_k > 16:
        raise ValueError(f"{n_q} x {n_k} tiles do not fit the drawing: use at most 16 blocks per side")
    i = n_q // 2 if query_block is None else query_block
    i = as_int(i, "query_block", 0, n_q - 1)

    def skipped(a, b):  # every key of block b lies after every query of block a (bottom-right aligned)
        return causal and b * block_k > min((a + 1) * block_q, T) - 1 + (S - T)

    fig, ax = canvas(11.5, 6.2, f"FlashAttention's tiles: T = {T}, S = {S}, D = {D}, block_q = {block_q}, "
                     f"block_k = {block_k}{', causal' if causal else ''}")
    # slow memory: Q, K, V (and O) as strips cut into blocks
    box(ax, 1.55, 3.0, 2.7, 4.9, fill=False)
    ax.text(1.55, 5.2, "slow memory (GPU: HBM)", ha="center", fontsize=FONT, weight="bold")
    strips = [("Q", n_q, i, "query", 0.65), ("K", n_k, None, "key", 1.3), ("V", n_k, None, "value", 1.95),
              ("O", n_q, i, "other", 2.6)]
    h_total = 3.7
    for name, n, hi, role, x in strips:
        h = h_total / n
        for b in range(n):
            y = 4.75 - (b + 1) * h
            on = (b == hi) if hi is not None else not skipped(i, b)
            ax.add_patch(Rectangle((x - 0.22, y), 0.44, h * 0.92, facecolor=ROLE_COLORS[role] if on else "white",
                                   edgecolor=ROLE_COLORS[role], alpha=0.85 if on else 1.0, lw=1))
        ax.text(x, 4.88, name, ha="center", fontsize=FONT, weight="bold")
    ax.text(1.55, 0.64, f"Q, O: {n_q} blocks of {block_q} rows\nK, V: {n_k} blocks of {block_k} rows",
            ha="center", va="bottom", fontsize=SMALL)  # below the strips, which end at y = 1.05
    # on-chip memory: one query block's state and the tiles streaming through
    # (its left border at x = 4.1 leaves the arrows' labels between the two boxes room of their own)
    box(ax, 5.7, 3.0, 3.2, 4.9, fill=False, role="weights")
    ax.text(5.7, 5.2, "on-chip memory (GPU: SRAM)", ha="center", fontsize=FONT, weight="bold")
    box(ax, 5.7, 4.45, 2.8, 0.5, f"Q_{i}: ({block_q}, {D}), loaded once", role="query", fontsize=SMALL)
    box(ax, 4.95, 3.65, 1.3, 0.5, f"K_j: ({block_k}, {D})", role="key", fontsize=SMALL)
    box(ax, 6.45, 3.65, 1.3, 0.5, f"V_j: ({block_k}, {D})", role="value", fontsize=SMALL)
    box(ax, 5.7, 2.75, 2.8, 0.6, f"tile S = Q_{i} K_j^T / sqrt(D)\n({block_q}, {block_k}), then thrown away",
        role="weights", fontsize=SMALL)
    box(ax, 5.7, 1.75, 2.8, 0.75, f"running m, l: ({block_q},)\nacc: ({block_q}, {D}), rescaled per tile",
        fontsize=SMALL)
    arrow(ax, (5.7, 2.42), (5.7, 2.15))
    # between the memories: Q_i in once, K_j and V_j streamed, O_i out once; each label centred in the gap
    gap = (2.9 + 4.1) / 2
    for y, role, text, inward in ((4.45, "query", "once", True), (3.65, "key", "j = 0, 1, ...", True),
                                  (1.75, "other", f"O_{i} = acc / l", False)):
        start, end = ((2.9, y), (4.3, y)) if inward else ((4.3, y), (2.9, y))
        arrow(ax, start, end, role=role, lw=1.4)
        ax.text(gap, y + 0.12, text, ha="center", va="bottom", fontsize=SMALL, color="black")
    # the grid of tiles: the walk of query block i
    g0x, g0y, cell = 7.75, 0.9, min(3.4 / n_k, 3.9 / n_q)
    for a in range(n_q):
        for b in range(n_k):
            x, y = g0x + b * cell, g0y + (n_q - 1 - a) * cell
            color = "#dddddd" if skipped(a, b) else (ROLE_COLORS["weights"] if a == i else "white")
            ax.add_patch(Rectangle((x, y), cell * 0.94, cell * 0.94, facecolor=color, edgecolor="#777777", lw=0.8))
    ax.text(g0x + n_k * cell / 2, g0y + n_q * cell + 0.2, "tiles (query block, key block)", ha="center",
            fontsize=FONT, weight="bold")
    ax.text(g0x - 0.1, g0y + (n_q - 0.5 - i) * cell, f"block {i}", ha="right", va="center", fontsize=SMALL)
    done = sum(not skipped(i, b) for b in range(n_k))
    n_skipped = sum(skipped(a, b) for a in range(n_q) for b in range(n_k))
    note = f"block {i} visits {done} of {n_k} key blocks" + (f"; grey: {n_skipped} skipped tiles" if causal else "")
    ax.text(g0x + n_k * cell / 2, g0y - 0.3, note, ha="center", fontsize=SMALL)
    return fig


# --- 11: a pretrained sentence encoder ------------------------------------------------------------


def minilm_diagram(config, tokens=None, vocab_size=None):
    """all-MiniLM-L6-v2 as the course builds it: embeddings, Post-LN layers, mean pooling (lesson 11).

    ``config`` is the model's TransformerConfig (``helpers.pretrained.minilm_config()``); ``tokens``
    are the WordPiece pieces of one sentence, [CLS] and [SEP] included.
    """
    sz = _sizes(config, d_model=None, n_heads=None, d_ff=None, n_encoder_layers=None, src_vocab_size=vocab_size,
                max_len=None)
    C, H, D, F = sz["d_model"], sz["n_heads"], sz["D"], sz["d_ff"]
    n, V, P = sz["n_encoder_layers"], sz["src_vocab_size"], sz["max_len"]
    if tokens is None:
        tokens = ["[CLS]", "a", "bank", "by", "the", "river", "[SEP]"]
    tokens = _labels("tokens", tokens, len(tokens), "{}")
    L = len(tokens)
    fig, ax = canvas(10.0, 8.4, f"all-MiniLM-L6-v2 on the course's modules: {n} layers, H = {H} heads of "
                     f"D = {D}, C = {C}, d_ff = {F}")
    x, w = 3.6, 4.6
    token_row(ax, tokens, x - w / 2, 0.45, w, role="other", fontsize=SMALL, max_w=0.62)
    ax.text(x + w / 2 + 0.15, 0.45, f"WordPiece ids (B, L = {L})", va="center", fontsize=SMALL)
    steps = [
        (1.3, 0.55, f"word embedding ({V:,} x {C})\n+ learned position (max {P}) + token type", "position",
         ("embed", "embed", "pos")),
        (2.05, 0.4, "LayerNorm (eps 1e-12)", "other", ("norm",)),
    ]
    y_prev = 0.65
    for y, h, text, role, kinds in steps:
        arrow(ax, (x, y_prev), (x, y - h / 2))
        box(ax, x, y, w, h, text, role=role, fontsize=SMALL, flow=_flow(0, "up", *kinds))
        y_prev = y + h / 2
    # one encoder layer, drawn once, repeated n times (Post-LN: add, then normalise)
    y0, y1 = 2.55, 5.35
    box(ax, x, (y0 + y1) / 2, w + 0.3, y1 - y0, fill=False, flow=_frame(0, n))
    ax.text(x + w / 2 + 0.3, (y0 + y1) / 2, f"x {n} layers", va="center", fontsize=FONT + 1, weight="bold")
    inner = [(2.95, f"multi-head self-attention: {H} heads of D = {D}\nkeys at pads masked (padding mask)",
              "key", 0.5, "attn"), (3.6, "add the input, then LayerNorm", "other", 0.34, "norm"),
             (4.25, f"feed-forward {C} -> {F} -> {C}, GELU", "other", 0.4, "ff"),
             (4.9, "add the input, then LayerNorm", "other", 0.34, "norm")]
    arrow(ax, (x, y_prev), (x, y0))
    y_prev = y0
    for y, text, role, h, kind in inner:
        arrow(ax, (x, y_prev), (x, y - h / 2))
        box(ax, x, y, w - 0.4, h, text, role=role, fontsize=SMALL, flow=_flow(0, "up", kind))
        y_prev = y + h / 2
    outs = [(5.95, 0.5, f"hidden states (B, L = {L}, C = {C})", "other"),
            (6.7, 0.5, "mean over the real tokens (the mask skips pads)", "mask"),
            (7.45, 0.5, f"divide by its length: sentence vector (B, {C}), |v| = 1", "query")]
    arrow(ax, (x, y_prev), (x, y1))
    y_prev = y1
    for y, h, text, role in outs:
        arrow(ax, (x, y_prev), (x, y - h / 2))
        box(ax, x, y, w, h, text, role=role, fontsize=SMALL)
        y_prev = y + h / 2
    notes = ["Unlike lesson 08's encoder:", "- learned positions, not sinusoids", "- a token-type embedding",
             "- LayerNorm on the embeddings", "- no sqrt(C) scaling", "- GELU instead of ReLU",
             "- no final LayerNorm", "- mean pooling, not [CLS]"]
    for k, line in enumerate(notes):
        ax.text(7.05, 7.6 - 0.34 * k, line, fontsize=SMALL, weight="bold" if k == 0 else "normal")
    return fig


# --- 09: the KV cache ---------------------------------------------------------------------------


def kv_cache_diagram(n_steps, d_model, n_heads, n_layers=1, prompt_len=1):
    """A KV cache growing by one key and one value per generated token while one new query attends (lesson 09).

    ``prompt_len`` tokens are already cached before the first drawn step (0: the cache starts empty
    and the first step feeds ``<s>``); the cross-attention keys and values of the encoder memory are
    computed once and are not drawn.
    """
    n_steps = as_int(n_steps, "n_steps", 1, 6)
    prompt_len = as_int(prompt_len, "prompt_len", 0, 8)
    if prompt_len + n_steps > 11:
        raise ValueError(f"prompt_len + n_steps = {prompt_len + n_steps} cache slots do not fit; draw at most 11")
    n_layers = positive_int(n_layers, "n_layers")
    D = _heads(d_model, n_heads)
    H = n_heads
    width = 10.5
    fig, ax = canvas(width, 1.55 + 1.15 * n_steps, f"KV cache: C = {d_model}, H = {H} heads of D = {D}, "
                     f"{n_layers} decoder layer{'s' if n_layers > 1 else ''}, one cache per layer")
    cell = 0.42
    x0 = 3.4
    for k in range(n_steps):
        t = prompt_len + k  # position of the new token
        y = 1.15 * (n_steps - k) - 0.05
        ax.text(0.15, y + 0.3, f"step {k + 1}: new token at position {t}", fontsize=FONT, va="center")
        ax.text(0.15, y, f"cache (B, H, {t + 1}, D) = (1, {H}, {t + 1}, {D})", fontsize=SMALL, va="center")
        scores = f"q{t} . k0..k{t}: {t + 1} scores, not {t + 1} x {t + 1}" if t else "q0 . k0: 1 score"
        ax.text(0.15, y - 0.3, scores, fontsize=SMALL, va="center")
        box(ax, x0 - 0.45, y, 0.46, 0.36, f"q{t}", role="query", fontsize=SMALL)
        for s in range(t + 1):
            x = x0 + 0.4 + s * (cell + 0.06)
            new = s == t
            box(ax, x, y + 0.2, cell, 0.34, f"k{s}", role="key", fontsize=SMALL, lw=3 if new else 1)
            box(ax, x, y - 0.2, cell, 0.34, f"v{s}", role="value", fontsize=SMALL, lw=3 if new else 1)
            arrow(ax, (x0 - 0.45, y + 0.19), (x, y + 0.38), role="weights", lw=0.9, alpha=0.8,
                  connectionstyle=f"arc3,rad={-0.5 / (1 + 0.25 * s):.3f}")
        xn = x0 + 0.4 + (t + 1) * (cell + 0.06) - 0.1
        ax.text(xn, y, f"<- k{t}, v{t} appended", fontsize=SMALL, va="center")
    ax.text(0.15, 0.25, "per step only the new token goes through W_Q, W_K, W_V "
            "(thick: this step's new key and value);\n"
            f"the cache grows by 2 x H x D = {2 * H * D} numbers per layer and token "
            f"({2 * H * D * n_layers} for all {n_layers} layers); before step 1 the cache "
            + (f"holds {prompt_len} token{'s' if prompt_len > 1 else ''}" if prompt_len else "is empty"),
            fontsize=FONT, va="center")
    return fig


# --- 12: the decoder-only GPT -------------------------------------------------------------------


def gpt_diagram(config, T=None):
    """A decoder-only GPT of a GPTConfig: tied embedding, Pre-LN causal blocks with their KV caches (lesson 12)."""
    sz = _sizes(config, d_model=None, n_heads=None, d_ff=None, n_layers=None, vocab_size=None, max_len=None)
    C, H, D, F = sz["d_model"], sz["n_heads"], sz["D"], sz["d_ff"]
    n, V, L = sz["n_layers"], sz["vocab_size"], sz["max_len"]
    kv = getattr(config, "n_kv_heads", None) or H
    T_txt = "T" if T is None else f"T = {as_int(T, f'T (at most the context max_len={L})', 1, L)}"
    fig, ax = canvas(9.0, 8.0, f"decoder-only GPT: C = {C}, H = {H} (D = {D}), d_ff = {F}, {n} blocks, "
                     f"V = {V}, context {L}")
    x, w = 3.3, 4.0
    box(ax, x, 0.45, w, 0.42, f"token ids (B, {T_txt})", fontsize=SMALL)
    box(ax, x - 0.95, 1.15, 1.7, 0.5, f"token embedding\n({V}, {C})", role="weights", fontsize=SMALL,
        flow=_flow(0, "up", "embed"))
    box(ax, x + 0.95, 1.15, 1.7, 0.5, f"learned positions\n({L}, {C})", role="position", fontsize=SMALL,
        flow=_flow(0, "up", "pos"))
    arrow(ax, (x - 0.95, 0.67), (x - 0.95, 0.9))
    arrow(ax, (x + 0.95, 0.67), (x + 0.95, 0.9))
    ax.text(x, 1.15, "+", ha="center", va="center", fontsize=FONT + 4)
    y = 1.4
    drawn = list(range(n)) if n <= 3 else [0, None, n - 1]
    h = min(1.6, 4.4 / len(drawn))
    for i in drawn:
        arrow(ax, (x, y), (x, y + 0.2))
        yc = y + 0.2 + h / 2
        if i is None:
            ax.text(x, yc, f"... blocks 2 to {n - 1} ...", ha="center", va="center", fontsize=FONT)
        else:
            times = n - 1 if (n > 3 and i == 0) else 1  # block 1 stands for itself and the elided blocks
            box(ax, x, yc, w, h - 0.1, fill=False, flow=_frame(0, times))
            ax.text(x - w / 2 + 0.1, yc + h / 2 - 0.22, f"block {i + 1} (Pre-LN)", fontsize=SMALL, weight="bold")
            # bottom-up like the blocks themselves: attention first, then the feed-forward net
            box(ax, x, yc - 0.4, w - 0.3, 0.3, "x + causal self-attention(LayerNorm(x))", role="mask",
                fontsize=SMALL, flow=_flow(0, "up", "norm", "attn"))
            arrow(ax, (x, yc - 0.25), (x, yc - 0.12))
            box(ax, x, yc + 0.02, w - 0.3, 0.28, f"x + feed-forward(LayerNorm(x)): {C} -> {F} -> {C}",
                fontsize=SMALL, flow=_flow(0, "up", "norm", "ff"))
            box(ax, x + w / 2 + 1.45, yc - 0.4, 2.3, 0.5, f"KV cache, K and V:\n(B, {kv}, {L}, {D}) each",
                role="key", fontsize=SMALL)
            arrow(ax, (x + w / 2 - 0.15, yc - 0.4), (x + w / 2 + 0.3, yc - 0.4), role="key", style="<|-|>")
        y += 0.2 + h
    arrow(ax, (x, y), (x, y + 0.2))
    box(ax, x, y + 0.42, w, 0.4, "final LayerNorm", fontsize=SMALL, flow=_flow(0, "up", "norm"))
    arrow(ax, (x, y + 0.62), (x, y + 0.82))
    box(ax, x, y + 1.07, w, 0.5, f"output = same ({V}, {C}) matrix, transposed\nlogits (B, {T_txt}, V = {V})",
        role="weights", fontsize=SMALL, flow=_flow(0, "up", "head"))
    arrow(ax, (x - 0.95 - 0.85, 1.15), (x - w / 2, y + 1.07), role="weights", lw=1.2,
          connectionstyle="arc3,rad=-0.35", text="tied", text_offset=(-1.2, 0.0))
    ax.text(x + w / 2 + 1.45, y + 1.07, "generation: each step runs\nonly the newest token and\nreads every "
            "earlier K, V\nfrom the caches", ha="center", va="center", fontsize=SMALL)
    _fit_height(fig, ax, y + 1.85)
    return fig


# --- 13: the induction circuit -------------------------------------------------------------------

__all__ += ["induction_circuit_diagram"]


def induction_circuit_diagram(config, tokens=None, prev_head=None, induction_head=None):
    """The two-layer induction circuit on a repeated sequence: a previous-token head, then K-composition (lesson 13).

    ``config`` gives d_model and n_heads (an ``AttentionOnlyConfig``, or any object with them);
    ``tokens``: the sequence drawn (default ``A B C D A B C``: the block repeats, the last token is
    the current one); ``prev_head`` and ``induction_head``: the head numbers to name (0-based), if found.
    """
    sz = _sizes(config, d_model=None, n_heads=None)
    C, H, D = sz["d_model"], sz["n_heads"], sz["D"]
    tokens = ["A", "B", "C", "D", "A", "B", "C"] if tokens is None else [str(t) for t in tokens]
    T = as_int(len(tokens), "len(tokens)", 3, 12)
    now = tokens[-1]
    earlier = [j for j in range(T - 2) if tokens[j] == now]
    if not earlier:
        raise ValueError(f"the last token {now!r} must occur earlier, with a token after it, for an induction head "
                         "to have something to find")
    j = earlier[-1]
    nxt = tokens[j + 1]
    for name, h in (("prev_head", prev_head), ("induction_head", induction_head)):
        if h is not None:
            as_int(h, f"{name} (a head number)", 0, H - 1)
    ph = "a previous-token head" if prev_head is None else f"previous-token head (layer 1, head {prev_head})"
    ih = "an induction head" if induction_head is None else f"induction head (layer 2, head {induction_head})"
    fig, ax = canvas(9.0, 5.6, f"the induction circuit: 2 attention layers, C = {C}, H = {H} heads of D = {D}")
    xs = token_row(ax, tokens, 1.0, 0.7, 7.2, role="other", max_w=0.85)
    ax.text(0.1, 0.7, "tokens", ha="left", va="center", fontsize=SMALL)
    # layer 1: every position copies the token before it into its own residual stream
    y1 = 2.0
    ax.text(0.1, y1, "layer 1", ha="left", va="center", fontsize=SMALL, weight="bold")
    for i in range(1, T):
        arrow(ax, (xs[i - 1], 0.9), (xs[i], y1 - 0.2), role="value", lw=1.0, alpha=0.35 if i != j + 1 else 1.0)
    box(ax, xs[j + 1], y1, 0.95, 0.42, f"{nxt}\nafter {tokens[j]}", role="value", fontsize=SMALL)
    ax.text(xs[j + 1] + 0.55, y1 - 0.05, f"{ph}: each position\nwrites \"the token before me\"",
            ha="left", va="center", fontsize=SMALL)
    # layer 2: the current token's query meets the key written by layer 1 (K-composition)
    y2 = 3.6
    ax.text(0.1, y2, "layer 2", ha="left", va="center", fontsize=SMALL, weight="bold")
    box(ax, xs[-1], y2, 1.0, 0.42, f"query: {now}", role="query", fontsize=SMALL)
    box(ax, xs[j + 1], y2, 1.25, 0.42, f"key: after {tokens[j]}", role="key", fontsize=SMALL)
    arrow(ax, (xs[j + 1], y1 + 0.22), (xs[j + 1], y2 - 0.22), role="key", text="K-composition",
          text_offset=(0.7, -0.05))
    arrow(ax, (xs[-1], 0.9), (xs[-1], y2 - 0.22), role="query", lw=1.0)
    arrow(ax, (xs[-1] - 0.5, y2 + 0.08), (xs[j + 1] + 0.64, y2 + 0.08), role="weights", lw=2.0,
          connectionstyle="arc3,rad=0.25", text=f"{ih} attends here", text_offset=(0.0, 0.25))
    box(ax, xs[-1], y2 + 1.1, 1.25, 0.42, f"predict {nxt}", role="value", fontsize=SMALL)
    arrow(ax, (xs[j + 1], y2 + 0.22), (xs[-1] - 0.65, y2 + 1.1), role="value", text=f"copies {nxt}",
          text_offset=(-0.6, 0.05), connectionstyle="arc3,rad=-0.15")
    legend(ax, 0.3, 5.05, [("query", "query"), ("key", "key"), ("value", "value / copied token"),
                           ("weights", "attention")])
    return fig
