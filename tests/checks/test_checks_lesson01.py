"""Lesson 01's checks: right answers pass with the stored line, stubs say so, wrong answers are named."""

import numpy as np
import torch

from helpers.checks import (
    check_additive_scores,
    check_alignment_accuracy,
    check_attention_read,
    check_input_gradient_norms,
    check_predict_vanishing,
)


def additive_scores(s, h, W, U, b, v):
    return torch.tanh((s @ W.T)[:, None, :] + h @ U.T + b) @ v


def test_additive_scores(accepts, rejects):
    accepts(check_additive_scores, additive_scores, "✓ additive_scores: matches the reference on all 3 cases")
    rejects(check_additive_scores, lambda *a: None, "not implemented yet")
    rejects(check_additive_scores, lambda s, h, W, U, b, v: ((s @ W.T)[:, None, :] + h @ U.T + b) @ v,
            "the tanh is missing")
    rejects(check_additive_scores, lambda s, h, W, U, b, v: torch.tanh((s @ W.T)[:, None, :] + h @ W.T + b) @ v,
            "✗ additive_scores: on B=1, S=3, all widths 4: values differ")
    rejects(check_additive_scores, lambda s, h, W, U, b, v: torch.tanh(s @ W.T + h[:, -1] @ U.T + b) @ v, "shape")
    rejects(check_additive_scores, lambda s, h, W, U, b, v: additive_scores(s, h, W, U, b, v).numpy(),
            "return a torch.Tensor")

    def scribbles(s, h, W, U, b, v):
        out = additive_scores(s, h, W, U, b, v)
        h.zero_()
        return out
    rejects(check_additive_scores, scribbles, "in place")


def attention_read(scores, h, mask):
    w = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return (w[:, None] @ h)[:, 0], w


def test_attention_read(accepts, rejects):
    accepts(check_attention_read, attention_read, "✓ attention_read: matches the reference on all 4 cases")
    rejects(check_attention_read, lambda *a: None, "not implemented yet")

    def ignores_mask(scores, h, mask):
        w = torch.softmax(scores, dim=-1)
        return (w[:, None] @ h)[:, 0], w
    rejects(check_attention_read, ignores_mask, "✗ attention_read: on row 1 has 2 padded positions")

    def naive_exp(scores, h, mask):
        e = torch.exp(scores) * mask
        w = e / e.sum(-1, keepdim=True)
        return (w[:, None] @ h)[:, 0], w
    rejects(check_attention_read, naive_exp, "✗ attention_read: on scores of size 1e3")
    rejects(check_attention_read, lambda s, h, m: attention_read(s, h, ~m), "polarity is flipped")

    def fills_in_place(scores, h, mask):  # masked_fill_ writes -inf into the learner's scores
        w = torch.softmax(scores.masked_fill_(~mask, float("-inf")), dim=-1)
        return (w[:, None] @ h)[:, 0], w
    rejects(check_attention_read, fills_in_place, "in place")
    rejects(check_attention_read, lambda s, h, m: attention_read(s, h, m)[0], "yours returns the context alone")

    def squeezes(scores, h, mask):  # squeeze() also drops the batch axis when B = 1
        w = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        return (w[:, None] @ h).squeeze(), w
    rejects(check_attention_read, squeezes, "✗ attention_read: on B=1, S=4")


def input_gradient_norms(rnn, x):
    x = x.clone().requires_grad_(True)
    out, _ = rnn(x[None])
    out[0, -1].sum().backward()
    return x.grad.norm(dim=-1)


def test_input_gradient_norms(accepts, rejects):
    state = torch.random.get_rng_state()
    accepts(check_input_gradient_norms, input_gradient_norms,
            "✓ input_gradient_norms: matches the reference on all 2 cases")
    assert torch.equal(torch.random.get_rng_state(), state), "the check must not reseed the learner's RNG"
    rejects(check_input_gradient_norms, lambda rnn, x: None, "not implemented yet")

    def all_outputs(rnn, x):  # the loss reads every state, so nothing vanishes
        x = x.clone().requires_grad_(True)
        rnn(x[None])[0].sum().backward()
        return x.grad.norm(dim=-1)
    rejects(check_input_gradient_norms, all_outputs, "only the last state")

    def first_state(rnn, x):
        x = x.clone().requires_grad_(True)
        rnn(x[None])[0][0, 0].sum().backward()
        return x.grad.norm(dim=-1)
    rejects(check_input_gradient_norms, first_state, "✗ input_gradient_norms: on an RNN(3 -> 8)")

    def retrains(rnn, x):  # changes the module's weights
        with torch.no_grad():
            rnn.weight_hh_l0.mul_(0.5)
        return input_gradient_norms(rnn, x)
    rejects(check_input_gradient_norms, retrains, "changed the parameters of the module")
    rejects(check_input_gradient_norms, lambda rnn, x: input_gradient_norms(rnn, x).double(),
            "return dtype torch.float32")


def alignment_accuracy(weights, lengths):
    hits = sum((weights[b, :n].argmax(-1) == torch.arange(n - 1, -1, -1)).sum().item()
               for b, n in enumerate(lengths.tolist()))
    return hits / lengths.sum().item()


def test_alignment_accuracy(accepts, rejects):
    accepts(check_alignment_accuracy, alignment_accuracy, "✓ alignment_accuracy: matches the reference on all 4 cases")
    accepts(check_alignment_accuracy, lambda w, n: torch.tensor(alignment_accuracy(w, n)))
    rejects(check_alignment_accuracy, lambda w, n: None, "not implemented yet")

    def counts_padded_rows(weights, lengths):  # every one of the T rows counts
        T = weights.shape[1]
        hits = sum((weights[b].argmax(-1) == torch.arange(n - 1, n - 1 - T, -1)).sum().item()
                   for b, n in enumerate(lengths.tolist()))
        return hits / (T * len(lengths))
    rejects(check_alignment_accuracy, counts_padded_rows,
            "✗ alignment_accuracy: on perfect reversals of lengths 3 and 5")

    def mean_of_means(weights, lengths):
        return sum(alignment_accuracy(weights[b:b + 1], lengths[b:b + 1]) for b in range(len(lengths))) / len(lengths)
    rejects(check_alignment_accuracy, mean_of_means, "mean of the sequences' accuracies")
    rejects(check_alignment_accuracy, lambda w, n: [alignment_accuracy(w, n)], "return a number")
    rejects(check_alignment_accuracy, lambda w, n: True, "return a number")
    accepts(check_alignment_accuracy, lambda w, n: np.float32(alignment_accuracy(w, n)))  # a numpy scalar

    def in_numpy(weights, lengths):  # correct, all in numpy: returns np.float32
        w, hits = weights.numpy(), []
        for b, n in enumerate(lengths.tolist()):
            hits.append((w[b, :n].argmax(-1) == np.arange(n - 1, -1, -1)).astype(np.float32))
        return np.concatenate(hits).mean()
    accepts(check_alignment_accuracy, in_numpy)

    def from_padded_width(weights, lengths):  # targets counted back from S, not from each length
        S = weights.shape[-1]
        hits = sum((weights[b, :n].argmax(-1) == torch.arange(S - 1, S - 1 - n, -1)).sum().item()
                   for b, n in enumerate(lengths.tolist()))
        return hits / lengths.sum().item()
    rejects(check_alignment_accuracy, from_padded_width, "not from the padded width S")

    def identity_alignment(weights, lengths):  # checks the diagonal, not the reversal
        hits = sum((weights[b, :n].argmax(-1) == torch.arange(n)).sum().item() for b, n in enumerate(lengths.tolist()))
        return hits / lengths.sum().item()
    rejects(check_alignment_accuracy, identity_alignment, "✗ alignment_accuracy: on one perfect reversal")


def test_predict_vanishing(verdict):
    ok, line = verdict(check_predict_vanishing, None)
    assert not ok and line.startswith("… predict_vanishing")
    ok, line = verdict(check_predict_vanishing, 19 * torch.log10(torch.tensor(0.5)).item())  # radius^19 alone
    assert ok and line.startswith("✓ predict_vanishing: you predicted -5.72; the measured")
    ok, line = verdict(check_predict_vanishing, 0.0)  # "nothing vanishes"
    assert not ok and line.startswith("✗ predict_vanishing") and "does not change along the 19 steps" in line
    for slip, words in ((2e-6, "looks like the ratio itself"), (6.0, "a positive log10"), (-19.0, "too much shrinking"),
                        (-1.0, "too little shrinking")):
        ok, line = verdict(check_predict_vanishing, slip)
        assert not ok and words in line, line
