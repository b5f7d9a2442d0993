"""The KV cache (lesson 09): one attention module's cache (helpers.attention.KVCache), and the Transformer's
decode cache against its uncached forward."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.attention import KVCache, MultiHeadAttention
from helpers.masks import cached_causal_mask, causal_mask
from helpers.transformer import Transformer, TransformerConfig

DT = torch.float64
PAD = 0


def mha(seed, d_model=16, n_heads=4, n_kv_heads=None):
    torch.manual_seed(seed)
    return MultiHeadAttention(d_model, n_heads, n_kv_heads=n_kv_heads).to(DT).eval()


def rand(*shape, seed=0):
    return torch.randn(*shape, dtype=DT, generator=torch.Generator().manual_seed(seed))


# --- one module's cache ----------------------------------------------------------------------------------

def test_new_cache_shapes_and_defaults():
    module = mha(0, n_kv_heads=2)
    cache = module.new_cache(3, 10)
    assert isinstance(cache, KVCache)
    assert cache.k.shape == cache.v.shape == (3, 2, 10, 4)
    assert cache.k.dtype == DT and cache.length == 0 and cache.max_len == 10
    assert module.new_cache(1, 4, dtype=torch.float32).k.dtype == torch.float32


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 1000), cuts=st.lists(st.integers(1, 4), min_size=1, max_size=5),
       n_kv_heads=st.sampled_from([4, 2, 1]))
def test_cached_self_attention_in_chunks_equals_one_causal_call(seed, cuts, n_kv_heads):
    """Feeding positions in chunks of any sizes through the cache gives the causal call's output."""
    module = mha(seed, n_kv_heads=n_kv_heads)
    T = sum(cuts)
    x = rand(2, T, 16, seed=seed)
    full, _ = module(x, x, x, mask=causal_mask(T))
    cache, start, outs = module.new_cache(2, T + 1), 0, []
    for n in cuts:
        chunk = x[:, start:start + n]
        # query j of the chunk sits at slot start + j: it sees slots 0 .. start + j
        mask = torch.arange(start + n)[None, :] <= (start + torch.arange(n))[:, None]  # (T_new, length + T_new)
        outs.append(module(chunk, chunk, chunk, mask=mask, cache=cache)[0])
        start += n
    assert cache.length == T
    assert (torch.cat(outs, dim=1) - full).abs().max() < 1e-12


def test_a_cache_attends_to_every_stored_slot_and_reads_without_writing():
    module = mha(2)
    mem = rand(2, 6, 16, seed=4)
    cache = module.new_cache(2, 6)
    x = rand(2, 3, 16, seed=5)
    out, w = module(x, mem, mem, cache=cache)  # writes the 6 memory positions
    assert cache.length == 6 and w.shape == (2, 4, 3, 6)
    again, _ = module(x, None, None, cache=cache)  # read only: no new position
    assert cache.length == 6 and torch.equal(out, again)
    assert (out - module(x, mem, mem)[0]).abs().max() < 1e-12


def test_writing_past_max_len_raises_naming_max_len_and_changes_nothing():
    module = mha(3)
    cache = module.new_cache(1, 4)
    x = rand(1, 3, 16)
    module(x, x, x, cache=cache)
    k_before = cache.k.clone()
    with pytest.raises(ValueError, match=r"the cache holds max_len=4 positions and 3 are stored: 2 more do not fit"):
        module(x[:, :2], x[:, :2], x[:, :2], cache=cache)
    assert cache.length == 3 and torch.equal(cache.k, k_before)


def test_a_mask_with_a_cache_refers_to_the_cached_slots():
    module = mha(4)
    cache = module.new_cache(1, 8)
    x = rand(1, 3, 16)
    module(x, x, x, cache=cache)
    with pytest.raises(ValueError, match=r"a 2-D mask is read as \(T, S\) = \(2, 5\)"):
        module(x[:, :2], x[:, :2], x[:, :2], mask=causal_mask(2), cache=cache)


def test_a_cache_of_another_module_or_batch_is_refused():
    module = mha(5)
    x = rand(2, 3, 16)
    with pytest.raises(ValueError, match=r"the cache holds keys \(1, 4, 8, 4\).*need .* \(2, 4, 8, 4\)"):
        module(x, x, x, cache=module.new_cache(1, 8))
    with pytest.raises(TypeError, match="cache must be a helpers.attention.KVCache"):
        module(x, x, x, cache={"k": None})


def test_a_static_cache_keeps_every_step_the_same_shape():
    module = mha(6)
    cache = module.new_cache(1, 5, static=True)
    x = rand(1, 5, 16, seed=7)
    full, _ = module(x, x, x, mask=causal_mask(5))
    outs = []
    for t in range(5):
        filled = torch.arange(5) <= t  # (max_len,): the slots written so far, this one included
        out, w = module(x[:, t:t + 1], x[:, t:t + 1], x[:, t:t + 1], mask=filled[None, :], cache=cache)
        assert w.shape == (1, 4, 1, 5)  # every step reads all max_len slots
        outs.append(out)
    assert int(cache.position) == cache.length == 5
    assert (torch.cat(outs, dim=1) - full).abs().max() < 1e-12


def test_kv_cache_refuses_keys_and_values_that_differ():
    with pytest.raises(ValueError, match=r"got k \(2, 4, 10, 8\) torch.float32 on cpu, v \(2, 4, 9, 8\)"):
        KVCache(torch.zeros(2, 4, 10, 8), torch.zeros(2, 4, 9, 8))
    with pytest.raises(ValueError, match="torch.float64"):
        KVCache(torch.zeros(2, 4, 10, 8), torch.zeros(2, 4, 10, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"k must have shape \(B, n_kv_heads, max_len, head_dim\), got \(4, 10, 8\)"):
        KVCache(torch.zeros(4, 10, 8), torch.zeros(4, 10, 8))


def test_a_static_cache_without_a_mask_is_refused():
    """It would attend to the slots not written yet (zeros): a silent wrong result."""
    mha = MultiHeadAttention(16, 4)
    cache = mha.new_cache(1, 8, static=True)
    x = torch.randn(1, 1, 16)
    with pytest.raises(ValueError, match="a static KVCache makes the queries attend to all its max_len=8 slots"):
        mha(x, x, x, cache=cache)
    mask = cached_causal_mask(cache.start(), 1, 8)  # with the mask it runs
    assert mha(x, x, x, mask=mask, cache=cache)[0].shape == (1, 1, 16)


# --- the Transformer's cached decoding --------------------------------------------------------------------

def model_and_batch(seed, norm_first):
    torch.manual_seed(seed)
    model = Transformer(TransformerConfig.tiny(9, 7, norm_first=norm_first)).to(DT).eval()
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(1, 9, (3, 6), generator=g)
    src[1, 4:] = PAD
    tgt = torch.randint(1, 7, (3, 8), generator=g)
    tgt[0, 5:] = PAD  # trailing padding
    tgt[2, 3] = PAD  # a pad in the middle: hidden from the later queries
    return model, src, tgt


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("static", [False, True])
def test_cached_decoding_gives_the_uncached_logits(norm_first, static):
    model, src, tgt = model_and_batch(1, norm_first)
    with torch.no_grad():
        memory, src_mask = model.encode(src)
        full = model.decode(tgt, memory, src_mask)  # (B, T, V)
        cache = model.new_decode_cache(memory, 10, static=static)
        steps = torch.cat([model.decode(tgt[:, t:t + 1], None, src_mask, cache=cache) for t in range(8)], dim=1)
    assert (steps - full).abs().max() < 1e-12
    assert cache.length == 8 and torch.equal(cache.keep[:, :8], tgt != PAD)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 1000), first=st.integers(1, 7), norm_first=st.booleans())
def test_cached_decoding_in_two_chunks_gives_the_uncached_logits(seed, first, norm_first):
    model, src, tgt = model_and_batch(seed, norm_first)
    with torch.no_grad():
        memory, src_mask = model.encode(src)
        full = model.decode(tgt, memory, src_mask)
        cache = model.new_decode_cache(memory, 8)
        parts = [model.decode(tgt[:, :first], memory, src_mask, cache=cache),
                 model.decode(tgt[:, first:], None, src_mask, cache=cache)]
    assert (torch.cat(parts, dim=1) - full).abs().max() < 1e-12


def test_cached_decoding_projects_the_memory_once():
    model, src, tgt = model_and_batch(2, True)
    calls = []
    hook = model.decoder.layers[0].cross_attn.w_k.register_forward_hook(lambda m, i, o: calls.append(i[0].shape))
    with torch.no_grad():
        memory, src_mask = model.encode(src)
        cache = model.new_decode_cache(memory, 8)
        for t in range(8):
            model.decode(tgt[:, t:t + 1], None, src_mask, cache=cache)
    hook.remove()
    assert calls == [memory.shape]


def test_cached_decode_checks_its_cache():
    model, src, tgt = model_and_batch(3, True)
    with torch.no_grad():
        memory, src_mask = model.encode(src)
        cache = model.new_decode_cache(memory, 4)
        with pytest.raises(TypeError, match="cache must be a DecoderCache"):
            model.decode(tgt, memory, src_mask, cache=object())
        with pytest.raises(ValueError, match=r"the cache was made for a batch of 3"):
            model.decode(tgt[:1], None, src_mask, cache=cache)
        with pytest.raises(ValueError, match=r"max_len=4 positions and 0 are stored: 8 more do not fit"):
            model.decode(tgt, None, src_mask, cache=cache)
        with pytest.raises(ValueError, match=r"max_len \(at most the model's max_len\) must be an int in "
                                             r"\[1, 64\], got 100"):
            model.new_decode_cache(memory, 100)

BOS, EOS = 1, 2


def tiny_model(seed, src_v=9, tgt_v=7, **overrides):
    torch.manual_seed(seed)
    return Transformer(TransformerConfig.tiny(src_v, tgt_v, **overrides)).to(DT).eval()


def source(seed, B, S, V, n_pad=0):
    src = torch.randint(3, V, (B, S), generator=torch.Generator().manual_seed(seed))  # (B, S)
    if n_pad:
        src[0, S - n_pad:] = PAD  # the first row is shorter: padded keys in the cross-attention
    return src


@pytest.mark.parametrize("static", [False, True])
def test_cached_decode_logits_equal_full_decoder_at_every_step(static):
    model = tiny_model(3, norm_first=False)
    src = source(3, 2, 5, 9, n_pad=1)
    ys = torch.tensor([[BOS, 4, 5, 6, 3, 4], [BOS, 6, 6, 5, 4, 3]])  # (B, T): a fixed target prefix
    with torch.no_grad():
        memory, src_mask = model.encode(src)
        cache = model.new_decode_cache(memory, max_len=ys.shape[1], static=static)
        for t in range(ys.shape[1]):
            step = model.decode(ys[:, t:t + 1], None, src_mask, cache=cache)[:, -1]  # (B, V)
            full = model.decode(ys[:, :t + 1], memory, src_mask)[:, -1]  # (B, V)
            assert (step - full).abs().max().item() < 1e-12
        assert cache.length == ys.shape[1]
        with pytest.raises(ValueError, match=r"the cache holds max_len=6 positions and 6 are stored: 1 more"):
            model.decode(ys[:, :1], None, src_mask, cache=cache)


def test_decode_cache_shapes():
    model = tiny_model(2, n_decoder_layers=3)
    memory = torch.zeros(2, 5, 32, dtype=torch.float64)
    cache = model.new_decode_cache(memory, max_len=10)
    assert len(cache.self_attn) == len(cache.cross_attn) == 3
    assert cache.self_attn[0].k.shape == (2, 4, 10, 8) and cache.cross_attn[2].v.shape == (2, 4, 5, 8)
    assert cache.length == 0 and cache.cross_attn[0].length == 5 and cache.keep.shape == (2, 10)
