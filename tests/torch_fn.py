"""A function of tensors as a torch.nn.Module, for tests that compile PyTorch code through tensorgen and compare it
with eager PyTorch (tests/graph/test_ops_*.py, test_torch_indexing.py)."""

from __future__ import annotations

from collections.abc import Callable

import torch


class Fn(torch.nn.Module):
    def __init__(self, fn: Callable[..., object]):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)
