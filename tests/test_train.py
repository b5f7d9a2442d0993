"""helpers.train.train runs small models on one CPU thread (the course's policy) and restores torch's setting."""

import pytest
import torch

from helpers.train import train


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
