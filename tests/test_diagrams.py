"""Every diagram draws headless at two sizes, returns a Figure and labels the sizes it was given."""

import re

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from helpers import diagrams  # noqa: E402
from helpers.gpt import GPTConfig  # noqa: E402
from helpers.plot import ROLE_COLORS, heads_grid, mask_heatmap  # noqa: E402
from helpers.transformer import TransformerConfig  # noqa: E402


def _text(fig) -> str:
    return "\n".join(t.get_text() for t in fig.findobj(Text))


def _config(d_model, n_heads, d_ff, n_enc, n_dec, norm_first):
    return TransformerConfig(37, 19, d_model=d_model, n_heads=n_heads, d_ff=d_ff, n_encoder_layers=n_enc,
                             n_decoder_layers=n_dec, dropout=0.0, max_len=64, norm_first=norm_first)


# (function, kwargs, strings that must appear in the figure's text)
CASES = [
    (diagrams.seq2seq_diagram, dict(source=list("4830"), target=list("0384"), weights=np.eye(4)[::-1],
                                    hidden_size=32),
     ["S = 4", "T = 4", "h3", "32 numbers", "weights given"]),
    (diagrams.seq2seq_diagram, dict(source=7, target=5), ["S = 7", "T = 5", "h6", "s4", "none given",
                                                           "c_i = sum_j a_ij h_j"]),
    (diagrams.seq2seq_diagram, dict(source=3, target=3, values="embeddings"), ["S = 3", "sum_j a_ij e(x_j)"]),
    (diagrams.rnn_vs_attention_path_diagram, dict(T=9), ["T = 9", "h8", "through 8 recurrent", "(9, 9)"]),
    (diagrams.rnn_vs_attention_path_diagram, dict(T=5, tokens=list("abcde")), ["T = 5", "(5, 5)", "e"]),
    (diagrams.qkv_diagram, dict(T=9, C=12, D=4), ["(T, C) = (9, 12)", "(C, D) = (12, 4)", "(D,) = (4,)",
                                                  "sqrt(4) = 2", "Q[8]"]),
    (diagrams.qkv_diagram, dict(T=5, C=32, D=16, query_index=2, S=7),
     ["(T, D) = (5, 16)", "(S, D) = (7, 16)", "(S,) = (7,)", "sqrt(16) = 4", "Q[2]"]),
    (diagrams.softmax_gradient_diagram, dict(d_k=1024), ["S = 8 keys", "d_k = 1024", "std sqrt(d_k) = 32",
                                                         "largest 1.00", "< 1e-6", "std 1"]),
    (diagrams.softmax_gradient_diagram, dict(d_k=4, S=5, seed=3), ["S = 5 keys", "d_k = 4", "sqrt(d_k) = 2",
                                                                     "||J||_F = "]),
    (diagrams.multi_head_diagram, dict(T=8, d_model=32, n_heads=2), ["(1, 2, 8, 16)", "(32, 32)", "head 1",
                                                                     "D = C / H = 16"]),
    (diagrams.multi_head_diagram, dict(T=6, d_model=48, n_heads=8, B=3),
     ["(3, 8, 6, 6)", "(48, 48)", "head 8", "5 more heads", "(3, 6, 48)"]),
    (diagrams.mask_diagram, dict(T=6, length=3, tokens=["dogs", "bark", "loudly"]),
     ["causal_mask(6)", "length 3 of 6", "keeps 21 of 36", "keeps 18 of 36", "keeps 15 of 36", "may attend",
      "<pad>"]),
    (diagrams.mask_diagram, dict(T=4, length=4), ["causal_mask(4)", "keeps 10 of 16", "keeps 16 of 16"]),
    (diagrams.positional_rotation_diagram, dict(d_model=64), ["d_model = 64", "pair 0", "ω = 1 ", "p=7",
                                                               "n - m = 2"]),
    (diagrams.positional_rotation_diagram, dict(d_model=16, pair=2, n_positions=12, m=0, n=5, shift=3),
     ["d_model = 16", "pair 2", "PE[p, 4]", "PE[p, 5]", "p=11", "n - m = 5", "moved by 3"]),
    (diagrams.pre_post_ln_diagram, dict(d_model=32, n_heads=4, d_ff=64), ["C = 32", "H = 4", "D = 8",
                                                                           "32 -> 64 -> 32"]),
    (diagrams.pre_post_ln_diagram, dict(config=_config(512, 8, 2048, 6, 6, False)),
     ["C = 512", "D = 64", "512 -> 2048 -> 512"]),
    (diagrams.encoder_decoder_diagram, dict(config=_config(64, 4, 128, 2, 2, True), S=12, T=11),
     ["C = 64", "D = 16", "2 + 2 layers", "Pre-LN", "S = 12", "T = 11", "vocab 37", "(64, 19)",
      "decoder layer 2", "every one of the 2 decoder"]),
    (diagrams.encoder_decoder_diagram, dict(config=_config(512, 8, 2048, 6, 4, False)),
     ["C = 512", "6 + 4 layers", "Post-LN", "encoder layer 6", "decoder layer 4", "2048"]),
    (diagrams.flash_tiles_diagram, dict(T=100, S=100, D=16, block_q=24, block_k=16, causal=True),
     ["block_q = 24", "block_k = 16", "causal", "5 blocks of 24 rows", "7 blocks of 16 rows", "Q_2: (24, 16)",
      "block 2 visits 5 of 7 key blocks", "12 skipped tiles"]),
    (diagrams.flash_tiles_diagram, dict(T=100, S=77, D=8, block_q=32, block_k=16, query_block=0),
     ["S = 77", "4 blocks of 32 rows", "5 blocks of 16 rows", "Q_0: (32, 8)", "block 0 visits 5 of 5 key blocks"]),
    (diagrams.minilm_diagram, dict(config=_config(384, 12, 1536, 6, 1, False), vocab_size=30522),
     ["6 layers", "12 heads of D = 32", "C = 384", "384 -> 1536 -> 384", "30,522 x 384", "max 64", "x 6 layers",
      "(B, 384)", "L = 7", "[CLS]"]),
    (diagrams.minilm_diagram, dict(config=_config(64, 4, 96, 2, 1, False), tokens=["[CLS]", "hi", "[SEP]"]),
     ["2 layers", "4 heads of D = 16", "(37 x 64)", "64 -> 96 -> 64", "L = 3", "(B, 64)", "hi"]),
    (diagrams.kv_cache_diagram, dict(n_steps=4, d_model=64, n_heads=4, n_layers=2),
     ["H = 4 heads of D = 16", "(1, 4, 5, 16)", "k4", "128 numbers", "256 for all 2"]),
    (diagrams.kv_cache_diagram, dict(n_steps=4, d_model=64, n_heads=4, n_layers=2, prompt_len=0),
     ["position 0", "q0 . k0: 1 score", "(1, 4, 4, 16)", "k3", "the cache is empty"]),
    (diagrams.kv_cache_diagram, dict(n_steps=2, d_model=24, n_heads=3, prompt_len=6),
     ["H = 3 heads of D = 8", "(1, 3, 8, 8)", "q7", "48 numbers"]),
    (diagrams.gpt_diagram, dict(config=GPTConfig(70, 64, 4, 2, 256, 64)),
     ["C = 64", "D = 16", "2 blocks", "(70, 64)", "(64, 64)", "block 2", "(B, 4, 64, 16)", "tied"]),
    (diagrams.gpt_diagram, dict(config=GPTConfig(50, 96, 6, 5, 384, 32, n_kv_heads=2), T=20),
     ["H = 6", "5 blocks", "T = 20", "blocks 2 to 4", "block 5", "(B, 2, 32, 16)", "96 -> 384 -> 96"]),
    (diagrams.induction_circuit_diagram, dict(config=GPTConfig(70, 64, 4, 2, 256, 64), prev_head=2,
                                              induction_head=0),
     ["C = 64", "H = 4 heads of D = 16", "layer 1, head 2", "layer 2, head 0", "predict D", "key: after C"]),
    (diagrams.induction_circuit_diagram, dict(config=GPTConfig(9, 24, 3, 1, 8, 8), tokens=list("xqzkxq")),
     ["C = 24", "D = 8", "predict z", "query: q", "K-composition"]),
]


@pytest.mark.parametrize("fn, kwargs, expected", CASES, ids=lambda c: getattr(c, "__name__", None))
def test_diagram_draws_and_labels_its_sizes(fn, kwargs, expected):
    fig = fn(**kwargs)
    try:
        assert isinstance(fig, Figure)
        text = _text(fig)
        missing = [s for s in expected if s not in text]
        assert not missing, f"{fn.__name__} lacks labels {missing}"
        fig.canvas.draw()  # rendering must succeed too
    finally:
        plt.close(fig)


def test_every_diagram_is_tested_at_two_sizes():
    names = [n for n in diagrams.__all__ if n.endswith("_diagram")]
    assert len(names) == 14
    counts = {n: sum(fn.__name__ == n for fn, _, _ in CASES) for n in names}
    assert all(c >= 2 for c in counts.values()), counts


def test_rope_panel_dot_products_are_equal():
    fig = diagrams.positional_rotation_diagram(32, pair=1, m=2, n=7, shift=5)
    try:
        title = fig.axes[1].get_title()
        assert "only n - m = 5 matters" in title
        solid, dashed = re.search(r"q.k = (-?[0-9.]+) \(solid\), (-?[0-9.]+) \(dashed\)", title).groups()
        assert solid == dashed
    finally:
        plt.close(fig)


@pytest.mark.parametrize("call, message", [
    (lambda: diagrams.multi_head_diagram(8, 30, 4), "d_model=30 is not divisible by n_heads=4"),
    (lambda: diagrams.qkv_diagram(0, 12, 4), "T must be a positive int, got 0"),
    (lambda: diagrams.qkv_diagram(np.int64(3), 12.0, 4), "C must be a positive int, got 12.0"),
    (lambda: diagrams.mask_diagram(25, 3), "T must be an int in [1, 24], got 25"),
    (lambda: diagrams.kv_cache_diagram(2, 64, 4, prompt_len=-1), "prompt_len must be an int in [0, 8], got -1"),
    (lambda: diagrams.kv_cache_diagram(2, 64, 4, prompt_len=True), "prompt_len must be an int in [0, 8], got True"),
    (lambda: diagrams.gpt_diagram(GPTConfig(20, 32, 4, 2, 64, 16), T=17),
     "T (at most the context max_len=16) must be an int in [1, 16], got 17"),
    (lambda: diagrams.qkv_diagram(9, 12, 4, query_index=9), "query_index (a position in [0, T)) must be an int in"),
    (lambda: diagrams.mask_diagram(4, 5), "length (real tokens, at most the padded length T=4) must be an int in "
                                          "[1, 4], got 5"),
    (lambda: diagrams.induction_circuit_diagram(GPTConfig(9, 24, 3, 1, 8, 8), tokens=list("ab")),
     "len(tokens) must be an int in [3, 12], got 2"),
    (lambda: diagrams.seq2seq_diagram(4, 3, weights=np.ones((4, 3))), "weights must have shape (T, S) = (3, 4)"),
    (lambda: diagrams.positional_rotation_diagram(15), "d_model must be even"),
    (lambda: diagrams.pre_post_ln_diagram(d_model=32, n_heads=4), "d_ff is missing"),
    (lambda: diagrams.kv_cache_diagram(6, 64, 4, prompt_len=8), "do not fit"),
    (lambda: diagrams.rnn_vs_attention_path_diagram(3, tokens=["a"]), "tokens has 1 entries"),
    (lambda: diagrams.minilm_diagram(None), "d_model is missing"),
    (lambda: diagrams.softmax_gradient_diagram(0), "d_k must be a positive int, got 0"),
    (lambda: diagrams.flash_tiles_diagram(1000, 100, 16, 8, 16), "do not fit the drawing"),
    (lambda: diagrams.flash_tiles_diagram(100, 100, 16, 24, 16, query_block=5), "query_block must be an int in [0, "),
])
def test_bad_sizes_get_clear_errors(call, message):
    with pytest.raises(ValueError, match=None) as info:
        call()
    assert message in str(info.value)
    plt.close("all")


def test_role_colours_are_distinct_and_shared():
    roles = ["query", "key", "value", "mask", "position"]
    assert len({ROLE_COLORS[r] for r in roles}) == len(roles)
    ax = mask_heatmap(np.tril(np.ones((4, 4), dtype=bool)), title="causal")
    try:
        image = ax.images[0]
        kept = image.cmap(image.norm(1.0))
        assert matplotlib.colors.to_hex(kept) == ROLE_COLORS["mask"].lower()
        assert len(ax.figure.axes) == 2  # the mask and its colour bar
        labels = [t.get_text() for t in ax.figure.axes[1].get_yticklabels()]
        assert any("may attend" in s for s in labels)
    finally:
        plt.close(ax.figure)


def test_mask_heatmap_rejects_non_boolean():
    with pytest.raises(ValueError, match="mask must be boolean"):
        mask_heatmap(np.full((3, 3), 0.5))
    plt.close("all")


def test_heads_grid_has_one_colour_bar_on_a_shared_scale():
    w = np.random.default_rng(0).dirichlet(np.ones(5), size=(3, 5))  # (H, T, S)
    w[2] *= 0.5  # a head with smaller weights must not be stretched to its own maximum
    fig = heads_grid(w)
    try:
        images = [ax.images[0] for ax in fig.axes if ax.images]
        assert len(images) == 3
        assert [im.norm.vmax for im in images] == pytest.approx([float(w.max())] * 3)
        assert len(fig.axes) == 3 + 1  # 3 heads and 1 colour bar
    finally:
        plt.close(fig)


def test_log_axes_of_curves_read_as_plain_numbers():
    from helpers.plot import plot_curves

    _, ax = plt.subplots()
    plot_curves({"a": [1.08, 0.6, 0.27, 0.62], "b": [1.1, 2.0, 3.1, 1.5]}, "step", "signal", "narrow", ax=ax, logy=True)
    ax.figure.canvas.draw()
    labels = [t.get_text() for t in ax.get_yticklabels() + ax.get_yticklabels(minor=True) if t.get_text()]
    assert {"0.3", "0.5", "1", "2", "3"} <= set(labels) and not any("times" in t or "^" in t for t in labels), labels
    _, wide = plt.subplots()
    plot_curves({"a": [1e-12, 1e-6, 1, 1e4]}, "t", "grad", "wide", ax=wide, logy=True)
    wide.figure.canvas.draw()
    minor = [t.get_text() for t in wide.get_yticklabels(minor=True) if t.get_text()]
    major = [t.get_text() for t in wide.get_yticklabels() if t.get_text()]
    assert minor == [] and len(major) >= 3  # majors alone on wide spans, each a plain number such as 1e-06
    assert all(float(t.replace("\u2212", "-")) > 0 for t in major), major
    plt.close("all")


def test_seq2seq_s0_starts_the_decoder_and_c_points_at_every_state():
    """s0 = tanh(W c) writes no output (outputs come from s1..sT), and every line from c has an arrowhead."""
    from matplotlib.patches import FancyArrowPatch

    fig = diagrams.seq2seq_diagram(list("abc"), list("cba"))
    labels = [t.get_text() for t in fig.findobj(Text)]
    assert {"s0", "s1", "s3"} <= set(labels) and "s4" not in labels
    value = matplotlib.colors.to_rgba(ROLE_COLORS["value"])
    from_c = [p for p in fig.findobj(FancyArrowPatch) if p.get_edgecolor() == value]
    assert len(from_c) == 3 + 1  # c -> s0 and c -> s1..s3, each an arrow
    ax = fig.axes[0]
    s0_x = next(t.get_position()[0] for t in ax.texts if t.get_text() == "s0")
    outs_x = [t.get_position()[0] for t in ax.texts if t.get_text() in ("c", "b", "a")]
    assert all(abs(x - s0_x) > 0.3 for x in outs_x)  # no output token sits above s0
    plt.close(fig)


def test_softmax_gradient_arrows_clear_the_bars_and_the_gradient_points_back():
    from matplotlib.patches import FancyArrowPatch

    fig = diagrams.softmax_gradient_diagram(d_k=64)
    ax = fig.axes[0]
    fig.canvas.draw()
    arrows = ax.findobj(FancyArrowPatch)
    mask = matplotlib.colors.to_rgba(ROLE_COLORS["mask"])
    back = [a for a in arrows if a.get_edgecolor() == mask]
    assert len(back) == 2  # one per row
    for a in back:
        (x0, _), (x1, _) = a._posA_posB
        assert x1 < x0  # the gradient goes from p back to the scores
    renderer = fig.canvas.get_renderer()
    for inset in fig.axes[1:]:
        labels_left = inset.get_tightbbox(renderer).x0  # the inset with its tick and axis labels, in pixels
        for a in arrows:
            (x0, y0), (x1, y1) = a._posA_posB
            right = ax.transData.transform((max(x0, x1), y0))[0]
            inset_box = inset.get_window_extent(renderer)
            y_px = ax.transData.transform((x0, y0))[1]
            if inset_box.y0 <= y_px <= inset_box.y1 and right < inset_box.x0:
                assert right < labels_left  # no arrowhead lies on the inset's axis labels
    plt.close(fig)


def test_multi_head_diagram_numbers_heads_from_1_and_says_the_heads_slice_the_projections():
    import matplotlib.pyplot as plt
    fig = diagrams.multi_head_diagram(T=5, d_model=12, n_heads=3)
    texts = " ".join(t.get_text() for t in fig.axes[0].texts)
    plt.close(fig)
    assert "head 1:" in texts and "head 3:" in texts and "head 0" not in texts
    assert "each projection reads all C = 12 input features" in texts and "projected features" in texts


# --- every architecture diagram follows its model's forward ----------------------------------------------------
# A diagram's boxes carry tags (helpers.diagrams._flow, _frame) naming the sub-modules each box stands for. Read
# along the arrows (bottom-up, or left to right), they must come in the order the model's forward calls those
# sub-modules, as forward hooks record it. Boxes at the same height (or the same x) run side by side: their
# modules may be called in either order.

from collections import Counter  # noqa: E402
from itertools import groupby  # noqa: E402

import torch  # noqa: E402
from matplotlib.patches import FancyBboxPatch  # noqa: E402

KINDS = {"MultiHeadAttention": "attn", "FeedForward": "ff", "LayerNorm": "norm", "Embedding": "embed",
         "PositionalEncoding": "pos", "LearnedPositionalEmbedding": "pos", "Linear": "head"}


def _recorded_calls(model, run, by_name=False):
    """The kinds of the sub-modules model's forward calls, in order; a classified module hides its insides."""
    calls, handles, claimed = [], [], []
    for name, module in model.named_modules():
        if module is model or any(name.startswith(p + ".") for p in claimed):
            continue
        kind = name.rsplit(".", 1)[-1] if by_name else KINDS.get(type(module).__name__)
        if kind is None:
            continue
        claimed.append(name)

        def hook(mod, args, kwargs, kind=kind):
            if kind == "attn":
                query = args[0] if args else kwargs.get("query")
                key = args[1] if len(args) > 1 else kwargs.get("key")
                kind = "attn" if key is query else "cross"  # cross-attention reads another sequence's keys
            calls.append(kind)

        handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad():
            run()
    finally:
        for h in handles:
            h.remove()
    return calls


def _drawn_order(fig):
    """{column: [Counter of the kinds at one step along the arrows, ...]}, frames unrolled."""
    items, frames = {}, {}
    for patch in fig.axes[0].findobj(FancyBboxPatch):
        tag = patch.get_gid()
        if not tag:
            continue
        x0, y0, w, h = patch.get_x(), patch.get_y(), patch.get_width(), patch.get_height()
        if tag.startswith("flow:"):
            _, col, direction, kinds = tag.split(":")
            along = y0 + h / 2 if direction == "up" else x0 + w / 2
            items.setdefault(int(col), []).append((round(along, 6), kinds.split(",")))
        elif tag.startswith("frame:"):
            _, col, times = tag.split(":")
            frames.setdefault(int(col), []).append((y0, y0 + h, int(times)))
    order = {}
    for col, col_items in items.items():
        steps = {}
        for along, kinds in col_items:
            steps.setdefault(along, Counter()).update(kinds)
        framed = [(next((f for f in frames.get(col, []) if f[0] <= along <= f[1]), None), steps[along])
                  for along in sorted(steps)]
        seq = []
        for frame, run in groupby(framed, key=lambda pair: pair[0]):  # a frame's steps, repeated as it says
            seq.extend([step for _, step in run] * (frame[2] if frame else 1))
        order[col] = seq
    return order


def _assert_same_order(drawn, calls, what):
    kinds = set().union(*drawn)
    calls = [c for c in calls if c in kinds]  # modules the diagram does not draw (say, inner norms) are not read
    i, readable = 0, [" + ".join(sorted(step.elements())) for step in drawn]
    for k, step in enumerate(drawn):
        got = Counter(calls[i:i + sum(step.values())])
        assert got == step, (f"{what}: step {k} of the diagram draws {readable[k]}, but the forward calls "
                             f"{' + '.join(sorted(got.elements()))} there\ndrawn: {readable}\ncalled: {calls}")
        i += sum(step.values())
    assert i == len(calls), f"{what}: the forward calls more than the diagram draws: {calls[i:]}"


def _enc_dec(config):
    from helpers.transformer import Transformer

    model = Transformer(config).eval()
    src, tgt = torch.randint(1, config.src_vocab_size, (2, 5)), torch.randint(1, config.tgt_vocab_size, (2, 4))
    return [((0, 1), model, lambda: model(src, tgt))]


def _pre_post(config):
    from dataclasses import replace

    from helpers.transformer import EncoderLayer

    out, x = [], torch.randn(2, 5, config.d_model)
    for col, pre in ((0, False), (1, True)):
        layer = EncoderLayer(replace(config, norm_first=pre)).eval()
        out.append(((col,), layer, lambda layer=layer: layer(x)))
    return out


def _minilm(config):
    from helpers.pretrained import MiniLM

    model = MiniLM(config).eval()
    ids = torch.randint(1, config.src_vocab_size, (2, 6))
    return [((0,), model, lambda: model(ids, torch.ones_like(ids, dtype=torch.bool)))]


def _gpt(config):
    from helpers.gpt import GPT

    model = GPT(config).eval()
    ids = torch.randint(0, config.vocab_size, (2, 7))
    return [((0,), model, lambda: model(ids))]


def _mha(d_model, n_heads):
    from helpers.attention import MultiHeadAttention

    model = MultiHeadAttention(d_model, n_heads).eval()
    x = torch.randn(2, 5, d_model)
    return [((0,), model, lambda: model(x, x, x))]


# (diagram, its kwargs, the models with the columns each stands for, whether hooks classify sub-modules by name)
ARCHITECTURE_CASES = [
    ("pre_post_ln_diagram", dict(config=_config(32, 4, 64, 1, 1, False)), lambda: _pre_post(_config(32, 4, 64, 1, 1,
                                                                                                       False)), False),
    ("encoder_decoder_diagram", dict(config=_config(32, 4, 64, 2, 3, True)), lambda: _enc_dec(_config(32, 4, 64, 2, 3,
                                                                                                      True)), False),
    ("encoder_decoder_diagram", dict(config=_config(32, 4, 64, 5, 4, False)),
     lambda: _enc_dec(_config(32, 4, 64, 5, 4, False)), False),
    ("minilm_diagram", dict(config=_config(32, 4, 64, 3, 1, False)), lambda: _minilm(_config(32, 4, 64, 3, 1, False)),
     False),
    ("gpt_diagram", dict(config=GPTConfig(20, 32, 4, 2, 64, 16)), lambda: _gpt(GPTConfig(20, 32, 4, 2, 64, 16)), False),
    ("gpt_diagram", dict(config=GPTConfig(20, 32, 4, 6, 64, 16)), lambda: _gpt(GPTConfig(20, 32, 4, 6, 64, 16)), False),
    ("multi_head_diagram", dict(T=5, d_model=32, n_heads=4), lambda: _mha(32, 4), True),
]
# Diagrams that draw no model's forward: data, arithmetic or time steps, each tested on its own above.
NOT_ARCHITECTURE = {"seq2seq_diagram", "rnn_vs_attention_path_diagram", "qkv_diagram", "softmax_gradient_diagram",
                    "mask_diagram", "positional_rotation_diagram", "kv_cache_diagram", "flash_tiles_diagram",
                    "induction_circuit_diagram"}  # lesson 13: a path between two heads, not a model's forward


@pytest.mark.parametrize("name, kwargs, models, by_name", ARCHITECTURE_CASES, ids=[c[0] for c in ARCHITECTURE_CASES])
def test_architecture_diagram_follows_the_forward(name, kwargs, models, by_name):
    fig = getattr(diagrams, name)(**kwargs)
    try:
        drawn = _drawn_order(fig)
    finally:
        plt.close(fig)
    used = set()
    for cols, model, run in models():
        torch.manual_seed(0)
        calls = _recorded_calls(model, run, by_name)
        _assert_same_order([step for c in cols for step in drawn[c]], calls, f"{name} columns {cols}")
        used.update(cols)
    assert used == set(drawn), f"{name}: columns {set(drawn) - used} are drawn but compared with no model"


def test_every_diagram_is_either_an_architecture_checked_against_its_model_or_none():
    names = {n for n in diagrams.__all__ if n.endswith("_diagram")}
    checked = {c[0] for c in ARCHITECTURE_CASES}
    assert checked.isdisjoint(NOT_ARCHITECTURE) and checked | NOT_ARCHITECTURE == names, \
        names ^ (checked | NOT_ARCHITECTURE)
    for name in NOT_ARCHITECTURE:  # and those draw no box tagged as a model's sub-module
        fn = getattr(diagrams, name)
        kwargs = next(kw for f, kw, _ in CASES if f is fn)
        fig = fn(**kwargs)
        try:
            assert _drawn_order(fig) == {}, name
        finally:
            plt.close(fig)
