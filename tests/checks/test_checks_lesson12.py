"""Lesson 12's checks: right answers pass, stubs say so, the likely mistakes are named, no traceback escapes."""

import math

import torch
import torch.nn.functional as F

from helpers.checks import (
    check_bits_per_char,
    check_cached_step,
    check_predict_cache_bytes,
    check_temperature_sample,
    check_top_p_filter,
)


def top_p_filter(logits, top_p):
    probs = torch.softmax(logits, dim=-1)
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    keep_sorted = sorted_probs.cumsum(-1) - sorted_probs < top_p
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    return logits.masked_fill(~keep, float("-inf"))


def test_top_p_filter(accepts, rejects):
    accepts(check_top_p_filter, top_p_filter, "✓ top_p_filter: matches the reference on all 5 cases")
    rejects(check_top_p_filter, lambda x, p: None, "not implemented yet")
    rejects(check_top_p_filter, lambda x, p: top_p_filter(x, 1.0) if p < 0.55 else top_p_filter(x, p), "✗")

    def drops_crossing(x, p):
        s, o = torch.softmax(x, -1).sort(-1, descending=True)
        keep = torch.zeros_like(s, dtype=torch.bool).scatter(-1, o, s.cumsum(-1) <= p)
        return x.masked_fill(~keep, float("-inf"))

    rejects(check_top_p_filter, drops_crossing, "the token that crosses top_p was dropped")
    rejects(check_top_p_filter, lambda x, p: top_p_filter(x, p).sort(-1, descending=True).values, "sorted order")
    rejects(check_top_p_filter, lambda x, p: top_p_filter(x, p).nan_to_num(neginf=0.0), "not 0")

    def ascending(x, p):
        s, o = torch.softmax(x, -1).sort(-1)  # least probable first
        keep = torch.zeros_like(s, dtype=torch.bool).scatter(-1, o, s.cumsum(-1) - s < p)
        return x.masked_fill(~keep, -math.inf)

    rejects(check_top_p_filter, ascending, "least probable")

    def cumsum_below(x, p):  # the commonest slip: a token kept while its own running sum is below top_p
        s, o = torch.softmax(x, -1).sort(-1, descending=True)
        keep = torch.zeros_like(s, dtype=torch.bool).scatter(-1, o, s.cumsum(-1) < p)
        return x.masked_fill(~keep, float("-inf"))

    rejects(check_top_p_filter, cumsum_below, "not while its own cumsum < top_p")

    def gathered(x, p):  # the mask put back with gather instead of scatter
        s, o = torch.softmax(x, -1).sort(-1, descending=True)
        keep = (s.cumsum(-1) - s < p).gather(-1, o)
        return x.masked_fill(~keep, float("-inf"))

    rejects(check_top_p_filter, gathered, "scatter")
    for big in (-1e9, -1e30, torch.finfo(torch.float32).min):
        rejects(check_top_p_filter, lambda x, p, big=big: top_p_filter(x, p).clamp(min=big),
                "a large negative number, not -inf")
    rejects(check_top_p_filter, lambda x, p: 1 / 0, "ZeroDivisionError")


def temperature_sample(logits, temperature, generator):
    return torch.multinomial(torch.softmax(logits / temperature, dim=-1), 1, generator=generator)


def test_temperature_sample(accepts, rejects):
    accepts(check_temperature_sample, temperature_sample)
    rejects(check_temperature_sample, lambda x, t, g: None, "not implemented yet")
    rejects(check_temperature_sample, lambda x, t, g: temperature_sample(x * t * t, t, g), "multiplied")
    rejects(check_temperature_sample, lambda x, t, g: x.argmax(-1, keepdim=True), "greedy")
    rejects(check_temperature_sample, lambda x, t, g: torch.multinomial(torch.softmax(x / t, 0), 1, generator=g),
            "dim=-1")
    rejects(check_temperature_sample, lambda x, t, g: torch.multinomial(torch.softmax(x / t, -1), 1),
            "never drew from the generator it was given")

    def categorical(x, t, g):
        return torch.distributions.Categorical(logits=x / t).sample()[:, None]

    rejects(check_temperature_sample, categorical, "torch.distributions.Categorical(...).sample()")
    rejects(check_temperature_sample, lambda x, t, g: torch.distributions.Categorical(logits=x / t).sample(),
            "torch.multinomial(probs, 1, generator=generator)")


def bits_per_char_of(model, vocab, text):
    ids = torch.tensor([vocab.encode(text)])
    with torch.no_grad():
        logits = model(ids[:, :-1])
    return F.cross_entropy(logits[0], ids[0, 1:]).item() / math.log(2)


def test_bits_per_char(accepts, rejects):
    accepts(check_bits_per_char, bits_per_char_of, "✓ bits_per_char_of: matches the reference on all 3 cases")
    rejects(check_bits_per_char, lambda m, v, t: None, "not implemented yet")
    rejects(check_bits_per_char, lambda m, v, t: bits_per_char_of(m, v, t) * math.log(2), "nats")
    rejects(check_bits_per_char, lambda m, v, t: bits_per_char_of(m, v, t) * (len(t) - 1), "the total")

    def unshifted(m, v, t):
        ids = torch.tensor([v.encode(t)])
        with torch.no_grad():
            return F.cross_entropy(m(ids)[0], ids[0]).item() / math.log(2)

    rejects(check_bits_per_char, unshifted, "t + 1")


def cached_step(model, caches, token):
    x = model.pos(model.embed(token), offset=caches[0].length)
    for block, cache in zip(model.blocks, caches, strict=True):
        x = block(x, None, False, cache)
    return model.head(model.norm(x))[:, -1]


def no_offset(model, caches, token):
    """Mistake: the new token gets position 0 instead of the next position."""
    x = model.pos(model.embed(token))
    for block, cache in zip(model.blocks, caches, strict=True):
        x = block(x, None, False, cache)
    return model.head(model.norm(x))[:, -1]


def no_norm(model, caches, token):
    """Mistake: the final LayerNorm is skipped."""
    x = model.pos(model.embed(token), offset=caches[0].length)
    for block, cache in zip(model.blocks, caches, strict=True):
        x = block(x, None, False, cache)
    return model.head(x)[:, -1]


def test_cached_step(accepts, rejects):
    accepts(check_cached_step, cached_step, "✓ cached_step: matches the reference on all 3 cases")
    rejects(check_cached_step, lambda m, c, t: None, "not implemented yet")

    rejects(check_cached_step, no_offset, "caches[0].length")
    rejects(check_cached_step, no_norm, "final LayerNorm")
    rejects(check_cached_step, lambda m, c, t: m(t)[:, -1], "✗ cached_step")


def test_predict_cache_bytes(accepts, rejects):
    right = 2 * 6 * 4 * 2 * 256 * 32 * 4  # K and V, 6 blocks, batch 4, 2 KV heads, 256 positions, D = 32, float32
    accepts(check_predict_cache_bytes, right)
    rejects(check_predict_cache_bytes, None, "write your prediction first")
    rejects(check_predict_cache_bytes, right * 4, "every one of the 8 query heads")
    rejects(check_predict_cache_bytes, right // 2, "keys alone")
    rejects(check_predict_cache_bytes, right // 6, "one layer")
    rejects(check_predict_cache_bytes, right // 4 // 4 * 4, "one sequence")
    rejects(check_predict_cache_bytes, right + 1, "✗")


def test_exercise_5_is_not_the_lessons_model():
    from helpers.checks.lesson12 import CACHE_EXERCISE
    from helpers.gpt import GPTConfig

    assert GPTConfig(**CACHE_EXERCISE) != GPTConfig.course(70)
    assert CACHE_EXERCISE["n_kv_heads"] not in (None, CACHE_EXERCISE["n_heads"])
