"""helpers.transformer against PyTorch's own Transformer modules (float64, copied weights) and invariants."""

import dataclasses

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from helpers.attention import to_torch_mha
from helpers.masks import causal_mask, padding_mask
from helpers.transformer import (
    DecoderLayer,
    EncoderLayer,
    Transformer,
    TransformerConfig,
)

DT = torch.float64
PAD, BOS, EOS = 0, 1, 2
SRC_V, TGT_V = 13, 11
TOL = 1e-10  # float64: the orders of summation differ, nothing else


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=DT)


def ids(B, L, V, seed, low=3):
    """(B, L) random non-special ids in [low, V)."""
    return torch.randint(low, V, (B, L), generator=torch.Generator().manual_seed(seed))


def make_model(seed=0, **overrides):
    torch.manual_seed(seed)
    return Transformer(TransformerConfig.tiny(SRC_V, TGT_V, **overrides)).to(DT).eval()


def worst(a, b):
    return (a - b).abs().max().item()


# --- copying our weights into PyTorch's modules ------------------------------------------------

def copy_mha(ours, theirs: nn.MultiheadAttention):
    theirs.load_state_dict(to_torch_mha(ours).state_dict())


@torch.no_grad()
def copy_encoder_layer(ours: EncoderLayer, theirs: nn.TransformerEncoderLayer):
    copy_mha(ours.self_attn, theirs.self_attn)
    theirs.linear1.load_state_dict(ours.ff.linear1.state_dict())
    theirs.linear2.load_state_dict(ours.ff.linear2.state_dict())
    theirs.norm1.load_state_dict(ours.norm1.state_dict())
    theirs.norm2.load_state_dict(ours.norm2.state_dict())


@torch.no_grad()
def copy_decoder_layer(ours: DecoderLayer, theirs: nn.TransformerDecoderLayer):
    copy_mha(ours.self_attn, theirs.self_attn)
    copy_mha(ours.cross_attn, theirs.multihead_attn)
    theirs.linear1.load_state_dict(ours.ff.linear1.state_dict())
    theirs.linear2.load_state_dict(ours.ff.linear2.state_dict())
    for i in (1, 2, 3):
        getattr(theirs, f"norm{i}").load_state_dict(getattr(ours, f"norm{i}").state_dict())


def randomise(module, seed):
    """Give every parameter (LayerNorms included) random values, so that copying mistakes show."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.3)


# --- config -----------------------------------------------------------------------------------

def test_config_defaults_are_the_paper_base_sizes_and_base_is_post_ln():
    c = TransformerConfig(100, 200)
    assert (c.d_model, c.n_heads, c.d_ff, c.n_encoder_layers, c.n_decoder_layers, c.dropout) == \
        (512, 8, 2048, 6, 6, 0.1)
    assert c.norm_first is True and c.pad_id == 0 and c.head_dim == 64
    b = TransformerConfig.base(100, 200)
    assert b.norm_first is False and (b.d_model, b.n_heads, b.d_ff) == (512, 8, 2048)
    t = TransformerConfig.tiny(5, 7, n_heads=2)
    assert (t.src_vocab_size, t.tgt_vocab_size, t.d_model, t.n_heads) == (5, 7, 32, 2)


def test_config_is_frozen():
    c = TransformerConfig.tiny(5, 5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.d_model = 64


@pytest.mark.parametrize("kwargs, words", [
    (dict(d_model=30, n_heads=4), ["d_model=30", "n_heads=4"]),
    (dict(d_model=0), ["d_model", "positive"]),
    (dict(n_encoder_layers=-1), ["n_encoder_layers", "-1"]),
    (dict(dropout=1.0), ["dropout", "[0, 1)"]),
    (dict(dropout=-0.1), ["dropout", "-0.1"]),
    (dict(max_len=0), ["max_len"]),
    (dict(pad_id=5), ["pad_id", "5"]),
])
def test_config_rejects_bad_values_with_a_clear_message(kwargs, words):
    with pytest.raises(ValueError) as err:
        TransformerConfig.tiny(5, 8, **kwargs)
    for w in words:
        assert w in str(err.value)


def test_config_rejects_non_bool_norm_first():
    with pytest.raises(TypeError, match="norm_first"):
        TransformerConfig.tiny(5, 8, norm_first=1)


# --- the blocks against PyTorch ---------------------------------------------------------------


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_equals_torch(norm_first):
    cfg = TransformerConfig.tiny(SRC_V, TGT_V, norm_first=norm_first)
    torch.manual_seed(0)
    ours = EncoderLayer(cfg).to(DT).eval()
    randomise(ours, 1)
    theirs = nn.TransformerEncoderLayer(cfg.d_model, cfg.n_heads, cfg.d_ff, dropout=0.0, batch_first=True,
                                        norm_first=norm_first, dtype=DT).eval()
    copy_encoder_layer(ours, theirs)
    x = rand(3, 7, cfg.d_model, seed=2)
    lengths = torch.tensor([7, 4, 1])
    keep = padding_mask(lengths, 7)  # (B, 1, 1, S), True = may attend
    got = ours(x, keep)
    expected = theirs(x, src_key_padding_mask=~keep[:, 0, 0])  # PyTorch: True = ignore
    assert worst(got, expected) < TOL, worst(got, expected)
    # and without a mask
    assert worst(ours(x), theirs(x)) < TOL


def test_post_ln_and_pre_ln_differ():
    torch.manual_seed(0)
    post = EncoderLayer(TransformerConfig.tiny(5, 5, norm_first=False)).to(DT)
    pre = EncoderLayer(TransformerConfig.tiny(5, 5, norm_first=True)).to(DT)
    pre.load_state_dict(post.state_dict())
    x = rand(2, 4, 32)
    assert worst(post(x), pre(x)) > 1e-3
    # Post-LN ends in a LayerNorm: every position has mean 0 and variance 1 (weight 1, bias 0)
    out = post(x)
    assert torch.allclose(out.mean(-1), torch.zeros(2, 4, dtype=DT), atol=1e-9)


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_equals_torch(norm_first):
    cfg = TransformerConfig.tiny(SRC_V, TGT_V, norm_first=norm_first)
    torch.manual_seed(0)
    ours = DecoderLayer(cfg).to(DT).eval()
    randomise(ours, 3)
    theirs = nn.TransformerDecoderLayer(cfg.d_model, cfg.n_heads, cfg.d_ff, dropout=0.0, batch_first=True,
                                        norm_first=norm_first, dtype=DT).eval()
    copy_decoder_layer(ours, theirs)
    x, memory = rand(2, 5, cfg.d_model, seed=4), rand(2, 6, cfg.d_model, seed=5)
    mem_keep = padding_mask([6, 3], 6)  # (B, 1, 1, S)
    got = ours(x, memory, causal_mask(5), mem_keep)
    expected = theirs(x, memory, tgt_mask=~causal_mask(5), memory_key_padding_mask=~mem_keep[:, 0, 0])
    assert worst(got, expected) < TOL, worst(got, expected)


@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")
@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_logits_equal_torch_transformer(norm_first):
    """Same weights, same embedded inputs, same masks: nn.Transformer + our generator gives our logits."""
    model = make_model(norm_first=norm_first)
    randomise(model.encoder.layers, 6)
    randomise(model.decoder.layers, 7)
    cfg = model.config
    ref = nn.Transformer(cfg.d_model, cfg.n_heads, cfg.n_encoder_layers, cfg.n_decoder_layers, cfg.d_ff,
                         dropout=0.0, batch_first=True, norm_first=norm_first, dtype=DT).eval()
    for ours, theirs in zip(model.encoder.layers, ref.encoder.layers, strict=True):
        copy_encoder_layer(ours, theirs)
    for ours, theirs in zip(model.decoder.layers, ref.decoder.layers, strict=True):
        copy_decoder_layer(ours, theirs)
    ref.encoder.norm.load_state_dict(model.encoder.norm.state_dict())
    ref.decoder.norm.load_state_dict(model.decoder.norm.state_dict())

    src = ids(3, 8, SRC_V, seed=8)
    src[1, 5:] = PAD
    src[2, 2:] = PAD
    tgt = ids(3, 6, TGT_V, seed=9)
    tgt[:, 0] = BOS
    tgt[0, 4:] = PAD
    got = model(src, tgt)  # (B, T, V)
    hidden = ref(model.encoder.embed_tokens(src), model.decoder.embed_tokens(tgt),
                 tgt_mask=~causal_mask(6), src_key_padding_mask=src == PAD,
                 tgt_key_padding_mask=tgt == PAD, memory_key_padding_mask=src == PAD)
    expected = model.head(hidden)
    assert got.shape == (3, 6, TGT_V)
    assert worst(got, expected) < TOL, worst(got, expected)


def test_embeddings_are_scaled_by_sqrt_d_model_and_pad_embeds_to_zero():
    model = make_model()
    src = torch.tensor([[3, 0]])
    x = model.encoder.embed_tokens(src)
    pe = model.encoder.pos.pe[:2].to(DT)
    assert torch.allclose(x[0, 0], model.encoder.embed.weight[3] * 32 ** 0.5 + pe[0], atol=TOL)
    assert torch.allclose(x[0, 1], pe[1], atol=TOL)  # the pad row of the embedding is zero


# --- invariants (hypothesis) ------------------------------------------------------------------

MODEL = make_model(seed=11)


@given(B=st.integers(1, 3), S=st.integers(1, 9), T=st.integers(2, 9), cut=st.integers(1, 8),
       seed=st.integers(0, 10_000))
def test_future_targets_do_not_change_earlier_logits(B, S, T, cut, seed):
    cut = min(cut, T - 1)
    src, tgt = ids(B, S, SRC_V, seed), ids(B, T, TGT_V, seed + 1)
    changed = tgt.clone()
    changed[:, cut:] = ids(B, T - cut, TGT_V, seed + 2)
    a, b = MODEL(src, tgt), MODEL(src, changed)
    assert torch.allclose(a[:, :cut], b[:, :cut], atol=TOL)
    if not torch.equal(tgt[:, cut:], changed[:, cut:]):
        assert not torch.allclose(a[:, cut:], b[:, cut:], atol=1e-6)  # the future does matter later


@given(B=st.integers(1, 3), S=st.integers(1, 8), extra=st.integers(1, 6), T=st.integers(1, 6),
       seed=st.integers(0, 10_000))
def test_appending_source_padding_changes_nothing(B, S, extra, T, seed):
    src, tgt = ids(B, S, SRC_V, seed), ids(B, T, TGT_V, seed + 1)
    padded = torch.cat([src, torch.full((B, extra), PAD)], dim=1)  # (B, S) -> (B, S + extra)
    assert torch.allclose(MODEL(src, tgt), MODEL(padded, tgt), atol=TOL)


@given(S=st.integers(2, 8), T=st.integers(1, 6), seed=st.integers(0, 10_000))
def test_batch_items_are_independent(S, T, seed):
    src, tgt = ids(3, S, SRC_V, seed), ids(3, T, TGT_V, seed + 1)
    src[1, S // 2:] = PAD  # a padded row in the middle of the batch
    together = MODEL(src, tgt)
    for b in range(3):
        alone = MODEL(src[b:b + 1], tgt[b:b + 1])
        assert torch.allclose(together[b:b + 1], alone, atol=TOL)


def test_source_pads_are_invisible_to_the_decoder():
    """Changing what the encoder computes at pad positions must not move the logits."""
    src, tgt = ids(2, 6, SRC_V, 1), ids(2, 4, TGT_V, 2)
    src[:, 4:] = PAD
    memory, src_mask = MODEL.encode(src)
    noisy = memory.clone()
    noisy[:, 4:] += 100.0
    assert torch.allclose(MODEL.decode(tgt, memory, src_mask), MODEL.decode(tgt, noisy, src_mask), atol=TOL)
    assert not torch.allclose(MODEL.decode(tgt, memory, None), MODEL.decode(tgt, noisy, None), atol=1e-3)


# --- errors -----------------------------------------------------------------------------------

def test_out_of_range_id_names_the_id_and_the_vocabulary():
    src = ids(2, 4, SRC_V, 0)
    src[1, 2] = SRC_V + 4
    with pytest.raises(ValueError) as err:
        MODEL(src, ids(2, 3, TGT_V, 1))
    assert f"token id {SRC_V + 4}" in str(err.value) and f"size {SRC_V}" in str(err.value)
    assert "(1, 2)" in str(err.value)
    with pytest.raises(ValueError, match="token id -1"):
        MODEL(ids(1, 3, SRC_V, 0), torch.tensor([[1, -1]]))


def test_too_long_sequence_names_the_length_and_max_len():
    with pytest.raises(ValueError) as err:
        MODEL(ids(1, 65, SRC_V, 0), ids(1, 3, TGT_V, 1))
    assert "length 65" in str(err.value) and "max_len=64" in str(err.value)


@pytest.mark.parametrize("bad, exc, words", [
    (torch.ones(2, 3), TypeError, ["integer", "float32"]),
    (torch.ones(2, 3, dtype=torch.bool), TypeError, ["integer", "bool"]),
    (torch.ones(3, dtype=torch.long), ValueError, ["(B, L)", "(3)"]),
    (torch.ones(1, 2, 3, dtype=torch.long), ValueError, ["(B, L)", "(1, 2, 3)"]),
    ([[1, 2]], TypeError, ["torch.Tensor", "list"]),
])
def test_wrong_dtype_or_ndim_is_named(bad, exc, words):
    with pytest.raises(exc) as err:
        MODEL(bad, ids(1, 3, TGT_V, 1))
    for w in words:
        assert w in str(err.value)


def test_batch_mismatch_and_bad_memory_are_named():
    with pytest.raises(ValueError, match="same batch size"):
        MODEL(ids(2, 3, SRC_V, 0), ids(3, 3, TGT_V, 1))
    with pytest.raises(ValueError, match="memory must have shape"):
        MODEL.decode(ids(2, 3, TGT_V, 1), rand(2, 4, 16))


# --- dropout: where it fires in train mode, and that eval mode has none --------------------------

# calls of each nn.Dropout per forward, by the module that owns it: one after the positions, one on the
# feed-forward's hidden units, and the layer's own after every sub-layer (2 in an encoder layer, 3 in a
# decoder layer). MultiHeadAttention's module only holds p: the weights are dropped inside the attention.
DROPOUT_CALLS = {"PositionalEncoding": 1, "FeedForward": 1, "EncoderLayer": 2, "DecoderLayer": 3,
                 "MultiHeadAttention": 0}


@pytest.mark.parametrize("norm_first", [False, True])
def test_dropout_fires_where_the_model_defines_it_in_train_mode_only(norm_first):
    p = 0.5
    model = make_model(dropout=p, norm_first=norm_first)
    seen = []  # (module name, fraction zeroed, kept values scaled by 1 / (1 - p), output == input)

    def record(name):
        def hook(module, inputs, output):
            x, kept = inputs[0], output != 0
            seen.append((name, 1 - kept.float().mean().item(),
                         torch.allclose(output[kept], x[kept] / (1 - p)), torch.equal(output, x)))
        return hook

    expected = {}
    for name, m in model.named_modules():
        if isinstance(m, nn.Dropout):
            m.register_forward_hook(record(name))
            owner = type(model.get_submodule(name.rsplit(".", 1)[0])).__name__
            if DROPOUT_CALLS[owner]:
                expected[name] = DROPOUT_CALLS[owner]
    assert len(expected) == 2 + 2 * 2 + 2 * 2  # 2 positions; each of 2 + 2 layers: its own and its feed-forward's

    def calls():
        return {name: [n for n, *_ in seen].count(name) for name, *_ in seen}

    src, tgt = ids(2, 7, SRC_V, seed=1), ids(2, 5, TGT_V, seed=2)
    model.train()
    with torch.random.fork_rng():
        torch.manual_seed(0)
        first, second = model(src, tgt), model(src, tgt)
    assert calls() == {name: 2 * n for name, n in expected.items()}  # two forwards
    assert all(0 < zeroed < 1 and ok for _, zeroed, ok, _ in seen)  # some zeroed, the rest scaled by 2
    assert not torch.allclose(first, second)  # a fresh mask every forward
    rows = model.encoder.layers[0].attn_weights.sum(-1)  # (B, H, T): the attention weights are dropped too
    assert not torch.allclose(rows, torch.ones_like(rows))
    seen.clear()
    model.eval()
    assert torch.equal(model(src, tgt), model(src, tgt))
    assert calls() == {name: 2 * n for name, n in expected.items()}
    assert all(same for *_, same in seen)  # in eval mode every dropout passes its input through
    rows = model.encoder.layers[0].attn_weights.sum(-1)
    assert torch.allclose(rows, torch.ones_like(rows))
