"""One rule for each kind of input: integer-like sizes, the remaining silent or obscure cases, figures
that draw the right array, and the Transformer's initialisation."""

import datetime
import json
import struct

import matplotlib
import numpy as np
import pytest
import torch

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from helpers.attention import MultiHeadAttention  # noqa: E402
from helpers.data import Vocab, digit_pairs, format_date, read_date_tsv  # noqa: E402
from helpers.device import attention_flops, cpu_threads, loglog_slope  # noqa: E402
from helpers.masks import causal_mask, padding_mask  # noqa: E402
from helpers.plot import attention_heatmap, encoding_image, heads_grid, mask_heatmap, plot_curves  # noqa: E402
from helpers.pretrained import WordPieceTokenizer, load_safetensors  # noqa: E402
from helpers.train import exact_match, sequence_loss, token_accuracy, train  # noqa: E402
from helpers.transformer import (  # noqa: E402
    EncoderLayer,
    Transformer,
    TransformerConfig,
    beam_search,
    greedy_decode,
    greedy_decode_cached,
)

# --- integer-like sizes: ints, numpy integers and 0-d integer tensors; never bools or floats ------------

INTEGER_LIKE = [4, np.int64(4), np.int32(4), torch.tensor(4)]
NOT_INTEGERS = [True, 4.0, np.float64(4.0), torch.tensor(4.0), "4", torch.tensor([4])]


def tiny_model():
    torch.manual_seed(0)
    return Transformer(TransformerConfig.tiny(9, 7)).eval()


SIZE_TAKERS = {
    "MultiHeadAttention": lambda n: MultiHeadAttention(8 * n, n),
    "TransformerConfig": lambda n: TransformerConfig.tiny(9, 7, n_heads=n),
    "beam_search": lambda n: beam_search(tiny_model(), torch.tensor([[3, 4]]), 1, 2, 4, beam_size=n),
    "greedy_decode": lambda n: greedy_decode(tiny_model(), torch.tensor([[3, 4]]), 1, 2, n),
    "greedy_decode_cached": lambda n: greedy_decode_cached(tiny_model(), torch.tensor([[3, 4]]), 1, 2, n,
                                                           check_every=n),
    "causal_mask": lambda n: causal_mask(n),
    "attention_flops": lambda n: attention_flops(n, 1, 1, 1, 1),
    "cpu_threads": lambda n: cpu_threads(n).__enter__(),
    "digit_pairs": lambda n: digit_pairs(n, 1, n, seed=0),
}


@pytest.mark.parametrize("taker", SIZE_TAKERS, ids=str)
@pytest.mark.parametrize("value", INTEGER_LIKE, ids=repr)
def test_every_size_accepts_integer_like_values(taker, value):
    before = torch.get_num_threads()
    try:
        SIZE_TAKERS[taker](value)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("taker", SIZE_TAKERS, ids=str)
@pytest.mark.parametrize("value", NOT_INTEGERS, ids=repr)
def test_every_size_refuses_bools_floats_and_strings(taker, value):
    with pytest.raises(ValueError, match=r"must be (a positive int|a non-negative int|an int in \[)"):
        SIZE_TAKERS[taker](value)


def test_a_config_stores_python_ints():
    cfg = TransformerConfig.tiny(np.int64(9), 7, d_model=np.int64(32), pad_id=np.int64(0))
    assert type(cfg.d_model) is int and type(cfg.src_vocab_size) is int and type(cfg.pad_id) is int


# --- the remaining silent or obscure cases --------------------------------------------------------------

@pytest.mark.parametrize("alpha", [float("nan"), float("inf"), -0.5])
def test_beam_search_refuses_a_length_penalty_that_is_not_a_finite_number_ge_0(alpha):
    with pytest.raises(ValueError, match=r"length_penalty \(alpha\) must be a finite number in \[0, inf\), got "):
        beam_search(tiny_model(), torch.tensor([[3, 4]]), 1, 2, 4, length_penalty=alpha)


def test_loglog_slope_refuses_constant_sizes():
    with pytest.raises(ValueError, match=r"sizes must not all be equal .* \[8.0, 8.0, 8.0\]"):
        loglog_slope([8, 8, 8], [1.0, 2.0, 3.0])
    assert abs(loglog_slope([1, 2, 4], [1.0, 4.0, 16.0]) - 2.0) < 1e-12


def test_token_accuracy_agrees_with_exact_match_when_there_is_no_real_token():
    pred, target = torch.tensor([[3, 4]]), torch.tensor([[0, 0]])
    assert token_accuracy(pred, target, pad_id=0) == exact_match(pred, target, pad_id=0) == 1.0
    assert token_accuracy(torch.tensor([[3, 5]]), torch.tensor([[3, 4]]), pad_id=0) == 0.5


def test_sequence_loss_takes_int32_targets():
    logits = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(0))
    targets = torch.tensor([[1, 2, 0], [4, 0, 0]])
    expected = sequence_loss(logits, targets, pad_id=0)
    assert torch.equal(sequence_loss(logits, targets.int(), pad_id=0), expected)


@pytest.mark.parametrize("returned, got", [(None, "None"), (1.5, "1.5"), ("per_item", r"a tensor of shape \(3,\)")])
def test_train_refuses_a_loss_fn_that_returns_no_scalar_tensor(returned, got):
    w = torch.nn.Parameter(torch.ones(3))
    result = {"per_item": lambda: w * 2}.get(returned, lambda: returned)
    with pytest.raises(TypeError, match=rf"loss_fn must return the loss as a 0-d floating tensor.*got {got}"):
        train(lambda batch: result(), torch.optim.SGD([w], lr=0.1), lambda step: None, steps=2, threads=None)


def test_convert_ids_to_tokens_refuses_negative_ids(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n", encoding="utf-8")
    tok = WordPieceTokenizer(vocab)
    assert tok.convert_ids_to_tokens([4, 0]) == ["hello", "[PAD]"]
    with pytest.raises(ValueError, match=r"token id at position 0 must be an int in \[0, 4\], got -1"):
        tok.convert_ids_to_tokens([-1])
    with pytest.raises(ValueError, match="max_chars_per_word must be a positive int, got -1"):
        WordPieceTokenizer(vocab, max_chars_per_word=-1)


def test_digit_pairs_refuses_a_negative_count():
    with pytest.raises(ValueError, match="n must be a non-negative int, got -1"):
        digit_pairs(-1, 1, 3, seed=0)
    assert digit_pairs(0, 1, 3, seed=0) == []


def test_layers_refuse_a_stream_of_the_wrong_width_or_dtype():
    layer = EncoderLayer(TransformerConfig.tiny(9, 7))
    with pytest.raises(TypeError, match="x must be a floating-point tensor, got dtype torch.int64"):
        layer(torch.zeros(2, 3, 32, dtype=torch.long))
    with pytest.raises(ValueError, match=r"x must have shape \(B, T, C=32\), got \(2, 3, 16\)"):
        layer(torch.zeros(2, 3, 16))


@pytest.mark.parametrize("call, error, message", [
    (lambda: padding_mask(None, 3), TypeError, "lengths must be a list or 1-D tensor of ints"),
    (lambda: padding_mask("abc", 3), TypeError, "lengths must be a list or 1-D tensor of ints"),
    (lambda: Vocab(123), TypeError, "symbols must be a string or an iterable of strings, got int"),
    (lambda: Vocab([1, 2]), TypeError, r"symbols must be strings, got 1 \(int\)"),
    (lambda: read_date_tsv(123), TypeError, "path must be a str or a pathlib.Path, got int"),
    (lambda: format_date(datetime.date(2000, 1, 2), 7), TypeError, "fmt must be a format string"),
])
def test_wrong_python_types_get_a_clear_error(call, error, message):
    with pytest.raises(error, match=message):
        call()


@pytest.mark.parametrize("entry, message", [
    ("not a dict", "must have an entry with a dtype"),
    ({"dtype": "F32", "shape": "2", "data_offsets": [0, 8]}, "has shape '2', not a list of non-negative ints"),
    ({"dtype": "F32", "shape": [2], "data_offsets": [0]}, r"data_offsets \[0\], not a list \[begin, end\]"),
])
def test_load_safetensors_checks_the_types_in_its_header(tmp_path, entry, message):
    header = json.dumps({"w": entry}).encode()
    path = tmp_path / "bad.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(8))
    with pytest.raises(ValueError, match=message):
        load_safetensors(path)
    path.write_bytes(struct.pack("<Q", 2) + b"[]")
    with pytest.raises(ValueError, match="the header must be a JSON object"):
        load_safetensors(path)


# --- figures draw the array they are given ----------------------------------------------------------------

WEIGHTS = np.arange(12, dtype=float).reshape(3, 4) / 12  # (T, S) with T != S: a transpose would show


def test_attention_heatmap_draws_rows_as_queries_and_columns_as_keys():
    ax = attention_heatmap(WEIGHTS, query_labels=list("abc"), key_labels=list("wxyz"))
    assert np.array_equal(ax.images[0].get_array(), WEIGHTS)
    assert [t.get_text() for t in ax.get_yticklabels()] == list("abc")
    assert [t.get_text() for t in ax.get_xticklabels()] == list("wxyz")
    plt.close(ax.figure)


def test_mask_heatmap_and_encoding_image_draw_their_array():
    mask = np.array([[True, False, False], [True, True, False]])
    ax = mask_heatmap(mask)
    assert np.array_equal(ax.images[0].get_array(), mask.astype(float))
    plt.close(ax.figure)
    pe = np.linspace(-1, 1, 10).reshape(5, 2)
    ax = encoding_image(pe)
    assert np.array_equal(ax.images[0].get_array(), pe)
    plt.close(ax.figure)


def test_heads_grid_draws_head_h_in_panel_h():
    weights = np.stack([WEIGHTS, WEIGHTS[::-1], 1 - WEIGHTS])  # (H, T, S)
    fig = heads_grid(weights, ncols=2)
    panels = [ax for ax in fig.axes if ax.images and ax.get_title().startswith("head")]
    assert [ax.get_title() for ax in panels] == ["head 0", "head 1", "head 2"]
    for h, ax in enumerate(panels):
        assert np.array_equal(ax.images[0].get_array(), weights[h])
    plt.close(fig)


def test_plot_curves_draws_each_curve_against_x():
    ax = plot_curves({"a": [1.0, 2.0, 4.0], "b": [3.0, 2.0, 1.0]}, "x", "y", "t", x=[10, 20, 40])
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert np.array_equal(lines["a"].get_xdata(), [10, 20, 40]) and np.array_equal(lines["a"].get_ydata(), [1, 2, 4])
    assert np.array_equal(lines["b"].get_ydata(), [3, 2, 1])
    plt.close(ax.figure)


# --- initialisation -----------------------------------------------------------------------------------------

def test_transformer_initialisation_zero_biases_xavier_weights_and_a_zero_pad_row():
    model = Transformer(TransformerConfig.tiny(9, 7, pad_id=0))
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(torch.count_nonzero(m.bias) == 0 for m in linears)
    for m in linears:  # Xavier-uniform: |w| <= sqrt(6 / (fan_in + fan_out)), and the bound nearly reached
        bound = (6 / sum(m.weight.shape)) ** 0.5
        assert m.weight.abs().max() <= bound and m.weight.abs().max() > 0.8 * bound
    for embed in (model.encoder.embed, model.decoder.embed):
        assert torch.count_nonzero(embed.weight[0]) == 0  # the pad row
        assert abs(embed.weight[1:].std().item() - 32 ** -0.5) < 0.3 * 32 ** -0.5


def test_numpy_and_0d_tensor_scalars_follow_one_rule():
    """Sizes, top_k, temperature, top_p and dropout all take numpy and 0-d tensor scalars alike."""
    import numpy as np

    from helpers.gpt import GPTConfig, filter_logits

    cfg = GPTConfig(np.int64(11), np.int32(16), 4, 2, 32, torch.tensor(8), dropout=np.float64(0.1),
                    n_kv_heads=np.int64(2))
    assert (cfg.vocab_size, cfg.max_len, cfg.n_kv_heads, cfg.dropout) == (11, 8, 2, 0.1)
    assert isinstance(cfg.max_len, int) and isinstance(cfg.n_kv_heads, int)
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    expected = filter_logits(logits, 0.5, 2, 0.9)
    for t, k, p in ((np.float32(0.5), np.int64(2), np.float64(0.9)),
                    (torch.tensor(0.5), torch.tensor(2), torch.tensor(0.9, dtype=torch.float64))):
        assert torch.allclose(filter_logits(logits, t, k, p), expected)
    with pytest.raises(ValueError, match=r"temperature must be a positive finite number .* got tensor\(\[0.5000\]\)"):
        filter_logits(logits, torch.tensor([0.5]))
