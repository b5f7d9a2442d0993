"""helpers.lm against brute-force oracles: bits per character, add-k n-grams, windows, the training loop."""

import json
import math
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import lm
from helpers.gpt import GPT, GPTConfig


def _lively_gpt(V=7, max_len=8, seed=0):
    torch.manual_seed(seed)
    model = GPT(GPTConfig.tiny(V, max_len=max_len))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5)  # logits that really depend on the context
    return model.eval()


def _brute_bits(model, ids, block):
    """Every position i >= 1 from the tokens before it in its own window, one model call per position."""
    total = 0.0
    for i in range(1, len(ids)):
        start = (i - 1) // block * block  # the window that predicts position i begins here
        ctx = ids[start:i][None]
        logp = torch.log_softmax(model(ctx)[0, -1].double(), dim=-1)
        total -= logp[ids[i]].item()
    return total / (len(ids) - 1) / math.log(2)


@pytest.mark.parametrize("n, block, batch_size", [(17, 8, 32), (33, 8, 2), (9, 8, 1), (2, 8, 5), (20, 3, 4)])
def test_bits_per_char_scores_every_position_once(n, block, batch_size):
    model = _lively_gpt()
    ids = torch.randint(0, 7, (n,), generator=torch.Generator().manual_seed(n))
    got = lm.bits_per_char(model, ids, block=block, batch_size=batch_size)
    assert got == pytest.approx(_brute_bits(model, ids, block), rel=1e-5)


def test_bits_per_char_restores_train_mode_and_refuses_bad_input():
    model = _lively_gpt()
    model.train()
    lm.bits_per_char(model, torch.tensor([1, 2, 3]))
    assert model.training
    with pytest.raises(ValueError, match=r"ids\[2\] = 7 is not a token id of a vocabulary of size 7"):
        lm.bits_per_char(model, torch.tensor([1, 2, 7]))  # the last id is only a target, never an input
    with pytest.raises(ValueError, match="batch_size must be a positive"):
        lm.bits_per_char(model, torch.tensor([1, 2, 3]), batch_size=0)
    with pytest.raises(ValueError, match=r"block \(at most the model's context max_len=8\) must be an int in \[1, 8\]"):
        lm.bits_per_char(model, torch.tensor([1, 2, 3]), block=9)
    with pytest.raises(ValueError, match="at least 2 token ids"):
        lm.bits_per_char(model, torch.tensor([1]))
    with pytest.raises(ValueError, match="1-D integer tensor"):
        lm.bits_per_char(model, torch.tensor([1.0, 2.0]))


def _brute_ngram(train, evals, V, order, k):
    counts = [Counter(tuple(train[i:i + n]) for i in range(len(train) - n + 1)) for n in range(1, order + 1)]
    total = 0.0
    for i in range(1, len(evals)):
        c = min(order - 1, i)  # as many characters before position i as the model reads
        ctx = tuple(evals[i - c:i])
        n_ctx = sum(counts[c][ctx + (v,)] for v in range(V))
        total -= math.log2((counts[c][ctx + (evals[i],)] + k) / (n_ctx + k * V))
    return total / (len(evals) - 1)


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 5), st.integers(1, 3), st.sampled_from([0.01, 0.5, 1.0, 3.0]),
       st.lists(st.integers(0, 4), min_size=3, max_size=40), st.lists(st.integers(0, 4), min_size=2, max_size=12))
def test_ngram_equals_counting_by_hand(V, order, k, train, evals):
    train = [t % V for t in train]
    evals = [t % V for t in evals]
    got = lm.ngram_bits_per_char(torch.tensor(train), torch.tensor(evals), V, order, k)
    assert got == pytest.approx(_brute_ngram(train, evals, V, order, k), rel=1e-9)


def test_ngram_refuses_bad_input():
    a = torch.tensor([0, 1, 2, 1])
    with pytest.raises(ValueError, match=r"order \(1 unigram, 2 bigram, 3 trigram\) must be an int in \[1, 3\], got 4"):
        lm.ngram_bits_per_char(a, a, 3, 4)
    with pytest.raises(ValueError, match="k must be a positive finite number"):
        lm.ngram_bits_per_char(a, a, 3, 2, k=0)
    with pytest.raises(ValueError, match=r"eval_ids\[1\] = 5 is not a token id"):
        lm.ngram_bits_per_char(a, torch.tensor([0, 5]), 3, 2)


def test_best_k_is_the_minimum_over_the_grid():
    g = torch.Generator().manual_seed(0)
    train, valid = torch.randint(0, 6, (500,), generator=g), torch.randint(0, 6, (200,), generator=g)
    ks = (0.01, 0.1, 1.0, 10.0)
    k, bits = lm.best_k(train, valid, 6, 3, ks)
    scores = {kk: lm.ngram_bits_per_char(train, valid, 6, 3, kk) for kk in ks}
    assert bits == min(scores.values()) and scores[k] == bits


def test_windows():
    ids = torch.arange(100)
    x, y = lm.random_windows(ids, 10, 4, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (4, 10) and torch.equal(y, x + 1)
    x, y = lm.spaced_windows(ids, 10, 5)
    assert x[:, 0].tolist() == [0, 22, 44, 67, 89] and torch.equal(y, x + 1)  # the last window ends at id 99
    with pytest.raises(ValueError, match="at least 11 token ids"):
        lm.spaced_windows(torch.arange(10), 10, 2)
    with pytest.raises(ValueError, match=r"ids must be a 1-D integer tensor of at least 11 token ids, got \(10\)"):
        lm.random_windows(torch.arange(10), 10, 2)
    with pytest.raises(ValueError, match=r"ids must be a 1-D integer tensor .* got \(100\) torch.float32"):
        lm.random_windows(torch.arange(100.0), 10, 2)


@pytest.mark.parametrize("overrides", [{}, {"tie_weights": False}, {"n_kv_heads": 2}, {"n_kv_heads": 1}])
def test_parameter_count_equals_the_module(overrides):
    config = GPTConfig.tiny(13, **overrides)
    assert lm.parameter_count(config) == sum(p.numel() for p in GPT(config).parameters())


def test_cosine_factor():
    assert lm.cosine_factor(0, 100, 10) == pytest.approx(0.1)
    assert lm.cosine_factor(9, 100, 10) == pytest.approx(1.0)
    assert lm.cosine_factor(10, 100, 10) == pytest.approx(1.0)
    assert lm.cosine_factor(55, 100, 10) == pytest.approx(0.55)  # half way: half way between 1 and the floor
    assert lm.cosine_factor(100, 100, 10) == pytest.approx(0.1)


def test_train_lm_logs_and_learns():
    torch.manual_seed(0)
    model = GPT(GPTConfig.tiny(5, max_len=8))
    ids = torch.arange(400) % 5  # a cycle: perfectly predictable
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    x, y = lm.spaced_windows(ids, 8, 4)
    log = lm.train_lm(model, opt, sched, ids, 30, 8, torch.Generator().manual_seed(0), log_every=10,
                      evaluate=lambda m: {"valid_bits": lm.window_bits(m, x, y)}, progress=False)
    assert [e["step"] for e in log] == [0, 10, 20, 30]
    assert log[-1]["valid_bits"] < 0.5 * log[0]["valid_bits"]
    assert "train_loss_bits" in log[1] and "train_loss_bits" not in log[0]
    with pytest.raises(ValueError, match="batch_size=8 must split evenly over world_size=3"):
        lm.train_lm(model, opt, sched, ids, 1, 8, None, world_size=3, progress=False)


def test_load_training_log_checks_its_sha256(tmp_path):
    import hashlib

    from helpers.data import DataFileError

    body = json.dumps({"log": [{"step": 0}]}) + "\n"
    (tmp_path / lm.LOG_FILE).write_text(body)
    sha = hashlib.sha256(body.encode()).hexdigest()
    (tmp_path / "README.md").write_text(f"| `{lm.LOG_FILE}` | 1 | {len(body)} | `{sha}` |\n")
    assert lm.load_training_log(tmp_path) == {"log": [{"step": 0}]}
    (tmp_path / lm.LOG_FILE).write_text(body.replace("0", "1"))
    with pytest.raises(DataFileError, match="make train-gpt writes the checkpoint and its log"):
        lm.load_training_log(tmp_path)


def test_the_course_checkpoint_reaches_2_25_bits_on_the_whole_test_split():
    """The shipped model, scored on every character of test: at most 2.25 bits per character, more than half a
    bit below the best trigram."""
    from helpers.data import Vocab, load_text
    from helpers.gpt import load_course_gpt

    model, vocab = load_course_gpt()
    train_text = load_text("train")
    assert vocab.itos == Vocab(train_text).itos
    ids = {s: torch.tensor(vocab.encode(load_text(s))) for s in ("valid", "test")}
    train_ids = torch.tensor(vocab.encode(train_text))
    k, _ = lm.best_k(train_ids, ids["valid"], len(vocab), 3, (0.03, 0.1, 0.3, 1.0))
    trigram = lm.ngram_bits_per_char(train_ids, ids["test"], len(vocab), 3, k)
    bits = lm.bits_per_char(model, ids["test"])
    assert bits <= 2.25 and bits < trigram - 0.5, (bits, trigram)
    log = lm.load_training_log()
    assert log["final"]["test_bits"] == pytest.approx(bits, abs=1e-3)  # the log's figure is this model's
    assert [e["step"] for e in log["log"]] == list(range(0, log["recipe"]["steps"] + 1, log["recipe"]["log_every"]))
