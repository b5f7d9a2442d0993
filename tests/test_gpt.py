"""helpers.gpt against PyTorch's own modules (float64, copied weights), its invariants and its checkpoint."""

import hashlib
import math
import shutil

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from helpers.attention import to_torch_mha
from helpers.data import DataFileError, Vocab, find_data_dir, load_text
from helpers.gpt import (
    CHECKPOINT,
    GPT,
    GPTConfig,
    bits_per_char,
    load_course_gpt,
    ngram_bits_per_char,
    parameter_count,
    random_windows,
)

DT = torch.float64
V = 11
TOL = 1e-10  # float64: only the order of summation differs


def make_model(seed=0, **overrides):
    torch.manual_seed(seed)
    model = GPT(GPTConfig.tiny(V, **overrides)).to(DT).eval()
    with torch.no_grad():  # non-trivial LayerNorm and bias values, so that a missed copy shows
        for name, p in model.named_parameters():
            if "norm" in name or "bias" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def rand_ids(B, T, seed=0, vocab=V):
    return torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(seed))


# --- the same computation from torch's own modules --------------------------------------------

def torch_reference(model: GPT, ids: torch.Tensor) -> torch.Tensor:
    """Logits from nn.Embedding + nn.TransformerEncoderLayer(norm_first) + nn.LayerNorm with copied weights."""
    cfg = model.config
    T = ids.shape[1]
    layers = []
    for block in model.blocks:
        layer = nn.TransformerEncoderLayer(cfg.d_model, cfg.n_heads, cfg.d_ff, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True, dtype=DT)
        layer.self_attn = to_torch_mha(block.attn)
        with torch.no_grad():
            for mine, theirs in ((block.ff.linear1, layer.linear1), (block.ff.linear2, layer.linear2),
                                 (block.norm1, layer.norm1), (block.norm2, layer.norm2)):
                theirs.weight.copy_(mine.weight)
                theirs.bias.copy_(mine.bias)
        layers.append(layer.eval())
    blocked = torch.ones(T, T, dtype=torch.bool).triu(1)  # torch's polarity: True = may NOT attend
    x = F.embedding(ids, model.embed.weight) + model.pos.table.weight[:T]  # (B, T, C)
    for layer in layers:
        x = layer(x, src_mask=blocked)
    x = F.layer_norm(x, (cfg.d_model,), model.norm.weight, model.norm.bias)
    return x @ model.embed.weight.T  # tied output layer: (B, T, C) @ (C, V)


@pytest.mark.parametrize("T", [1, 5, 32])
def test_equals_torch_modules_with_copied_weights(T):
    model = make_model()
    ids = rand_ids(3, T, seed=T)
    assert (model(ids) - torch_reference(model, ids)).abs().max() <= TOL


def test_output_layer_is_tied_to_the_embedding():
    model = make_model()
    assert model.head.weight is model.embed.weight
    loss = model(rand_ids(2, 6)).sum()
    loss.backward()
    # one matrix, one gradient: it collects the input side's and the output side's parts
    assert model.embed.weight.grad is not None and model.embed.weight.grad.abs().sum() > 0
    untied = make_model(tie_weights=False)
    assert untied.head.weight is not untied.embed.weight


@pytest.mark.parametrize("overrides", [{}, {"tie_weights": False}, {"n_kv_heads": 1}, {"n_kv_heads": 2},
                                       {"d_model": 24, "n_heads": 3, "n_layers": 3, "d_ff": 40, "max_len": 7}])
def test_parameter_count_formula(overrides):
    config = GPTConfig.tiny(V, **overrides)
    model = GPT(config)
    assert parameter_count(config) == sum(p.numel() for p in model.parameters())


@settings(max_examples=30, deadline=None)
@given(T=st.integers(2, 20), t=st.data(), seed=st.integers(0, 10_000))
def test_changing_token_t_never_changes_the_logits_before_t(T, t, seed):
    model = make_model(seed % 7)
    ids = rand_ids(2, T, seed)
    pos = t.draw(st.integers(0, T - 1))
    changed = ids.clone()
    changed[:, pos] = (changed[:, pos] + 1 + seed % (V - 1)) % V
    a, b = model(ids), model(changed)
    assert torch.equal(a[:, :pos], b[:, :pos])
    assert not torch.equal(a[:, pos:], b[:, pos:])  # the position itself (and later) does see it


# --- the KV cache, and the special ids (generation itself: tests/test_decoding.py) -----------------

@pytest.mark.parametrize("n_kv_heads", [None, 2, 1])
def test_cached_logits_equal_full_forward(n_kv_heads):
    model = make_model(n_kv_heads=n_kv_heads)
    ids = rand_ids(2, 12)
    full = model(ids)
    caches = model.new_caches(2, 12)
    prefix = model.forward_cached(ids[:, :5], caches)  # prefill 5 positions at once
    steps = [model.forward_cached(ids[:, t:t + 1], caches) for t in range(5, 12)]  # then one at a time
    assert (torch.cat([prefix, *steps], dim=1) - full).abs().max() <= TOL
    assert all(c.length == 12 for c in caches)


def test_special_ids_are_checked():
    with pytest.raises(ValueError, match=r"each of special_ids \(a token id\) must be an int in \[0, 10\], got 11"):
        GPTConfig.tiny(V, special_ids=(1, 11))
    with pytest.raises(ValueError, match="cover the whole vocabulary"):
        GPTConfig.tiny(3, special_ids=(0, 1, 2))
    with pytest.raises(TypeError, match="special_ids must be a tuple of token ids, got int"):
        GPTConfig.tiny(V, special_ids=2)
    assert GPTConfig.tiny(V, special_ids=[2, 1, 2]).special_ids == (1, 2)


# --- bad input -----------------------------------------------------------------------------------

@pytest.mark.parametrize("overrides, match", [
    (dict(d_model=15), "divisible"), (dict(n_kv_heads=3), "n_kv_heads"), (dict(n_layers=0), "n_layers"),
    (dict(dropout=1.0), "dropout"), (dict(tie_weights=1), "tie_weights"),
])
def test_bad_config(overrides, match):
    with pytest.raises((ValueError, TypeError), match=match):
        GPTConfig.tiny(V, **overrides)


def test_bad_ids_give_clear_errors():
    model = make_model()
    with pytest.raises(TypeError, match="int64"):
        model(torch.zeros(1, 3))
    with pytest.raises(ValueError, match=r"\(B, L\)"):
        model(torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="token id 11 at position"):
        model(torch.tensor([[1, 11]]))
    with pytest.raises(ValueError, match="max_len=32"):
        model(torch.zeros(1, 33, dtype=torch.long))
    with pytest.raises(ValueError, match="max_len=32"):
        model.generate(torch.zeros(1, 33, dtype=torch.long), 3)  # the prompt must fit; the output need not
    with pytest.raises(ValueError, match="max_new_tokens"):
        model.generate(torch.zeros(1, 3, dtype=torch.long), -1)
    with pytest.raises(ValueError, match="temperature"):
        model.generate(torch.zeros(1, 3, dtype=torch.long), 2, temperature=0)
    with pytest.raises(TypeError, match="generator"):
        model.generate(torch.zeros(1, 3, dtype=torch.long), 2, generator=1)
    with pytest.raises(TypeError, match="GPTConfig"):
        GPT({"vocab_size": 3})


# --- data, baselines, checkpoint ---------------------------------------------------------------

def test_load_text_splits_are_disjoint_and_cover_the_file():
    parts = [load_text(s) for s in ("train", "valid", "test")]
    text = (find_data_dir() / "shakespeare.txt").read_text("ascii")
    assert "".join(parts) == text
    assert all(p.endswith("\n") for p in parts) and parts[1].split("\n")[0].endswith(":")
    assert 0.89 < len(parts[0]) / len(text) < 0.91
    with pytest.raises(ValueError, match="split"):
        load_text("validation")


def test_bits_per_char_equals_cross_entropy():
    model = make_model()
    ids = rand_ids(1, 65).flatten()
    logits = model(ids[:-1].view(2, 32))  # two windows of 32
    expected = F.cross_entropy(logits.flatten(0, 1), ids[1:].view(-1)).item() / math.log(2)
    assert abs(bits_per_char(model, ids) - expected) < 1e-12


def test_random_windows_are_shifted_by_one():
    ids = torch.arange(100)
    x, y = random_windows(ids, 8, 5, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (5, 8) and torch.equal(y, x + 1)


def test_checkpoint_sha256_and_held_out_bits_per_char():
    model, vocab = load_course_gpt()
    assert isinstance(vocab, Vocab) and not model.training
    path = find_data_dir() / CHECKPOINT
    assert path.stat().st_size <= 5 * 2**20
    train_text = load_text("train")
    assert vocab.itos == Vocab(train_text).itos
    train_ids = torch.tensor(vocab.encode(train_text))
    valid_ids = torch.tensor(vocab.encode(load_text("valid")))
    bigram = ngram_bits_per_char(train_ids, valid_ids, len(vocab), 2)
    bpc = bits_per_char(model, valid_ids)
    assert bpc <= 0.75 * bigram, (bpc, bigram)
    assert hashlib.sha256(path.read_bytes()).hexdigest() in (find_data_dir() / "README.md").read_text()


def test_checkpoint_with_another_sha256_is_refused(tmp_path, monkeypatch):
    folder = find_data_dir()
    shutil.copy(folder / "README.md", tmp_path / "README.md")
    data = bytearray((folder / CHECKPOINT).read_bytes())
    data[-100] ^= 1
    (tmp_path / CHECKPOINT).write_bytes(bytes(data))
    monkeypatch.setenv("COURSE_DATA_DIR", str(tmp_path))
    with pytest.raises(DataFileError, match="sha256"):
        load_course_gpt()


def test_residual_writers_get_gpt2_scaled_initialisation():
    """w_o and linear2 of every block start at std 0.02 / sqrt(2 * n_layers); the other matrices at 0.02."""
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=50, d_model=256, n_heads=4, n_layers=8, d_ff=1024, max_len=16)
    model = GPT(config)
    scaled = 0.02 / math.sqrt(2 * config.n_layers)
    for block in model.blocks:
        for writer in (block.attn.w_o, block.ff.linear2):
            assert abs(writer.weight.std().item() - scaled) < 0.1 * scaled
        for reader in (block.attn.w_q, block.ff.linear1):
            assert abs(reader.weight.std().item() - 0.02) < 0.002
