"""Exercise checks of lesson 01 (each one prints a single line and returns True or False)."""

from __future__ import annotations

import math
import numbers

import numpy as np
import torch
from torch import nn

from helpers.checks._core import Bug, Case, CheckResult, Reject, Slip, check, check_prediction, describe

__all__ = ["check_additive_scores", "check_attention_read", "check_input_gradient_norms",
           "check_alignment_accuracy", "check_predict_vanishing"]


def _additive_scores(s, h, W, U, b, v):
    # v^T tanh(W s + U h_j + b) for every source position j (Bahdanau et al. 2015, appendix A.1.2)
    return torch.tanh((s @ W.T)[:, None, :] + h @ U.T + b) @ v  # (B, 1, A) + (B, S, A) -> (B, S)


def check_additive_scores(fn) -> CheckResult:
    """Check ``additive_scores(s (B, Dq), h (B, S, E), W (A, Dq), U (A, E), b (A,), v (A,)) -> (B, S)`` (lesson 01)."""
    g = torch.Generator().manual_seed(0)

    def r(*shape, scale=1.0):
        return torch.randn(*shape, generator=g) * scale

    cases = [
        Case("B=1, S=3, all widths 4", (r(1, 4), r(1, 3, 4), r(4, 4), r(4, 4), r(4), r(4))),
        Case("B=2, S=5, query width Dq=3, state width E=6, A=4",
             (r(2, 3), r(2, 5, 6), r(4, 3), r(4, 6), r(4), r(4))),
        Case("large inputs, where tanh saturates near +-1",
             (r(2, 3, scale=5), r(2, 4, 3, scale=5), r(5, 3), r(5, 3), r(5), r(5))),
    ]
    bugs = [Bug("the tanh is missing: the score is v^T tanh(W s + U h_j + b)",
                lambda s, h, W, U, b, v: ((s @ W.T)[:, None, :] + h @ U.T + b) @ v),
            Bug("W and U are used untransposed: W has shape (A, Dq), so W s is s @ W.T",
                lambda s, h, W, U, b, v: torch.tanh((s @ W)[:, None, :] + h @ U + b) @ v),
            Bug("the bias b is missing: the score is v^T tanh(W s + U h_j + b)",
                lambda s, h, W, U, b, v: torch.tanh((s @ W.T)[:, None, :] + h @ U.T) @ v),
            Bug("the product with v is missing: summing tanh(...) over A weighs every unit by 1; use @ v",
                lambda s, h, W, U, b, v: torch.tanh((s @ W.T)[:, None, :] + h @ U.T + b).sum(-1)),
            Bug("those are the weights, softmax(scores): return the raw scores; the softmax comes in exercise 2",
                lambda s, h, W, U, b, v: torch.softmax(_additive_scores(s, h, W, U, b, v), dim=-1)),
            Bug("the bias b is added after the tanh: it belongs inside, v^T tanh(W s + U h_j + b)",
                lambda s, h, W, U, b, v: (torch.tanh((s @ W.T)[:, None, :] + h @ U.T) + b) @ v),
            Bug("the query term W s is missing: the score depends on the decoder state, tanh(W s + U h_j + b)",
                lambda s, h, W, U, b, v: torch.tanh(h @ U.T + b) @ v),
            Bug("the state term U h_j is missing: without it every position gets the same score",
                lambda s, h, W, U, b, v: torch.tanh((s @ W.T + b)[:, None, :].expand(-1, h.shape[1], -1)) @ v),
            Bug("the nonlinearity is tanh, not ReLU: v^T tanh(W s + U h_j + b)",
                lambda s, h, W, U, b, v: torch.relu((s @ W.T)[:, None, :] + h @ U.T + b) @ v),
            Bug("the nonlinearity is tanh, not the sigmoid: v^T tanh(W s + U h_j + b)",
                lambda s, h, W, U, b, v: torch.sigmoid((s @ W.T)[:, None, :] + h @ U.T + b) @ v),
            Bug("additive scores have no 1/sqrt(A) factor (that scaling belongs to dot-product attention, "
                "lesson 03)", lambda s, h, W, U, b, v: _additive_scores(s, h, W, U, b, v) / v.shape[0] ** 0.5)]
    return check("additive_scores", fn, _additive_scores, cases, bugs=bugs)


def _attention_read(scores, h, mask):
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)  # (B, S)
    return (weights[:, None, :] @ h)[:, 0], weights  # (B, E), (B, S)


def _weighted(h, weights):
    return (weights[:, None, :] @ h)[:, 0], weights  # (B, E), (B, S)


def check_attention_read(fn) -> CheckResult:
    """Check ``attention_read(scores (B, S), h (B, S, E), mask (B, S)) -> (context (B, E), weights)`` (lesson 01)."""
    g = torch.Generator().manual_seed(1)
    full = torch.ones(1, 4, dtype=torch.bool)
    padded = torch.tensor([[True] * 5, [True, True, True, False, False]])
    pad_wins = torch.randn(2, 5, generator=g)
    pad_wins[1, 3:] = 1e3  # the padded positions of row 1 hold by far the largest scores
    cases = [
        Case("B=1, S=4, no padding (mask all True; a batch of one)",
             (torch.randn(1, 4, generator=g), torch.randn(1, 4, 3, generator=g), full)),
        Case("row 1 has 2 padded positions (mask False there: they must get weight 0)",
             (torch.randn(2, 5, generator=g), torch.randn(2, 5, 3, generator=g), padded)),
        Case("scores of size 1e3 with padding (a naive exp overflows)",
             (torch.randn(2, 5, generator=g) * 1e3, torch.randn(2, 5, 3, generator=g), padded)),
        Case("the padded positions of row 1 hold the largest scores (1e3)",
             (pad_wins, torch.randn(2, 5, 3, generator=g), padded)),
    ]

    def max_over_all(s, h, m):  # a hand-written stable softmax whose max also sees the padded scores
        e = torch.exp(s - s.max(dim=-1, keepdim=True).values) * m
        w = e / e.sum(dim=-1, keepdim=True)
        return (w[:, None, :] @ h)[:, 0], w

    def zero_fill(s, h, m):  # padded scores set to 0, not -inf: they still get weight
        return _attention_read(s.masked_fill(~m, 0.0), h, torch.ones_like(m))

    bugs = [Bug("the padded positions still get weight: set their scores to -inf before the softmax",
                lambda s, h, m: _attention_read(s, h, torch.ones_like(m))),
            Bug("the mask's polarity is flipped: True means a real position that may be read",
                lambda s, h, m: _attention_read(s, h, ~m)),
            Bug("your row max also sees the padded scores: when a pad holds the largest score, every real "
                "exp(score - max) underflows to 0 and 0 / 0 gives NaN; take the max over the real positions "
                "(fill the pads with -inf first)", max_over_all),
            Bug("the padded scores are set to 0, which still gets weight exp(0): set them to -inf", zero_fill),
            Bug("the two results are swapped: return (context, weights)",
                lambda s, h, m: _attention_read(s, h, m)[::-1]),
            Bug("your softmax runs over the batch (dim 0): each row's weights run over its positions, dim=-1",
                lambda s, h, m: _weighted(h, torch.softmax(s.masked_fill(~m, float("-inf")), dim=0))),
            Bug("the weights of the real positions no longer sum to 1: zeroing the pads after the softmax "
                "leaves them out of the sum; mask the scores with -inf before the softmax (or divide by the "
                "new row sum)", lambda s, h, m: _weighted(h, torch.softmax(s, dim=-1) * m)),
            Bug("exp overflows for scores of 1e3: subtract each row's largest real score before exp "
                "(torch.softmax does it for you)",
                lambda s, h, m: _weighted(h, torch.exp(s) * m / (torch.exp(s) * m).sum(-1, keepdim=True))),
            Bug("return both results, (context, weights): yours returns the context alone",
                lambda s, h, m: _attention_read(s, h, m)[0]),
            Bug("the context is the weighted sum, sum_j a_j h_j: yours sums the states without the weights",
                lambda s, h, m: (h.sum(dim=1), _attention_read(s, h, m)[1])),
            Bug("a mean over the positions divides by S: the weights already sum to 1, so take the sum",
                lambda s, h, m: ((_attention_read(s, h, m)[1][:, :, None] * h).mean(dim=1),
                                 _attention_read(s, h, m)[1]))]
    return check("attention_read", fn, _attention_read, cases, bugs=bugs)


def _input_gradient_norms(rnn, x):
    x = x.detach().clone().requires_grad_(True)
    out, _ = rnn(x[None])  # (1, L, C) -> (1, L, hidden)
    out[0, -1].sum().backward()  # the loss reads only the last state
    return x.grad.norm(dim=-1)  # (L, C) -> (L,)


def _grad(rnn, x, position=-1):
    x = x.detach().clone().requires_grad_(True)
    rnn(x[None])[0][0, position].sum().backward()
    return x.grad  # (L, C)


def check_input_gradient_norms(fn) -> CheckResult:
    """Check ``input_gradient_norms(rnn, x (L, C)) -> (L,)``, loss = sum of the last state (lesson 01)."""
    with torch.random.fork_rng():  # the same RNNs every time, without touching the learner's seed
        torch.manual_seed(0)
        small, wide = nn.RNN(3, 8, batch_first=True), nn.RNN(5, 16, batch_first=True)
    g = torch.Generator().manual_seed(2)
    cases = [
        Case("an RNN(3 -> 8) on a sequence of L=6 inputs", (small, torch.randn(6, 3, generator=g))),
        Case("an RNN(5 -> 16) on a sequence of L=20 inputs (early norms are tiny)",
             (wide, torch.randn(20, 5, generator=g))),
    ]

    def learner(rnn, x):
        rnn.zero_grad(set_to_none=True)
        got = fn(rnn, x)
        if got is not None and (x.requires_grad or x.grad is not None):
            return Reject("your function set requires_grad on the caller's x, so x.grad adds up over calls "
                          "(a second call returns twice the norms): work on x.detach().clone().requires_grad_(True)")
        return got.detach() if isinstance(got, torch.Tensor) else got

    def all_states(rnn, x):
        x = x.detach().clone().requires_grad_(True)
        rnn(x[None])[0].sum().backward()
        return x.grad.norm(dim=-1)

    bugs = [Bug("the loss must read only the last state out[:, -1]; yours sums every state",
                all_states),
            Bug("that is the squared norm: take x.grad.norm(dim=-1), the square root of the sum of squares",
                lambda rnn, x: _input_gradient_norms(rnn, x) ** 2),
            Bug("the norm runs over the positions: take it over each input's features, norm(dim=-1), "
                "one number per position", lambda rnn, x: _grad(rnn, x).norm(dim=0)),
            Bug("the loss reads the first state out[:, 0]; the exercise's loss is the sum of the LAST state",
                lambda rnn, x: _grad(rnn, x, position=0).norm(dim=-1)),
            Bug("that is the L1 norm (the sum of absolute values): take the Euclidean norm, x.grad.norm(dim=-1)",
                lambda rnn, x: _grad(rnn, x).abs().sum(dim=-1)),
            Bug("that is the sum of the gradient's entries: take its norm, x.grad.norm(dim=-1)",
                lambda rnn, x: _grad(rnn, x).sum(dim=-1)),
            Bug("that is the whole gradient (L, C): return one norm per position, x.grad.norm(dim=-1)",
                lambda rnn, x: _grad(rnn, x)),
            Bug("the norms are in reverse order: entry t belongs to input x[t], the first input first",
                lambda rnn, x: _input_gradient_norms(rnn, x).flip(0)),
            Bug("the norms are divided by the last one: return the norms themselves",
                lambda rnn, x: _input_gradient_norms(rnn, x) / _input_gradient_norms(rnn, x)[-1])]
    return check("input_gradient_norms", learner, _input_gradient_norms, cases, bugs=bugs, atol=1e-9,
                 rtol=1e-4)


def _alignment_accuracy(weights, lengths):
    hits = total = 0
    for b, L in enumerate(lengths.tolist()):
        best = weights[b, :L].argmax(dim=-1)  # (L,) most attended source position of each real output
        hits += (best == torch.arange(L - 1, -1, -1)).sum().item()  # reversal: output i reads L-1-i
        total += L
    return hits / total


def _accuracy_to(weights, lengths, target, all_rows=False):
    """Like the reference, but output i is compared with source position target(L, i)."""
    hits = total = 0
    for b, L in enumerate(lengths.tolist()):
        rows = weights.shape[1] if all_rows else L
        best = weights[b, :rows].argmax(dim=-1)  # (rows,)
        hits += (best == torch.tensor([target(L, i) for i in range(rows)])).sum().item()
        total += rows
    return hits / total


def check_alignment_accuracy(fn) -> CheckResult:
    """Check ``alignment_accuracy(weights (B, T, S), lengths (B,)) -> float`` for reversal (lesson 01)."""
    g = torch.Generator().manual_seed(3)
    perfect = torch.flip(torch.eye(4), dims=[1])[None]  # (1, 4, 4): output i on input 3 - i
    noisy = torch.softmax(torch.randn(2, 6, 5, generator=g) * 3, dim=-1)  # (B, T, S)
    noisy[1, :, 3:] = 0.0  # row 1 has length 3: its padded source positions get no weight
    padded_perfect = torch.zeros(2, 5, 5)  # (B, T, S): perfect reversals of lengths 3 and 5
    padded_perfect[0, :3, :3] = torch.flip(torch.eye(3), dims=[1])
    padded_perfect[1] = torch.flip(torch.eye(5), dims=[1])
    cases = [
        Case("one perfect reversal alignment of length 4", (perfect, torch.tensor([4]))),
        Case("perfect reversals of lengths 3 and 5, padded to S=5 (the answer is 1.0)",
             (padded_perfect, torch.tensor([3, 5]))),
        Case("random weights, lengths [5, 3] (only outputs i < length count)", (noisy, torch.tensor([5, 3]))),
        Case("lengths [2, 3] with rows for padded outputs that must be ignored",
             (noisy, torch.tensor([2, 3]))),
    ]

    def as_float(got, expected):
        if isinstance(got, torch.Tensor):
            got = got.detach().cpu().numpy()
        if isinstance(got, np.ndarray) and got.size == 1:
            got = got.reshape(())[()]  # a one-element array -> a numpy scalar
        if isinstance(got, np.generic):
            got = got.item()  # a numpy scalar such as np.float32 -> a Python number
        return float(got) if isinstance(got, numbers.Real) and not isinstance(got, bool) else \
            Reject(f"return a number (a fraction between 0 and 1), got {describe(got)}")

    def padded_target(w, n):  # output i compared with S - 1 - i (the padded width) instead of L - 1 - i
        hits = total = 0
        S = w.shape[-1]
        for b, L in enumerate(n.tolist()):
            best = w[b, :L].argmax(dim=-1)  # (L,)
            hits += (best == torch.arange(S - 1, S - 1 - L, -1)).sum().item()
            total += L
        return hits / total

    def per_batch_mean(w, n):  # the mean of the per-sequence accuracies, not the fraction of all outputs
        return sum(_alignment_accuracy(w[b:b + 1], n[b:b + 1]) for b in range(len(n))) / len(n)

    def wrong_axis(w, n):  # for each source position the most attending output, not the reverse
        hits = total = 0
        for b, L in enumerate(n.tolist()):
            best = w[b, :L, :L].argmax(dim=0)  # (L,) argmax over the outputs (queries)
            hits += (best == torch.arange(L - 1, -1, -1)).sum().item()
            total += L
        return hits / total

    bugs = [Bug("your argmax runs over the outputs (dim -2): each output row picks the source position it "
                "attends to most, weights[b, i].argmax() over the keys (dim -1)", wrong_axis),
            Bug("that is a percentage: return the fraction between 0 and 1",
                lambda w, n: 100 * _alignment_accuracy(w, n)),
            Bug("that is the mean of the sequences' accuracies; count the hits over all real outputs "
                "together (longer sequences weigh more)", per_batch_mean),
            Bug("the target of output i is lengths[b] - 1 - i, from each sequence's own length, not from the "
                "padded width S", padded_target),
            Bug("you compare output i with source position i (the diagonal): reversal reads position "
                "lengths[b] - 1 - i (the anti-diagonal)", lambda w, n: _accuracy_to(w, n, lambda L, i: i)),
            Bug("off by one: output i reads position lengths[b] - 1 - i, not lengths[b] - i (positions count "
                "from 0)", lambda w, n: _accuracy_to(w, n, lambda L, i: L - i)),
            Bug("the rows of padded outputs (i >= lengths[b]) are counted: only the first lengths[b] rows of "
                "each sequence count", lambda w, n: _accuracy_to(w, n, lambda L, i: L - 1 - i, all_rows=True)),
            Bug("that is the number of hits: divide it by the number of real outputs, sum(lengths)",
                lambda w, n: round(_alignment_accuracy(w, n) * int(n.sum()))),
            Bug("that is the fraction of misses: return the fraction of hits",
                lambda w, n: 1 - _alignment_accuracy(w, n))]
    return check("alignment_accuracy", fn, _alignment_accuracy, cases, bugs=bugs, adapt=as_float)


def _vanishing_ratio() -> float:
    """log10 of |d loss / d x_1| / |d loss / d x_20| for an untrained tanh RNN of spectral radius 0.5."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        rnn = nn.RNN(4, 16, batch_first=True)
    with torch.no_grad():
        w = rnn.weight_hh_l0
        w.mul_(0.5 / torch.linalg.eigvals(w).abs().max())  # spectral radius 0.5
    x = torch.randn(20, 4, generator=torch.Generator().manual_seed(1))
    norms = _input_gradient_norms(rnn, x)  # (20,)
    return math.log10(norms[0].item() / norms[-1].item())


def check_predict_vanishing(predicted) -> CheckResult:
    """Predict then measure: log10 |grad x_1| / |grad x_20| of a radius-0.5 tanh RNN (lesson 01)."""
    slips = [Slip("that looks like the ratio itself: the question asks for its log10 (a ratio of 1e-6 has "
                  "log10 -6)", lambda p, m: 0 < p < 0.01),
             Slip("a positive log10 says the first input gets MORE gradient than the last; at spectral radius "
                  "0.5 each step shrinks it", lambda p, m: p > 0),
             Slip("0 says the gradient does not change along the 19 steps; at radius 0.5 each step multiplies "
                  "it by about 0.5 or less", lambda p, m: p == 0),
             Slip("too much shrinking: about 0.5 per step (the spectral radius) over 19 steps is 0.5^19, a log10 "
                  "of about 19 * log10(0.5) = -5.7 (a factor of 10 per step would be -19)", lambda p, m: p < m),
             Slip("too little shrinking: each of the 19 steps multiplies the gradient by about the spectral "
                  "radius, 0.5, so the log10 is about 19 * log10(0.5) = -5.7 or below", lambda p, m: p > m)]
    return check_prediction("predict_vanishing", predicted, _vanishing_ratio,
                            "log10(|grad x_1| / |grad x_20|)", abs_tol=1.5, slips=slips)
