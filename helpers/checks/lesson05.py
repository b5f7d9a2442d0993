"""Exercise checks of lesson 05: masks (each one prints a single line and returns True or False)."""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

from helpers.attention import MultiHeadAttention, scaled_dot_product_attention
from helpers.checks._core import Bug, Case, CheckResult, Reject, check, describe, torch_calls
from helpers.checks._slips import check_prediction_with_slips
from helpers.masks import causal_mask, padding_mask, padding_mask_from_ids

__all__ = ["check_causal_mask", "check_padding_mask", "check_masked_attention", "check_mha_masks",
           "check_leaks_future", "check_predict_causal_fraction"]


# 1) a causal mask for T new queries at the end of S keys (a KV cache) ----------------------------

def _causal(T, S):
    return torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T)  # (T, S), bottom-right aligned


def check_causal_mask(fn) -> CheckResult:
    """Check ``causal_mask(T, S) -> (T, S)`` bool, queries = the last T of S positions (lesson 05)."""
    cases = [Case("T=4, S=4 (the square mask)", (4, 4)),
             Case("T=3, S=7 (3 new queries after 4 cached keys)", (3, 7)),
             Case("T=1, S=6 (one new query sees every key)", (1, 6)),
             Case("T=1, S=1", (1, 1))]
    bugs = [
        Bug("polarity flipped: True must mean 'may attend' (this is nn.MultiheadAttention's blocked mask)",
         lambda T, S: ~_causal(T, S)),
        Bug("aligned top-left (like torch's is_causal=True): the queries are the LAST T positions, so "
         "the last query must see all S keys", lambda T, S: torch.ones(T, S, dtype=torch.bool).tril()),
        Bug("True above the diagonal: query t would see the future and not the past",
         lambda T, S: torch.ones(T, S, dtype=torch.bool).triu(diagonal=S - T)),
        Bug("the diagonal is missing: a query may attend to its own position",
         lambda T, S: torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T - 1)),
        Bug("the diagonal offset has the wrong sign: query t stands at position t + S - T, so "
            "tril(diagonal=S - T), not T - S", lambda T, S: torch.ones(T, S, dtype=torch.bool).tril(diagonal=T - S)),
        Bug("one key too many: each query also sees the key just after its own position; use tril(diagonal=S - T)",
         lambda T, S: torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T + 1)),
        Bug("the mask is (S, T): rows are the T queries and columns the S keys, so build it (T, S)",
         lambda T, S: torch.ones(S, T, dtype=torch.bool).tril(diagonal=S - T)),
        Bug("that is a float mask of 0 and -inf (to add to the scores); return the boolean mask, True = may attend",
         lambda T, S: torch.zeros(T, S).masked_fill(~_causal(T, S), float("-inf"))),
        Bug("that is a float mask of 1 and 0; return a boolean mask (dtype torch.bool), True = may attend",
         lambda T, S: _causal(T, S).float()),
    ]
    return check("causal_mask", fn, _causal, cases, bugs=bugs)


# 2) a padding mask from token ids ---------------------------------------------------------------

def check_padding_mask(fn) -> CheckResult:
    """Check ``padding_mask_from_ids(ids (B, S), pad_id) -> (B, 1, 1, S)`` bool (lesson 05)."""
    right = torch.tensor([[5, 6, 7, 8, 0, 0], [9, 4, 0, 0, 0, 0], [3, 3, 3, 3, 3, 3]])  # (B, S)
    left = torch.tensor([[0, 0, 0, 4, 5, 6], [7, 8, 9, 4, 5, 6]])  # (B, S)
    odd = torch.tensor([[4, 1, 1, 2, 2], [4, 5, 6, 7, 2]])  # (B, S), pad_id 2
    cases = [Case("right-padded ids (3, 6), pad_id=0", (right, 0)),
             Case("left-padded ids (2, 6), pad_id=0", (left, 0)),
             Case("ids (2, 5) with pad_id=2", (odd, 2))]
    bugs = [
        Bug("polarity flipped: True must mean 'a real token, may attend', False 'padding'",
         lambda ids, pad_id: ~padding_mask_from_ids(ids, pad_id)),
        Bug("shape (B, S): add two axes, (B, 1, 1, S), so that it broadcasts over heads and queries",
         lambda ids, pad_id: ids != pad_id),
        Bug("shape (B, 1, S, 1) masks queries, not keys: put the S axis last, (B, 1, 1, S)",
         lambda ids, pad_id: (ids != pad_id)[:, None, :, None]),
        Bug("you compare with 0 whatever pad_id is: use ids != pad_id",
         lambda ids, pad_id: (ids != 0)[:, None, None, :]),
        Bug("the mask comes from the first pad onwards: mark each position by its own id, ids != pad_id "
            "(left-padded rows start with pads)",
         lambda ids, pad_id: (torch.cumsum(ids == pad_id, dim=-1) == 0)[:, None, None, :]),
        Bug("shape (B, 1, S): add one more axis, (B, 1, 1, S), one for the heads and one for the queries",
         lambda ids, pad_id: (ids != pad_id)[:, None, :]),
        Bug("ids > pad_id assumes the pad has the smallest id: compare with ids != pad_id",
         lambda ids, pad_id: (ids > pad_id)[:, None, None, :]),
        Bug("that counts the real tokens and keeps the first ones, which holds for right padding only: mark each "
            "position by its own id, ids != pad_id (left-padded rows start with pads)",
         lambda ids, pad_id: (torch.arange(ids.shape[1]) < (ids != pad_id).sum(-1, keepdim=True))[:, None, None, :]),
        Bug("that is a float mask; return a boolean mask (dtype torch.bool), True = a real token",
         lambda ids, pad_id: (ids != pad_id)[:, None, None, :].float()),
    ]
    return check("padding_mask", fn, padding_mask_from_ids, cases, bugs=bugs)


# 3) masked attention that never gives NaN -------------------------------------------------------

def _attention_cases():
    g = torch.Generator().manual_seed(5)
    T, D = 5, 4
    q, k, v = (torch.randn(2, 2, T, D, generator=g) for _ in range(3))  # (B, H, T, D) each
    pad = padding_mask([3, 4], T)  # (B, 1, 1, S), every item has real and padded keys
    causal = causal_mask(T)  # (T, T)
    left_causal = padding_mask([2, 5], T).flip(-1) & causal  # (B, 1, T, S), item 0 has empty rows
    # blocked scores far above the allowed ones: key s scores 60 * s against every query
    q_big = torch.zeros(1, T, D)
    q_big[..., 0] = 1.0  # (1, T, D)
    k_big = torch.zeros(1, T, D)
    k_big[0, :, 0] = 60.0 * D**0.5 * torch.arange(T)  # (1, S, D)
    v_big = torch.randn(1, T, 3, generator=g)  # (1, S, Dv)
    return [Case("a padding mask (B, 1, 1, S), batch of lengths 3 and 4", (q, k, v, pad)),
            Case("a causal mask (T, T)", (q, k, v, causal)),
            Case("left padding + causal: item 0 has fully masked rows (the answer there is 0, not NaN)",
                 (q, k, v, left_causal)),
            Case("blocked scores up to 240 above the allowed ones (exp underflows)",
                 (q_big, k_big, v_big, causal))]


_HUGE_NEGATIVE = -1e4  # far below any score of the cases: only a fill of blocked scores gets there


class _HugeNegativeExp(TorchFunctionMode):
    """Record the exponentials (exp, softmax, ...) that receive a score of _HUGE_NEGATIVE or less."""

    EXPONENTIALS = {"exp", "exp_", "softmax", "_softmax", "log_softmax", "logsumexp"}

    def __init__(self):
        super().__init__()
        self.names = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        x = args[0] if args else None
        if (name in self.EXPONENTIALS and isinstance(x, torch.Tensor) and x.is_floating_point()
                and (x <= _HUGE_NEGATIVE).any()):
            self.names.add(name)
        return func(*args, **(kwargs or {}))


class _InfExp(TorchFunctionMode):
    """Record whether an exponential returned +inf (a blocked score far above the allowed maximum)."""

    def __init__(self):
        super().__init__()
        self.overflowed = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if getattr(func, "__name__", "") in ("exp", "exp_") and isinstance(out, torch.Tensor) \
                and out.is_floating_point() and torch.isposinf(out).any():
            self.overflowed = True
        return out


def _exp_overflows(fn) -> bool:
    """Does ``fn`` compute an exp that overflows to inf on the cases with blocked scores?"""
    mode = _InfExp()
    for case in _attention_cases()[2:]:
        try:
            with mode:
                fn(*case.args)
        except Exception:  # the check itself reports what the function raises
            pass
    return mode.overflowed


def check_masked_attention(fn) -> CheckResult:
    """Check ``masked_attention(q, k, v, mask) -> (out, weights)``, True = may attend, no NaN (lesson 05)."""
    def by_hand(q, k, v, mask, max_over="allowed", guard=True, renormalise=True, zero="where", scale=None,
                dim=-1):
        scores = q @ k.transpose(-2, -1) * (q.shape[-1] ** -0.5 if scale is None else scale)  # (..., T, S)
        mask = mask.expand_as(scores)
        top = torch.where(mask, scores, torch.finfo(scores.dtype).min) if max_over == "allowed" else scores
        e = torch.exp(scores - top.amax(dim, keepdim=True))  # (..., T, S)
        e = torch.where(mask, e, 0.0) if zero == "where" else e * mask  # e * mask: inf * 0 = NaN
        w = e / (e.sum(dim, keepdim=True).clamp_min(1e-30) if guard else e.sum(dim, keepdim=True)) \
            if renormalise else torch.softmax(scores, -1) * mask
        return w @ v, w

    bugs = [Bug("polarity flipped: True in the mask must mean 'may attend'",
              lambda q, k, v, mask: scaled_dot_product_attention(q, k, v, ~mask)),
            Bug("the scores are not scaled: divide q @ k^T by sqrt(D) before the softmax",
                lambda q, k, v, mask: by_hand(q, k, v, mask, scale=1.0)),
            Bug("the scores are divided by D; divide them by sqrt(D)",
                lambda q, k, v, mask: by_hand(q, k, v, mask, scale=1 / q.shape[-1])),
            Bug("the weights are normalised over the queries (dim -2): each query's row of weights over the keys "
                "must sum to 1 (dim -1)", lambda q, k, v, mask: by_hand(q, k, v, mask, dim=-2)),
            Bug("a fully masked row gives 0 / 0 = NaN when you renormalise: divide only where the row sum is "
                "above 0 (such a row's weights and output are 0)",
                lambda q, k, v, mask: by_hand(q, k, v, mask, guard=False)),
            Bug("two traps: a fully masked row gives 0 / 0 = NaN, and your max includes the blocked scores, so "
                "when a blocked score is far larger the allowed weights underflow to 0; take the max over the "
                "allowed scores and divide only where the row sum is above 0",
                lambda q, k, v, mask: by_hand(q, k, v, mask, max_over="all", guard=False)),
            Bug("your max includes the blocked scores: when a blocked score is far larger, every allowed "
                "exp underflows to 0; subtract the max over the allowed scores only",
                lambda q, k, v, mask: by_hand(q, k, v, mask, max_over="all")),
            Bug("the rows are not renormalised: after zeroing the blocked weights, divide each row by its new sum",
                lambda q, k, v, mask: by_hand(q, k, v, mask, renormalise=False))]
    # An exp that overflows to inf, then times 0, gives the same NaN as an allowed exp that underflows, then
    # 0 / 0: which one happened is read from the learner's own exps, and its bugs are tried first.
    overflow = [
        Bug("exp(score - max) overflows to inf where a blocked score lies far above the allowed maximum (and in "
            "a fully masked row, whose allowed maximum is -inf or the lowest float), and multiplying by the mask gives "
            "inf * 0 = NaN; zero the blocked entries with torch.where instead of multiplying by the mask",
            lambda q, k, v, mask: by_hand(q, k, v, mask, zero="multiply")),
    ]
    bugs = overflow + bugs if _exp_overflows(fn) else bugs + overflow

    def way_2(fn):  # the exercise asks for way 2: softmax, zero the blocked weights, renormalise
        case = _attention_cases()[2]
        used = torch_calls(fn, *case.args, minus_inf=True)
        if used:
            return False, (f"the values are right, but your function passes -inf to {', '.join(sorted(used))}: "
                           "the exercise asks for way 2, without any -inf (zero the blocked weights, renormalise)")
        with _HugeNegativeExp() as seen:
            fn(*case.args)
        if seen.names:
            return False, (f"the values are right, but your function feeds scores of {_HUGE_NEGATIVE:g} or less "
                           f"to {', '.join(sorted(seen.names))}: that is way 1 with a large negative fill "
                           "(such as -1e9) instead of -inf; the exercise asks for way 2 (softmax, zero the "
                           "blocked weights, renormalise)")
        return True, ""

    return check("masked_attention", fn, scaled_dot_product_attention, _attention_cases(), bugs=bugs,
                 then=way_2)


# 4) the same mask in nn.MultiheadAttention's polarity -------------------------------------------

def _to_torch(causal, padding):
    return ~causal, ~padding[:, 0, 0, :]  # (T, S) and (B, S), True = blocked


def check_mha_masks(fn) -> CheckResult:
    """Check ``to_torch_mha_masks(causal (T, S), padding (B, 1, 1, S)) -> (attn_mask, key_padding_mask)``
    for nn.MultiheadAttention, where True = blocked (lesson 05)."""
    cases = [Case("T=4, lengths [4, 2]", (causal_mask(4), padding_mask([4, 2], 4))),
             Case("T=3, lengths [1, 3, 2]", (causal_mask(3), padding_mask([1, 3, 2], 3))),
             Case("a batch of one: T=5, lengths [3] (key_padding_mask must stay (1, S))",
                  (causal_mask(5), padding_mask([3], 5)))]
    bugs = [
        Bug("the masks still have the course's polarity: nn.MultiheadAttention reads True as 'blocked'",
         lambda c, p: (c, p[:, 0, 0, :])),
        Bug("attn_mask is right, key_padding_mask still has the course's polarity (True = may attend)",
         lambda c, p: (~c, p[:, 0, 0, :])),
        Bug("key_padding_mask is right, attn_mask still has the course's polarity (True = may attend)",
         lambda c, p: (c, ~p[:, 0, 0, :])),
        Bug("squeeze() also drops the batch axis when B = 1: take padding[:, 0, 0, :] to keep (B, S)",
         lambda c, p: (~c, ~p.squeeze())),
        Bug("key_padding_mask must be (B, S): take padding[:, 0, 0, :] (or flatten the two middle axes away)",
         lambda c, p: (~c, ~p)),
        Bug("the two masks are swapped: return (attn_mask, key_padding_mask)",
         lambda c, p: _to_torch(c, p)[::-1]),
        Bug("key_padding_mask must be (B, S): padding[:, 0] still has a query axis; take padding[:, 0, 0, :]",
         lambda c, p: (~c, ~p[:, 0])),
        Bug("those are float masks of 0 and -inf: nn.MultiheadAttention accepts them, but the exercise asks for "
            "boolean masks, True = blocked (~mask)", lambda c, p: tuple(
                torch.zeros(m.shape).masked_fill(m, float("-inf")) for m in _to_torch(c, p))),
        Bug("the causal mask is transposed: keep it (T, S), row t for query t, and only invert it",
         lambda c, p: (~c.T, ~p[:, 0, 0, :])),
    ]
    return check("mha_masks", fn, _to_torch, cases, bugs=bugs)


# 5) a leak detector -----------------------------------------------------------------------------

def _leaks(f, x):
    """True if some output position t changes when only inputs after t change."""
    g = torch.Generator().manual_seed(11)
    base = f(x)
    for t in range(x.shape[1] - 1):
        changed = x.clone()
        changed[:, t + 1:] = torch.randn(changed[:, t + 1:].shape, generator=g, dtype=x.dtype)
        if not torch.allclose(f(changed)[:, : t + 1], base[:, : t + 1], atol=1e-6):
            return True
    return False


def _leak_cases():
    with torch.random.fork_rng(devices=[]):  # build the models without touching the learner's RNG
        torch.manual_seed(0)
        mha = MultiHeadAttention(8, 2).eval()
    T = 6
    x = torch.randn(2, T, 8, generator=torch.Generator().manual_seed(3))  # (B, T, C)

    def attend(mask):
        return lambda x: mha(x, x, x, mask=mask)[0]

    def one_early_leak(x):  # only output 1 reads input 3: a detector must perturb more than the last input
        out = x.clone()
        out[:, 1] = out[:, 1] + x[:, 3]
        return out

    def late_leak(x):  # only output T - 2 reads the last input: a detector must test t = T - 2
        out = x.clone()
        out[:, -2] = out[:, -2] + x[:, -1]
        return out

    def running_mean(x):
        return x.cumsum(1) / torch.arange(1, x.shape[1] + 1)[None, :, None]

    return [Case("f = attention with a causal mask (no leak)", (attend(causal_mask(T)), x)),
            Case("f = attention without a mask (leaks)", (attend(None), x)),
            Case("f = running mean over positions <= t (no leak)", (running_mean, x)),
            Case("f = every position adds the LAST input (leaks from far ahead)",
                 (lambda x: x + x[:, -1:], x)),
            Case("f = only output 1 reads input 3 (a leak through one early position)", (one_early_leak, x)),
            Case("f = attention with the transposed causal mask (leaks)", (attend(causal_mask(T).T), x)),
            Case("f = only output T-2 reads the last input (a leak into the last position that has a future)",
                 (late_leak, x))]


def check_leaks_future(fn) -> CheckResult:
    """Check ``leaks_future(f, x (B, T, C)) -> bool``: does output t depend on inputs after t? (lesson 05)."""
    def last_input_only(f, x):  # perturbs only the last input, so it misses leaks from earlier ones
        changed = x.clone()
        changed[:, -1] = changed[:, -1] + 1.0
        return not torch.allclose(f(changed)[:, :-1], f(x)[:, :-1], atol=1e-6)

    def first_output_only(f, x):  # compares only output 0 after changing every later input
        changed = x.clone()
        changed[:, 1:] = changed[:, 1:] + 1.0
        return not torch.allclose(f(changed)[:, 0], f(x)[:, 0], atol=1e-6)

    def stops_early(f, x):  # range(T - 2): never tests t = T - 2
        base = f(x)
        for t in range(x.shape[1] - 2):
            changed = x.clone()
            changed[:, t + 1:] = changed[:, t + 1:] + 1.0
            if not torch.allclose(f(changed)[:, : t + 1], base[:, : t + 1], atol=1e-6):
                return True
        return False

    bugs = [Bug("your detector says True for every function, even attention with a causal mask, which cannot "
                "leak: for each t, change only the inputs AFTER t (output t may read input t) and compare only "
                "outputs 0..t (later outputs may read the changed inputs)", lambda f, x: True),
            Bug("your detector says False for every function, even attention without a mask: for each t, change "
                "the inputs after t, and return True as soon as one of outputs 0..t moves", lambda f, x: False),
            Bug("your answer is inverted: return True when some output DOES change (a leak), False when none does",
                lambda f, x: not _leaks(f, x)),
            Bug("your detector misses a leak from an input before the last one: for every t, change "
                "all inputs after t and compare outputs 0..t", last_input_only),
            Bug("your detector compares only output 0: a leak into a later output (output 1 reading input 3) "
                "goes unseen; for every t, change the inputs after t and compare outputs 0..t", first_output_only),
            Bug("your detector never tests t = T - 2, the last position that has a future: loop over "
                "t in range(T - 1)", stops_early)]
    return check("leaks_future", fn, _leaks, _leak_cases(), bugs=bugs, adapt=_as_bool)


def _as_bool(got, expected):
    """Accept True/False, a one-element bool tensor or numpy bool; name anything else."""
    if isinstance(got, torch.Tensor) and got.numel() == 1 and got.dtype == torch.bool:
        return bool(got)
    if isinstance(got, bool) or type(got).__name__ == "bool_":
        return bool(got)
    return Reject(f"return True or False, got {describe(got)}")


def _causal_fraction(T: int = 10) -> float:
    return causal_mask(T).float().mean().item()  # (T + 1) / (2T) = 0.55 at T = 10


def check_predict_causal_fraction(predicted) -> CheckResult:
    """Predict then measure: the fraction of (query, key) pairs a causal mask keeps at T=10 (lesson 05).

    At T = 10 the diagonal is worth 0.05: the right count (0.55) is told apart from "half" (0.5)
    and from the triangle without its diagonal (0.45).
    """
    slips = ((0.45, "0.45 leaves out the diagonal: query t may attend to its own position, so row t keeps t + 1 "
                    "keys, 1 + 2 + ... + 10 = 55 of the 100 pairs"),
             (0.5, "not quite half: the triangle below the diagonal is 45 of the 100 pairs, and the diagonal "
                   "adds 10 more (each query sees itself)"),
             (55.0, "that is the number of pairs kept; the exercise asks for the fraction, pairs kept / T^2"),
             (45.0, "that is a count, and it leaves out the diagonal: 55 of the 100 pairs are kept, a fraction of "
                    "pairs kept / T^2"))
    return check_prediction_with_slips(
        "predict_causal_fraction", predicted, _causal_fraction, "fraction of pairs kept", abs_tol=0.02, slips=slips,
        hint="count the keys of each row: query t keeps keys 0..t, that is t + 1 of them, out of T = 10")
