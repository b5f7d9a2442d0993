"""Shared pytest settings: float64 oracles and a deterministic hypothesis profile."""

import torch
from hypothesis import settings

settings.register_profile("course", max_examples=40, deadline=None, derandomize=True)
settings.load_profile("course")


def pytest_configure(config):
    torch.set_num_threads(max(1, torch.get_num_threads()))
