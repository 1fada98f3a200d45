"""Normalizers of the scatter ops: ScatterElements and ScatterND.

The axis is made non-negative and the reduction explicit ("none" before opset 16, which had none). Constant indices
are checked against the axes they index and made non-negative here; run-time ones are checked by the executor
before the kernel runs.
"""

from __future__ import annotations

import numpy as np

from tensorgen.graph.frontend.normalize import OnnxNode, gather_inputs, normalizer
from tensorgen.graph.ir import Node

REDUCTIONS = ("none", "add", "mul", "max", "min")


def _reduction(n: OnnxNode) -> str:
    reduction = str(n.attrs.get("reduction", "none"))
    if reduction not in REDUCTIONS:
        raise n.error(f"reduction {reduction!r} is not supported ({', '.join(REDUCTIONS)})")
    return reduction


@normalizer("ScatterElements")
def _scatter_elements(n: OnnxNode) -> Node:
    axis = n.axis(n.attrs["axis"], len(n.shape()))
    return n.make(attrs={"axis": axis, "reduction": _reduction(n)}, inputs=gather_inputs(n, axis))


@normalizer("ScatterND")
def _scatter_nd(n: OnnxNode) -> Node:
    inputs = list(n.inputs)
    indices, shape = n.const(1), n.shape()
    if indices is not None and indices.size:
        k = indices.shape[-1] if indices.ndim else 0
        if not 1 <= k <= len(shape):
            raise n.error(f"indices of shape {list(indices.shape)} must end in a dim of 1..{len(shape)} (data's rank)")
        dims = np.array(shape[:k], dtype=np.int64)
        if (indices < -dims).any() or (indices >= dims).any():
            raise n.error(f"indices {indices.min()}..{indices.max()} out of range for data of shape {list(shape)}")
        if indices.min() < 0:
            inputs[1] = n.constant("indices", np.where(indices < 0, indices + dims, indices).astype(indices.dtype))
    return n.make(attrs={"reduction": _reduction(n)}, inputs=inputs)
