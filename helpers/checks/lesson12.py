"""Exercise checks of lesson 12 (each one prints a single line and returns True or False)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from helpers.checks._core import Bug, Case, CheckResult, Reject, check, check_prediction, slip_at
from helpers.data import Vocab

__all__ = ["check_top_p_filter", "check_temperature_sample", "check_bits_per_char", "check_cached_step",
           "check_predict_cache_bytes"]


def _top_p(logits, top_p):
    from helpers.gpt import filter_logits

    return filter_logits(logits, top_p=top_p)


def _top_p_bug(logits, top_p, keep_rule):
    probs = torch.softmax(logits, dim=-1)
    sorted_probs, order = probs.sort(dim=-1, descending=True, stable=True)
    keep_sorted = keep_rule(sorted_probs, top_p)
    keep = torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)
    return logits.masked_fill(~keep, float("-inf"))


def check_top_p_filter(fn) -> CheckResult:
    """Check ``top_p_filter(logits, top_p)``: nucleus filtering, removed logits set to -inf (lesson 12)."""
    g = torch.Generator().manual_seed(12)
    probs = torch.tensor([0.05, 0.5, 0.15, 0.3])
    cases = [Case("probabilities (0.05, 0.5, 0.15, 0.3), top_p=0.6 (the token that crosses 0.6 stays)",
                  (probs.log(), 0.6)),
             Case("the same, top_p=0.45 (the first token alone reaches it)", (probs.log(), 0.45)),
             Case("the same, top_p=0.01 (one token always stays)", (probs.log(), 0.01)),
             Case("a batch (3, 20) of random logits, top_p=0.9", (2 * torch.randn(3, 20, generator=g), 0.9)),
             Case("random logits (2, 30), top_p=1.0 (keeps all)", (torch.randn(2, 30, generator=g), 1.0))]
    crossing = ("the token that crosses top_p was dropped: keep a token while the tokens ranked before it sum to "
                "less than top_p (cumsum - p < top_p), not while its own cumsum {} top_p")
    bugs = [Bug(crossing.format("<="), lambda x, p: _top_p_bug(x, p, lambda s, p: s.cumsum(-1) <= p)),
            Bug(crossing.format("<") + " (cumsum < top_p can even drop every token)",
                lambda x, p: _top_p_bug(x, p, lambda s, p: s.cumsum(-1) < p)),
            Bug("the keep-mask went back to the wrong places: gather reads sorted_mask[order[i]], but the mask of "
                "sorted position j belongs at position order[j]; write it there with scatter "
                "(keep.scatter(-1, order, keep_sorted))", lambda x, p: _top_p_gather(x, p)),
            Bug("that keeps the least probable tokens: sort with descending=True",
                lambda x, p: _top_p_bug(x, p, lambda s, p: s.flip(-1).cumsum(-1).flip(-1) - s < p)),
            Bug("the kept logits come back in sorted order: scatter the keep-mask back to the original positions "
                "(sorted.scatter or an inverse permutation)",
                lambda x, p: _top_p(x, p).sort(dim=-1, descending=True).values),
            Bug("the removed entries must be -inf (probability 0 after softmax), not 0",
                lambda x, p: _top_p(x, p).nan_to_num(neginf=0.0)),
            Bug("the cumulative sum ran over the logits, not the probabilities: apply softmax first",
                lambda x, p: _top_p_bug_logits(x, p))]
    return check("top_p_filter", fn, _top_p, cases, bugs=bugs, adapt=_not_minus_inf)


def _not_minus_inf(got, expected):
    """Reject removed entries that hold a large negative number instead of -inf (-1e9, finfo.min)."""
    if isinstance(got, torch.Tensor) and isinstance(expected, torch.Tensor) and got.shape == expected.shape \
            and got.is_floating_point():
        removed = expected == float("-inf")
        finite = torch.isfinite(got[removed])
        if removed.any() and finite.all() and (got[removed] < -1e3).all() \
                and torch.allclose(got[~removed].double(), expected[~removed].double(), atol=1e-5, rtol=1e-4):
            worst = got[removed].max().item()
            return Reject(f"the removed entries hold {worst:.3g}, a large negative number, not -inf: softmax then "
                          "gives them a tiny probability instead of exactly 0 (and at a high temperature or with "
                          "very negative logits not even a tiny one); use float('-inf')")
    return got


def _top_p_gather(logits, top_p):
    probs = torch.softmax(logits, dim=-1)
    sorted_probs, order = probs.sort(dim=-1, descending=True, stable=True)
    keep_sorted = sorted_probs.cumsum(-1) - sorted_probs < top_p
    keep = keep_sorted.gather(-1, order)  # the slip: gather with the forward permutation
    return logits.masked_fill(~keep, float("-inf"))


def _top_p_bug_logits(logits, top_p):
    sorted_x, order = logits.sort(dim=-1, descending=True, stable=True)
    keep_sorted = sorted_x.cumsum(-1) - sorted_x < top_p
    keep_sorted[..., 0] = True
    keep = torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)
    return logits.masked_fill(~keep, float("-inf"))


def _greedy(fn) -> bool:
    """Whether fn picks the argmax (a slip of its own, named by its Bug): on 64 uniform rows a sampler would not."""
    try:
        got = fn(torch.zeros(64, 50), 1.0, torch.Generator().manual_seed(0))
        return isinstance(got, torch.Tensor) and bool((got == 0).all())
    except Exception:
        return False


def _sample_ref(logits, temperature, seed):
    return torch.multinomial(torch.softmax(logits / temperature, dim=-1), 1,
                             generator=torch.Generator().manual_seed(seed))


def check_temperature_sample(fn) -> CheckResult:
    """Check ``temperature_sample(logits (B, V), temperature, generator) -> (B, 1)`` ids (lesson 12)."""
    g = torch.Generator().manual_seed(3)
    cases = [Case("logits (1, 5), temperature 1.0", (torch.randn(1, 5, generator=g), 1.0, 0)),
             Case("logits (4, 30), temperature 0.5", (3 * torch.randn(4, 30, generator=g), 0.5, 1)),
             Case("logits (8, 12), temperature 2.0", (torch.randn(8, 12, generator=g), 2.0, 2)),
             Case("logits (16, 9), temperature 0.8", (torch.randn(16, 9, generator=g), 0.8, 7))]

    def run(logits, temperature, seed):  # a fresh generator on every call, so both sides draw alike
        import torch.distributions as dist

        generator = torch.Generator().manual_seed(seed)
        before, original, used = generator.get_state(), dist.Categorical.sample, []

        def spy(self, *args, **kwargs):
            used.append(True)
            return original(self, *args, **kwargs)

        dist.Categorical.sample = spy  # to name the slip of sampling with torch.distributions
        try:
            got = fn(logits, temperature, generator)
        finally:
            dist.Categorical.sample = original
        if used:
            return Reject("torch.distributions.Categorical(...).sample() draws from torch's global generator and "
                          "cannot take the generator you were given, so the draw cannot be repeated: use "
                          "torch.multinomial(probs, 1, generator=generator)")
        if got is not None and torch.equal(generator.get_state(), before) and not _greedy(fn):
            return Reject("your function never drew from the generator it was given (torch.multinomial without "
                          "generator= draws from torch's global one): pass generator=generator")
        return got

    bugs = [Bug("the logits were multiplied by the temperature: divide them (T < 1 sharpens, T > 1 flattens)",
                lambda x, t, s: _sample_ref(x * t * t, t, s)),
            Bug("that is the most probable token every time (greedy): draw one with torch.multinomial",
                lambda x, t, s: x.argmax(-1, keepdim=True)),
            Bug("softmax ran over the batch (dim=0): normalise each row, dim=-1",
                lambda x, t, s: torch.multinomial(torch.softmax(x / t, dim=0), 1,
                                                  generator=torch.Generator().manual_seed(s)))]
    return check("temperature_sample", run, _sample_ref, cases, bugs=bugs,
                 matches="draws the reference's tokens from the same generator")


def _tiny_model(seed: int = 0):
    from helpers.gpt import GPT, GPTConfig

    torch.manual_seed(seed)
    model = GPT(GPTConfig.tiny(len(_VOCAB))).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))  # livelier predictions than the 0.02 initialisation
    return model


_VOCAB = Vocab("abc \n")


def _bpc_ref(model, vocab, text):
    ids = torch.tensor([vocab.encode(text)])  # (1, T)
    with torch.no_grad():
        logits = model(ids[:, :-1])  # (1, T-1, V): each position predicts the next character
    return F.cross_entropy(logits[0].double(), ids[0, 1:]).item() / math.log(2)


def check_bits_per_char(fn) -> CheckResult:
    """Check ``bits_per_char_of(model, vocab, text) -> float`` on a small GPT (lesson 12)."""
    model = _tiny_model()
    cases = [Case(repr(t), (model, _VOCAB, t)) for t in ("abc abc\n", "a", "cab\nbac ab", "aaaaaaaaaaaaaaaaaaaa")]
    cases = [c for c in cases if len(c.args[2]) >= 2]

    def nats(model, vocab, text):
        return _bpc_ref(model, vocab, text) * math.log(2)

    def unshifted(model, vocab, text):
        ids = torch.tensor([vocab.encode(text)])
        with torch.no_grad():
            return F.cross_entropy(model(ids)[0].double(), ids[0]).item() / math.log(2)

    def summed(model, vocab, text):
        return _bpc_ref(model, vocab, text) * (len(text) - 1)

    bugs = [Bug("that is in nats (natural log): divide by ln 2 for bits", nats),
            Bug("each position was scored on its own character: logits at t predict the character at t + 1",
                unshifted),
            Bug("that is the total: bits per character is the mean over the predicted characters", summed)]
    return check("bits_per_char_of", fn, _bpc_ref, cases, bugs=bugs, atol=1e-4, rtol=1e-4, strict_types=False)


def _prefilled(model, prompt):
    caches = model.new_caches(prompt.shape[0], model.config.max_len)
    with torch.no_grad():
        model.forward_cached(prompt, caches)
    return caches


def _step_ref(model, prompt, token):
    caches = _prefilled(model, prompt)
    with torch.no_grad():
        return model.forward_cached(token, caches)[:, -1]  # (B, V)


def check_cached_step(fn) -> CheckResult:
    """Check ``cached_step(model, caches, token (B, 1)) -> logits (B, V)`` against the full forward (lesson 12)."""
    model = _tiny_model(1)
    g = torch.Generator().manual_seed(5)
    V = model.config.vocab_size
    cases = [Case(f"B={B}, a prompt of {T} tokens", (model, torch.randint(0, V, (B, T), generator=g),
                                                     torch.randint(0, V, (B, 1), generator=g)))
             for B, T in ((1, 1), (2, 5), (3, 12))]

    def run(model, prompt, token):  # fresh caches holding the prompt, on every call
        return fn(model, _prefilled(model, prompt), token)

    def no_offset(model, prompt, token):
        caches = _prefilled(model, prompt)
        x = model.pos(model.embed(token), offset=0)
        for block, cache in zip(model.blocks, caches, strict=True):
            x = block(x, None, False, cache)
        return model.head(model.norm(x))[:, -1]

    def no_norm(model, prompt, token):
        caches = _prefilled(model, prompt)
        x = model.pos(model.embed(token), offset=caches[0].length)
        for block, cache in zip(model.blocks, caches, strict=True):
            x = block(x, None, False, cache)
        return model.head(x)[:, -1]

    bugs = [Bug("the new token got position 0: its position is the number of tokens already cached, "
                "caches[0].length (pass it as the offset of model.pos)", no_offset),
            Bug("the final LayerNorm (model.norm) is missing before the output layer", no_norm)]
    return check("cached_step", run, _step_ref, cases, bugs=bugs, atol=1e-5, layouts=False)


# Exercise 5's model: not the lesson's; a wider GPT with grouped key/value heads, its cache full, float32
CACHE_EXERCISE = dict(vocab_size=70, d_model=256, n_heads=8, n_layers=6, d_ff=1024, max_len=256, n_kv_heads=2)
CACHE_EXERCISE_BATCH = 4


def check_predict_cache_bytes(predicted) -> CheckResult:
    """Compare a predicted KV-cache size in bytes of exercise 5's GPT (batch 4, full context) with it (lesson 12)."""
    from helpers.gpt import GPTConfig

    cfg = GPTConfig(**CACHE_EXERCISE)
    B, L, T, D, bytes_ = CACHE_EXERCISE_BATCH, cfg.n_layers, cfg.max_len, cfg.head_dim, 4
    right = 2 * L * B * cfg.n_kv_heads * T * D * bytes_

    def measure():
        from helpers.gpt import GPT

        model = GPT(cfg)
        return sum(c.k.nbytes + c.v.nbytes for c in model.new_caches(B, cfg.max_len))

    slips = [slip_at(right * cfg.n_heads / cfg.n_kv_heads, f"that counts a key and a value for every one of the "
                     f"{cfg.n_heads} query heads: with n_kv_heads={cfg.n_kv_heads} only {cfg.n_kv_heads} heads keep "
                     "keys and values", rel=1e-6),
             slip_at(right / 2, "that is the keys alone (or the values alone): the cache keeps both", rel=1e-6),
             slip_at(right / L, f"that is one layer: every one of the {L} blocks keeps its own cache", rel=1e-6),
             slip_at(right / B, f"that is one sequence: the batch holds {B}", rel=1e-6),
             slip_at(right / bytes_, "that counts numbers, not bytes: a float32 takes 4 bytes", rel=1e-6)]
    return check_prediction("predict_cache_bytes", predicted, measure, "KV-cache size in bytes", slips=slips)
