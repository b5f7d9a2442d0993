"""helpers.heads: the scores against loop oracles and hypothesis properties, the probe against the models' own weights,
ablation against the same model with W_O's columns changed, the task, the model, and clear errors."""

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.attention import MultiHeadAttention
from helpers.gpt import GPT, GPTConfig
from helpers.heads import (
    AttentionOnly,
    AttentionOnlyConfig,
    attention_modules,
    attention_weights,
    copy_accuracy,
    induction_score,
    position_losses,
    previous_token_score,
    probe_heads,
    repeated_tokens,
    train_copying,
)
from helpers.masks import causal_mask
from helpers.pretrained import MiniLM
from helpers.transformer import TransformerConfig


def random_weights(B, H, T, seed, causal=True):
    g = torch.Generator().manual_seed(seed)
    scores = 3 * torch.randn(B, H, T, T, generator=g, dtype=torch.float64)
    if causal:
        scores = scores.masked_fill(~causal_mask(T), float("-inf"))
    return scores.softmax(-1)


def prev_oracle(w):
    B, H, T, _ = w.shape
    return torch.tensor([sum(w[b, h, i, i - 1].item() for b in range(B) for i in range(1, T)) / (B * (T - 1))
                         for h in range(H)], dtype=w.dtype)


def induction_oracle(w, p):
    B, H, T, _ = w.shape
    return torch.tensor([sum(w[b, h, i, i - p + 1].item() for b in range(B) for i in range(p, T)) / (B * (T - p))
                         for h in range(H)], dtype=w.dtype)


@settings(max_examples=60, deadline=None)
@given(B=st.integers(1, 3), H=st.integers(1, 4), T=st.integers(2, 12), seed=st.integers(0, 10_000),
       causal=st.booleans(), data=st.data())
def test_scores_equal_the_loops_of_their_definitions(B, H, T, seed, causal, data):
    w = random_weights(B, H, T, seed, causal)
    p = data.draw(st.integers(1, T - 1))
    assert torch.allclose(previous_token_score(w), prev_oracle(w), atol=1e-12)
    assert torch.allclose(induction_score(w, p), induction_oracle(w, p), atol=1e-12)
    assert previous_token_score(w).shape == induction_score(w, p).shape == (H,)
    # (H, T, T) is one batch item
    assert torch.allclose(previous_token_score(w[0]), prev_oracle(w[:1]), atol=1e-12)
    assert torch.allclose(induction_score(w[0], p), induction_oracle(w[:1], p), atol=1e-12)
    # weights that sum to 1 per row give scores in [0, 1]
    for s in (previous_token_score(w), induction_score(w, p)):
        assert (s >= -1e-12).all() and (s <= 1 + 1e-12).all()


@settings(max_examples=30, deadline=None)
@given(T=st.integers(3, 20), data=st.data())
def test_ideal_patterns_score_one_and_each_other_low(T, data):
    p = data.draw(st.integers(2, T - 1))
    prev = torch.zeros(1, 1, T, T)
    prev[0, 0, 0, 0] = 1.0
    prev[0, 0, torch.arange(1, T), torch.arange(T - 1)] = 1.0
    ind = torch.eye(T)[None, None].clone()  # rows before the repeat attend to themselves
    ind[0, 0, p:] = 0.0
    ind[0, 0, torch.arange(p, T), torch.arange(1, T - p + 1)] = 1.0
    assert previous_token_score(prev).item() == 1.0 and induction_score(ind, p).item() == 1.0
    off_by_one = torch.zeros_like(ind)  # attends to the earlier copy of the token itself, not the one after it
    off_by_one[0, 0, torch.arange(T), torch.arange(T) % p] = 1.0
    assert induction_score(off_by_one, p).item() == 0.0
    if p > 2:
        assert induction_score(prev, p).item() == 0.0


@pytest.mark.parametrize("call, exc, words", [
    (lambda: previous_token_score(torch.rand(4, 4)), ValueError, "(B, H, T, T) or (H, T, T), got (4, 4)"),
    (lambda: previous_token_score(torch.rand(1, 2, 3, 4, 4)), ValueError, "got (1, 2, 3, 4, 4)"),
    (lambda: previous_token_score(torch.rand(2, 5, 4)), ValueError, "square"),
    (lambda: previous_token_score(torch.rand(2, 1, 1)), ValueError, "T >= 2"),
    (lambda: previous_token_score([[0.5]]), ValueError, "got list"),
    (lambda: induction_score(torch.ones(2, 3, 3, dtype=torch.long), 1), TypeError, "floating point"),
    (lambda: induction_score(torch.rand(2, 6, 6), 6), ValueError, "period (below T=6, so that a query repeats) must"),
    (lambda: induction_score(torch.rand(2, 6, 6), 0), ValueError, "period"),
    (lambda: induction_score(torch.rand(2, 6, 6), 2.5), ValueError, "period (below T=6, so that a query repeats) must"),
])
def test_bad_weights_or_periods_are_named(call, exc, words):
    with pytest.raises(exc, match=None) as info:
        call()
    assert words in str(info.value), str(info.value)


# --- the task and the model ------------------------------------------------------------------------

@settings(max_examples=25, deadline=None)
@given(B=st.integers(1, 6), lo=st.integers(1, 6), extra=st.integers(0, 6), seed=st.integers(0, 999))
def test_repeated_tokens_repeat_with_their_period(B, lo, extra, seed):
    hi, T, V = lo + extra, lo + extra + 7, lo + extra + 3
    ids, periods = repeated_tokens(B, T, V, lo, hi, generator=torch.Generator().manual_seed(seed))
    assert ids.shape == (B, T) and periods.shape == (B,) and ids.dtype == torch.int64
    assert ((periods >= lo) & (periods <= hi)).all() and ((ids >= 0) & (ids < V)).all()
    for b in range(B):
        p = periods[b].item()
        assert torch.equal(ids[b, p:], ids[b, :-p])
        assert len(set(ids[b, :p].tolist())) == p  # a block of distinct tokens


def test_repeated_tokens_refuse_periods_that_cannot_repeat():
    with pytest.raises(ValueError, match="at most vocab_size=8: distinct tokens"):
        repeated_tokens(2, 20, 8, 2, 9)
    with pytest.raises(ValueError, match="below length=10"):
        repeated_tokens(2, 10, 32, 2, 10)
    with pytest.raises(ValueError, match="max_period"):
        repeated_tokens(2, 10, 32, 5, 4)


def test_attention_only_is_causal_and_has_no_feed_forward():
    torch.manual_seed(0)
    model = AttentionOnly(AttentionOnlyConfig.tiny(vocab_size=9)).eval()
    ids = torch.randint(0, 9, (2, 10))
    logits = model(ids)
    assert logits.shape == (2, 10, 9)
    changed = ids.clone()
    changed[:, 6] = (changed[:, 6] + 1) % 9
    out = model(changed)
    assert torch.equal(out[:, :6], logits[:, :6]) and not torch.allclose(out[:, 6:], logits[:, 6:])
    linears = [name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    assert all(".w_" in name for name in linears if name != "unembed"), linears
    assert len(attention_modules(model)) == 2


def test_init_std_sets_every_matrix():
    model = AttentionOnly(AttentionOnlyConfig(8, 32, 4, 2, 16, init_std=0.02))
    for name, p in model.named_parameters():
        if p.dim() == 2:
            assert 0.015 < p.std().item() < 0.025, name
    with pytest.raises(ValueError, match="init_std"):
        AttentionOnlyConfig(8, 32, 4, 2, 16, init_std=0.0)
    with pytest.raises(ValueError, match="d_model=30 is not divisible by n_heads=4"):
        AttentionOnlyConfig(8, 30, 4, 2, 16)
    with pytest.raises(TypeError, match="integer token ids"):
        model(torch.zeros(1, 3))


# --- one probe for every model ---------------------------------------------------------------------

def _models():
    torch.manual_seed(1)
    gpt = GPT(GPTConfig.tiny(11)).eval()
    with torch.no_grad():
        for p in gpt.parameters():
            p.add_(0.3 * torch.randn_like(p))  # lively weights, not the 0.02 initialisation
    minilm = MiniLM(TransformerConfig.tiny(13, 13)).eval()
    only = AttentionOnly(AttentionOnlyConfig.tiny(vocab_size=11)).eval()
    return {"attention-only": (only, torch.randint(0, 11, (3, 9))), "gpt": (gpt, torch.randint(0, 11, (3, 9))),
            "minilm": (minilm, torch.randint(1, 13, (3, 9)))}


@pytest.mark.parametrize("name", ["attention-only", "gpt", "minilm"])
def test_probe_records_the_weights_each_model_computes(name):
    model, ids = _models()[name]
    weights = attention_weights(model, ids)
    if name == "gpt":
        model(ids, need_weights=True)
        own = [block.attn_weights for block in model.blocks]
    elif name == "minilm":
        own = model(ids, need_weights=True)[1]
    else:  # recompute each layer by hand
        own, x = [], model.pos(model.embed(ids))
        for norm, attn in zip(model.norms, model.attns, strict=True):
            h = norm(x)
            out, w = attn(h, h, h, mask=causal_mask(ids.shape[1]), need_weights=True)
            own.append(w)
            x = x + out
    assert len(weights) == len(own) == len(attention_modules(model))
    for got, want in zip(weights, own, strict=True):
        assert got.shape == (3, want.shape[1], 9, 9) and torch.allclose(got, want, atol=1e-6)
    # the hooks are gone afterwards
    assert all(not m._forward_hooks and not m._forward_pre_hooks and not m.w_o._forward_pre_hooks
               for m in attention_modules(model))


def _w_o_changed(model, layer, head, mean_input=None):
    """The oracle: the same model with head ``head``'s columns of W_O zeroed (and its mean moved into the bias)."""
    other = copy.deepcopy(model)
    mha = attention_modules(other)[layer]
    D, cols = mha.head_dim, slice(head * mha.head_dim, (head + 1) * mha.head_dim)
    with torch.no_grad():
        if mean_input is not None:
            mha.w_o.bias += mha.w_o.weight[:, cols] @ mean_input
        mha.w_o.weight[:, cols] = 0.0
    assert D > 0
    return other


@pytest.mark.parametrize("name", ["attention-only", "gpt", "minilm"])
def test_zero_ablation_equals_zeroing_the_heads_columns_of_w_o(name):
    model, ids = _models()[name]
    layer, head = len(attention_modules(model)) - 1, 1
    with torch.no_grad(), probe_heads(model, ablate=[(layer, head)]):
        ablated = model(ids)
    with torch.no_grad():
        oracle, plain = _w_o_changed(model, layer, head)(ids), model(ids)
    assert torch.allclose(ablated, oracle, atol=1e-5) and not torch.allclose(ablated, plain, atol=1e-3)


def test_mean_ablation_equals_moving_the_heads_mean_into_the_bias():
    model, ids = _models()["attention-only"]
    mha = attention_modules(model)[0]
    seen = []
    handle = mha.w_o.register_forward_pre_hook(lambda m, a: seen.append(a[0].detach()))
    with torch.no_grad():
        model(ids)
    handle.remove()
    mean = seen[0][..., 0:mha.head_dim].mean(dim=(0, 1))  # head 0's mean output over batch and positions
    with torch.no_grad(), probe_heads(model, ablate=[(0, 0)], mode="mean"):
        ablated = model(ids)
    with torch.no_grad():
        oracle = _w_o_changed(model, 0, 0, mean_input=mean)(ids)
    assert torch.allclose(ablated, oracle, atol=1e-5)


def test_probe_handles_need_weights_by_position_and_several_heads():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4).eval()
    x = torch.randn(2, 5, 16)
    with torch.no_grad(), probe_heads(mha, ablate=[(0, 1), (0, 3)]) as weights:
        out, w = mha(x, x, x, None, False)  # need_weights=False by position: the probe asks for them anyway
    assert w is not None and torch.equal(weights[0], w)
    with torch.no_grad():
        heads = mha(x, x, x)[1] @ mha._split_heads(mha.w_v(x), 4)  # (B, H, T, D)
        heads[:, [1, 3]] = 0.0
        expected = mha.w_o(heads.transpose(1, 2).reshape(2, 5, 16))
    assert torch.allclose(out, expected, atol=1e-6)


@pytest.mark.parametrize("kwargs, exc, words", [
    (dict(ablate=[(2, 0)]), ValueError, "layer"),
    (dict(ablate=[(0, 4)]), ValueError, "head"),
    (dict(ablate=[3]), ValueError, "(layer, head) pairs"),
    (dict(mode="random"), ValueError, "mode must be 'zero' or 'mean'"),
])
def test_bad_ablations_are_named(kwargs, exc, words):
    model = AttentionOnly(AttentionOnlyConfig(8, 16, 4, 2, 8))
    with pytest.raises(exc) as info:
        with probe_heads(model, **kwargs):
            pass
    assert words in str(info.value)
    with pytest.raises(ValueError, match="holds no helpers.attention.MultiHeadAttention"):
        attention_modules(torch.nn.Linear(2, 2))


# --- measuring ---------------------------------------------------------------------------------------

class Copier(torch.nn.Module):
    """A perfect second-copy predictor for sequences of one known period: logits one-hot at ids[t - p + 1]."""

    def __init__(self, p, V):
        super().__init__()
        self.p, self.V = p, V

    def forward(self, ids):
        T = ids.shape[1]
        logits = torch.zeros(*ids.shape, self.V)
        for t in range(self.p, T):
            logits[:, t] = torch.nn.functional.one_hot(ids[:, t - self.p + 1], self.V).float()
        return logits


def test_copy_accuracy_splits_the_copies_and_losses_are_per_position():
    ids, periods = repeated_tokens(64, 20, 16, 6, 6, generator=torch.Generator().manual_seed(0))
    first, second = copy_accuracy(Copier(6, 16), ids, periods)
    assert second == 1.0 and first < 0.2  # the first copy gets all-zero logits: argmax 0
    losses = position_losses(Copier(6, 16), ids)
    assert losses.shape == (19,) and (losses[6:] < losses[:5].min()).all()


def test_train_copying_records_its_history_and_learns():
    cfg = AttentionOnlyConfig(8, 16, 2, 2, 12)
    model, history = train_copying(cfg, 60, batch=16, lr=3e-3, periods=(3, 6), eval_every=20, progress=False)
    assert history["step"] == [0, 20, 40, 60] and all(len(v) == 4 for k, v in history.items() if k != "loss")
    assert len(history["loss"]) == 3 and history["loss"][-1] < history["loss"][0]
    assert isinstance(model, AttentionOnly)
