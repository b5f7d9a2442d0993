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
    filter_logits,
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


# --- generation with and without the cache -----------------------------------------------------

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


@pytest.mark.parametrize("n_kv_heads", [None, 1])
@pytest.mark.parametrize("knobs", [dict(top_k=1), dict(), dict(temperature=0.7, top_k=4), dict(top_p=0.8)])
def test_generate_cached_equals_uncached(n_kv_heads, knobs):
    model = make_model(n_kv_heads=n_kv_heads)
    prompt = rand_ids(3, 4, seed=3)
    a = model.generate(prompt, 20, generator=torch.Generator().manual_seed(5), use_cache=True, **knobs)
    b = model.generate(prompt, 20, generator=torch.Generator().manual_seed(5), use_cache=False, **knobs)
    assert a.shape == (3, 24) and torch.equal(a[:, :4], prompt)
    assert torch.equal(a, b)


def test_top_k_1_is_greedy():
    model = make_model()
    ids = rand_ids(2, 3)
    out = model.generate(ids, 10, top_k=1)
    expected = ids
    for _ in range(10):
        expected = torch.cat([expected, model(expected)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, expected)


def test_generate_draws_one_multinomial_per_step_from_the_generator():
    model = make_model()
    ids = rand_ids(2, 3)
    g = torch.Generator().manual_seed(11)
    out = model.generate(ids, 6, temperature=0.9, top_p=0.9, generator=g)
    g2 = torch.Generator().manual_seed(11)
    mine = ids
    for _ in range(6):  # a learner's sampler: same filter, one draw per step for the batch
        probs = torch.softmax(filter_logits(model(mine)[:, -1], 0.9, None, 0.9).float(), dim=-1)
        mine = torch.cat([mine, torch.multinomial(probs, 1, generator=g2)], dim=1)
    assert torch.equal(out, mine)
    assert torch.equal(g.get_state(), g2.get_state())


def lively_model(seed=0, **overrides):
    """A tiny GPT with std-1 weights: its logits change a lot with the position and the context, so a
    step that reuses stale logits, or a position off by one, changes the tokens."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig.tiny(V, max_len=8, **overrides)).to(DT).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 1.0)
    return model


def cropped_reference(model, ids, n_new):
    """Greedy generation written as nanoGPT does: the full model on the last max_len tokens, each step."""
    out = ids
    special = list(model.config.special_ids)
    for _ in range(n_new):
        logits = model(out[:, -model.config.max_len:])[:, -1]  # (B, V)
        logits[:, special] = -math.inf
        out = torch.cat([out, logits.argmax(-1, keepdim=True)], dim=1)
    return out


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("prompt_len", [1, 8])
def test_generate_runs_past_max_len_with_the_cropped_context(seed, prompt_len):
    model = lively_model(seed, special_ids=(0,))
    prompt = rand_ids(2, prompt_len, seed=seed)
    n_new = 3 * model.config.max_len
    expected = cropped_reference(model, prompt, n_new)
    for use_cache in (True, False):
        out = model.generate(prompt, n_new, top_k=1, use_cache=use_cache)
        assert out.shape == (2, prompt_len + n_new)
        assert torch.equal(out, expected), use_cache


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("knobs", [dict(top_k=1), dict(temperature=2.0), dict(top_p=0.9)])
def test_generate_cached_equals_uncached_on_a_lively_model(seed, knobs):
    """Every step's logits, the last one included, come from the newest token at its own position."""
    model = lively_model(seed)
    prompt = rand_ids(3, 2, seed=seed)
    for n_new in (1, 2, 5, 6):  # the cache fills up exactly at max_len = 8 tokens
        a = model.generate(prompt, n_new, generator=torch.Generator().manual_seed(seed), use_cache=True, **knobs)
        b = model.generate(prompt, n_new, generator=torch.Generator().manual_seed(seed), use_cache=False, **knobs)
        assert torch.equal(a, b), n_new


def test_generate_never_samples_the_special_ids():
    model, vocab = load_course_gpt()
    assert model.config.special_ids == (vocab.pad_id, vocab.bos_id, vocab.eos_id) == (0, 1, 2)
    prompt = torch.tensor([vocab.encode("ROMEO:")])
    out = model.generate(prompt, 150, temperature=100.0, generator=torch.Generator().manual_seed(0))
    new = out[0, prompt.shape[1]:]
    assert not torch.isin(new, torch.tensor([0, 1, 2])).any()
    assert len(set(new.tolist())) > 20  # near-uniform draws: without the rule, specials would appear
    # a config of its own: the ids it names are never drawn either
    tiny = GPT(GPTConfig.tiny(V, special_ids=(3, 4)))
    out = tiny.generate(rand_ids(4, 2), 60, temperature=50.0, generator=torch.Generator().manual_seed(1))
    assert not torch.isin(out[:, 2:], torch.tensor([3, 4])).any()


def test_special_ids_are_checked():
    with pytest.raises(ValueError, match=r"each of special_ids \(a token id\) must be an int in \[0, 10\], got 11"):
        GPTConfig.tiny(V, special_ids=(1, 11))
    with pytest.raises(ValueError, match="cover the whole vocabulary"):
        GPTConfig.tiny(3, special_ids=(0, 1, 2))
    with pytest.raises(TypeError, match="special_ids must be a tuple of token ids, got int"):
        GPTConfig.tiny(V, special_ids=2)
    assert GPTConfig.tiny(V, special_ids=[2, 1, 2]).special_ids == (1, 2)


def test_generate_restores_training_mode_and_zero_new_tokens():
    model = make_model().train()
    ids = rand_ids(1, 4)
    assert torch.equal(model.generate(ids, 0), ids)
    assert model.training


# --- filter_logits -----------------------------------------------------------------------------

def reference_filter(logits, temperature, top_k, top_p):
    """One row, in plain Python: the semantics of DESIGN.md written out."""
    x = [v / temperature for v in logits]
    keep = [True] * len(x)
    if top_k is not None:
        order = sorted(range(len(x)), key=lambda i: -x[i])  # stable: ties keep index order
        keep = [i in set(order[:top_k]) for i in range(len(x))]
    if top_p is not None and top_p < 1.0:
        m = max(x[i] for i in range(len(x)) if keep[i])
        e = [math.exp(x[i] - m) if keep[i] else 0.0 for i in range(len(x))]
        p = [v / sum(e) for v in e]
        order = sorted(range(len(x)), key=lambda i: -p[i])
        total, kept = 0.0, set()
        for i in order:
            if total >= top_p and kept:
                break
            kept.add(i)
            total += p[i]
        keep = [keep[i] and i in kept for i in range(len(x))]
    return [x[i] if keep[i] else -math.inf for i in range(len(x))]


@settings(max_examples=200, deadline=None)
@given(logits=st.lists(st.floats(-8, 8, allow_nan=False).map(lambda v: round(v, 3)), min_size=1, max_size=12,
                       unique=True),
       temperature=st.sampled_from([0.5, 1.0, 2.0]), top_k=st.one_of(st.none(), st.integers(1, 14)),
       top_p=st.one_of(st.none(), st.sampled_from([0.1, 0.5, 0.9, 0.999, 1.0])))
def test_filter_logits_semantics(logits, temperature, top_k, top_p):
    out = filter_logits(torch.tensor(logits, dtype=DT), temperature, top_k, top_p)
    expected = torch.tensor(reference_filter(logits, temperature, top_k, top_p), dtype=DT)
    assert torch.equal(torch.isinf(out), torch.isinf(expected))
    kept = ~torch.isinf(out)
    assert kept.any()  # at least one token always stays
    assert torch.allclose(out[kept], expected[kept], rtol=0, atol=1e-12)
    if top_k is not None:
        assert int(kept.sum()) <= top_k


def test_filter_logits_top_p_examples():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=DT)
    kept = lambda p: (~torch.isinf(filter_logits(probs.log(), top_p=p))).tolist()  # noqa: E731
    assert kept(0.45) == [True, False, False, False]  # the first token alone reaches 0.45
    assert kept(0.6) == [True, True, False, False]  # the token that crosses 0.6 is kept
    assert kept(0.01) == [True, False, False, False]  # at least one
    assert kept(1.0) == [True, True, True, True]
    batch = filter_logits(torch.stack([probs.log(), probs.flip(0).log()]), top_p=0.6)  # rows apart
    assert (~torch.isinf(batch)).tolist() == [[True, True, False, False], [False, False, True, True]]


@pytest.mark.parametrize("kwargs, match", [
    (dict(temperature=0.0), "temperature"), (dict(temperature=-1.0), "temperature"),
    (dict(top_k=0), "top_k"), (dict(top_k=2.5), "top_k"), (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"),
])
def test_filter_logits_bad_knobs(kwargs, match):
    with pytest.raises(ValueError, match=match):
        filter_logits(torch.zeros(5), **kwargs)


def test_filter_logits_computes_in_float32_at_least():
    logits = torch.tensor([[3.0, 1.0, -2.0, 0.5]], dtype=torch.float16)
    out = filter_logits(logits, temperature=1e-4)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    assert torch.softmax(out, -1)[0, 0] == 1.0  # the largest logit takes it all, no NaN
    assert filter_logits(logits.double(), 0.5).dtype == torch.float64


def test_filter_logits_refuses_nan():
    with pytest.raises(ValueError, match=r"logits hold NaN \(first at index \(1, 2\) of \(2, 4\)\)"):
        filter_logits(torch.tensor([[0.0, 1.0, 2.0, 3.0], [0.0, 1.0, math.nan, 3.0]]), top_p=0.5)


def test_filter_logits_keeps_inf_tokens_under_top_p():
    logits = torch.tensor([[0.0, math.inf, 5.0, math.inf], [1.0, 2.0, 3.0, 4.0]])
    out = filter_logits(logits, top_p=0.6)  # the two +inf tokens share the row's probability, 0.5 each
    assert torch.isposinf(out[0, [1, 3]]).all() and torch.isneginf(out[0, [0, 2]]).all()
    assert (~torch.isinf(out[1])).tolist() == [False, False, False, True]


def test_filter_logits_bad_logits():
    with pytest.raises(ValueError, match="floating"):
        filter_logits(torch.zeros(5, dtype=torch.long))


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
