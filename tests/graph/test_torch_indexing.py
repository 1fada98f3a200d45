"""PyTorch's advanced indexing and writes into views, as torch.export leaves them (aten.index with several index
tensors, diagonal, copy + select_scatter / slice_scatter), tensor bounds of clamp and arithmetic on bool masks:
compiled and compared with eager PyTorch."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch_fn import Fn  # noqa: E402

import tensorgen  # noqa: E402
from tensorgen.dynamo import compile_graph  # noqa: E402
from tensorgen.graph.ir import GraphError  # noqa: E402

F = torch.nn.functional



def _assign(x):
    y = x.clone()
    y[:, 0] = 0  # select_scatter of a broadcast scalar
    y[..., 1:4:2] = y[..., 1:4:2] * 2  # slice_scatter with a step
    y[1, :, -1] = x[0, :, 0]  # a tensor into a doubly selected view
    return y


def _into_zeros(x):
    z = torch.zeros(2, 5, 6)
    z[:, 1:4, :4] = x
    return z


def _runtime_pair(x):
    rows = x[0].argmax(-1)  # (3,) in [0, 4): run-time indices
    cols = x[1].argmin(-1) - 4  # negative ones
    return x[:, rows, cols] + x[1][rows, cols.flip(0)]


CASES = {
    "assignments": _assign,
    "assign_into_a_zero_buffer": _into_zeros,
    "circular_pad": lambda x: F.pad(x.reshape(1, 2, 3, 4), (1, 2, 2, 1), mode="circular"),
    "unfold": lambda x: F.unfold(x.reshape(1, 2, 3, 4), 2),
    "bicubic_upsampling": lambda x: F.interpolate(x.reshape(1, 2, 3, 4), scale_factor=2, mode="bicubic"),
    "constant_index_pairs": lambda x: x[:, [0, 2, -1], [1, -1, 0]] + x[[1, 0], :, [3, 2]].sum(),
    "run_time_index_pairs": _runtime_pair,
    "separated_index_tensors": lambda x: x[torch.tensor([[1], [0]]), :, torch.tensor([0, 3, 2])],
    "diagonals": lambda x: torch.diagonal(x, 1, 1, 2).sum(-1) + torch.diagonal(x, -1, -1, -2).sum(-1) +
    torch.diagonal(x[0]).sum(),
    "clamp_by_tensors": lambda x: torch.clamp(x, min=x.mean(-1, keepdim=True), max=x.amax(-1, keepdim=True) * 0.5) +
    torch.clamp_min(x, x[:, :1]) + torch.clamp(x, max=x.flip(0)),
    "arithmetic_on_masks": lambda x: ((x > 0) * (x < 1) + (x < -1)).float() + torch.logaddexp(x, x * 2),
    # FocalNet's pooler: a mean keeping its axes, restrided with size-1 axes' strides arbitrary (a Reshape)
    "as_strided_restride": lambda x: torch.as_strided(x.mean(-1, keepdim=True), (2, 3, 1), (3, 1, 7)),
    "as_strided_windows": lambda x: torch.as_strided(x * 2, (5, 4), (4, 1), 2) +
    torch.as_strided(x + 1, (4, 5), (1, 3)).T,
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_indexing_and_writes_equal_eager(name):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4)
    module = Fn(CASES[name]).eval()
    want = module(x)
    got = compile_graph(tensorgen.from_torch(module, (x,))).run([x.numpy()])[0]
    assert got.shape == tuple(want.shape)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-5)


def test_as_strided_on_a_view_into_another_storage_is_one_line():
    with pytest.raises(GraphError, match=r"aten\.as_strided .*a view into another tensor's storage"):
        tensorgen.from_torch(Fn(lambda x: torch.as_strided(x.transpose(0, 2), (4, 3), (1, 4))).eval(),
                             (torch.randn(2, 3, 4),))


def test_a_constant_index_out_of_range_is_one_line():
    with pytest.raises(GraphError, match=r"aten\.index .*: an index is outside \[-4, 4\)"):
        tensorgen.from_torch(Fn(lambda x: x[:, [0, 1], [3, 5]]).eval(), (torch.randn(2, 3, 4),))


def test_reading_pooling_indices_is_one_line_naming_the_reader():
    def pooled(x):
        values, indices = F.max_pool2d(x.reshape(1, 2, 3, 4), 2, return_indices=True)
        return values + indices.float()

    with pytest.raises(GraphError, match=r"aten\._to_copy .*reads an output tensorgen does not compute"):
        tensorgen.from_torch(Fn(pooled).eval(), (torch.randn(2, 3, 4),))
