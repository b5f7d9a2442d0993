"""helpers.train: the loop (threads, scheduler, clipping, NaN guard), sequence_loss and the accuracies."""

import pytest
import torch
import torch.nn.functional as F

from helpers.train import exact_match, sequence_loss, token_accuracy, train


def _run(threads_seen, **kwargs):
    w = torch.zeros(3, requires_grad=True)
    optimizer = torch.optim.SGD([w], lr=0.1)

    def loss_fn(batch):
        threads_seen.append(torch.get_num_threads())
        return ((w - batch) ** 2).sum()

    return train(loss_fn, optimizer, lambda step: torch.ones(3), steps=3, **kwargs), w


@pytest.mark.parametrize("threads", [1, 2])
def test_train_uses_the_thread_count_and_restores_it(threads):
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        seen = []
        history, w = _run(seen, threads=threads)
        assert seen == [threads] * 3
        assert torch.get_num_threads() == 3
        assert history[0] > history[-1] and w.detach().gt(0).all()
    finally:
        torch.set_num_threads(before)


def test_train_default_is_one_thread_and_none_keeps_the_setting():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        seen_default, seen_none = [], []
        _run(seen_default)
        _run(seen_none, threads=None)
        assert seen_default == [1] * 3 and seen_none == [2] * 3
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_train_rejects_bad_thread_counts(bad):
    with pytest.raises(ValueError, match="CPU threads"):
        _run([], threads=bad)


# --- what the loop does: scheduler, clipping, the NaN guard ---------------------------------------

def _sgd_problem(lr=0.1):
    w = torch.zeros(3, requires_grad=True)
    return w, torch.optim.SGD([w], lr=lr)


def test_train_steps_the_scheduler_once_per_step():
    w, optimizer = _sgd_problem(lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    lrs = []

    def loss_fn(batch):
        lrs.append(optimizer.param_groups[0]["lr"])
        return ((w - batch) ** 2).sum()

    train(loss_fn, optimizer, lambda step: torch.ones(3), steps=3, scheduler=scheduler)
    assert lrs == pytest.approx([0.1, 0.05, 0.025])
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.0125)


@pytest.mark.parametrize("clip", [1.0, 0.25, None])
def test_train_clips_the_gradient_norm(clip):
    w, optimizer = _sgd_problem(lr=1.0)
    direction = torch.tensor([3.0, 4.0, 0.0])  # the gradient of the loss below is 10 * direction: norm 50

    train(lambda batch: 10 * (w * batch).sum(), optimizer, lambda step: direction, steps=1, clip_grad_norm=clip)
    # one SGD step with lr=1 moves w by minus the (clipped) gradient
    expected = 50.0 if clip is None else clip
    assert w.detach().norm().item() == pytest.approx(expected, rel=1e-5)
    assert torch.allclose(w.detach() / w.detach().norm(), -direction / 5)  # clipping keeps the direction


def test_train_stops_at_a_nan_loss_before_it_reaches_the_weights():
    w, optimizer = _sgd_problem()

    def loss_fn(batch):
        return ((w - batch) ** 2).sum()

    batches = [torch.ones(3), torch.full((3,), float("nan"))]
    with pytest.raises(FloatingPointError, match=r"loss became nan at step 1"):
        train(loss_fn, optimizer, lambda step: batches[step], steps=2)
    assert torch.isfinite(w).all() and w.detach().gt(0).all()  # step 0 was taken, the nan step was not


# --- sequence_loss, token_accuracy, exact_match ----------------------------------------------------

def test_sequence_loss_is_cross_entropy_over_the_non_pad_tokens_only():
    logits = torch.randn(2, 4, 6, generator=torch.Generator().manual_seed(0))
    targets = torch.tensor([[3, 4, 0, 0], [5, 1, 2, 0]])  # pad_id 0 at the ends
    keep = targets != 0
    expected = F.cross_entropy(logits[keep], targets[keep])  # (5, V), (5,)
    assert sequence_loss(logits, targets, pad_id=0).item() == pytest.approx(expected.item(), rel=1e-6)
    everything = F.cross_entropy(logits.reshape(-1, 6), targets.reshape(-1))
    assert sequence_loss(logits, targets).item() == pytest.approx(everything.item(), rel=1e-6)
    assert abs(expected.item() - everything.item()) > 0.05  # the two differ, so the test tells them apart


def test_sequence_loss_rejects_ids_outside_the_vocabulary_and_all_pad_batches():
    logits = torch.zeros(2, 3, 5)
    with pytest.raises(ValueError, match=r"targets\[1, 2\] = 5 is not a token id: logits have V=5 classes"):
        sequence_loss(logits, torch.tensor([[1, 2, 0], [3, 4, 5]]), pad_id=0)
    with pytest.raises(ValueError, match=r"targets\[0, 1\] = -1 is not a token id"):
        sequence_loss(logits, torch.tensor([[1, -1, 0], [3, 4, 0]]), pad_id=0)
    with pytest.raises(ValueError, match=r"every target is pad_id=0: there is no token"):
        sequence_loss(logits, torch.zeros(2, 3, dtype=torch.long), pad_id=0)
    with pytest.raises(ValueError, match=r"every target is pad_id=-100"):
        sequence_loss(torch.zeros(0, 3, 5), torch.zeros(0, 3, dtype=torch.long))
    # a pad id above V - 1 is skipped, not an error: only the ids that are counted must be classes
    assert sequence_loss(logits, torch.tensor([[1, 2, 9], [3, 4, 9]]), pad_id=9).item() == pytest.approx(
        torch.tensor(5.0).log().item())


def test_token_accuracy_ignores_pad_positions():
    target = torch.tensor([[3, 4, 0, 0], [5, 6, 7, 0]])
    pred = torch.tensor([[3, 9, 1, 1], [5, 6, 7, 2]])  # 4 of the 5 real tokens right; every pad slot wrong
    assert token_accuracy(pred, target, pad_id=0) == pytest.approx(4 / 5)
    assert token_accuracy(pred, target) == pytest.approx(4 / 8)  # without pad_id every position counts


def test_exact_match_needs_every_non_pad_token_of_a_row():
    target = torch.tensor([[3, 4, 0], [5, 6, 7], [8, 0, 0]])
    pred = torch.tensor([[3, 4, 9], [5, 1, 7], [2, 0, 0]])  # row 0 right but for a pad slot; rows 1, 2 wrong
    assert exact_match(pred, target, pad_id=0) == pytest.approx(1 / 3)
    assert exact_match(pred, target) == 0.0  # without pad_id row 0's pad slot counts too
    assert exact_match(target, target, pad_id=0) == 1.0
    with pytest.raises(ValueError, match=r"B >= 1 sequences, got \(0, 3\)"):
        exact_match(target[:0], target[:0])
