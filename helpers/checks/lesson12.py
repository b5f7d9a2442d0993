"""Exercise checks of lesson 12 (each one prints a single line and returns True or False)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from helpers.checks._core import Bug, Case, CheckResult, check, check_prediction
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
    bugs = [Bug("the token that crosses top_p was dropped: keep a token while the tokens ranked before it sum to "
                "less than top_p (cumsum - p < top_p), not while its own cumsum <= top_p",
                lambda x, p: _top_p_bug(x, p, lambda s, p: s.cumsum(-1) <= p)),
            Bug("that keeps the least probable tokens: sort with descending=True",
                lambda x, p: _top_p_bug(x, p, lambda s, p: s.flip(-1).cumsum(-1).flip(-1) - s < p)),
            Bug("the kept logits come back in sorted order: scatter the keep-mask back to the original positions "
                "(sorted.scatter or an inverse permutation)",
                lambda x, p: _top_p(x, p).sort(dim=-1, descending=True).values),
            Bug("the removed entries must be -inf (probability 0 after softmax), not 0",
                lambda x, p: _top_p(x, p).nan_to_num(neginf=0.0)),
            Bug("the cumulative sum ran over the logits, not the probabilities: apply softmax first",
                lambda x, p: _top_p_bug_logits(x, p))]
    return check("top_p_filter", fn, _top_p, cases, bugs=bugs)


def _top_p_bug_logits(logits, top_p):
    sorted_x, order = logits.sort(dim=-1, descending=True, stable=True)
    keep_sorted = sorted_x.cumsum(-1) - sorted_x < top_p
    keep_sorted[..., 0] = True
    keep = torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)
    return logits.masked_fill(~keep, float("-inf"))


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
        return fn(logits, temperature, torch.Generator().manual_seed(seed))

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


def check_predict_cache_bytes(predicted) -> CheckResult:
    """Compare a predicted KV-cache size in bytes of the course GPT (batch 1, full context) with it (lesson 12)."""
    def measure():
        from helpers.gpt import GPT, GPTConfig

        model = GPT(GPTConfig.course(70))
        return sum(c.k.nbytes + c.v.nbytes for c in model.new_caches(1, model.config.max_len))

    return check_prediction("predict_cache_bytes", predicted, measure, "KV-cache size in bytes")
