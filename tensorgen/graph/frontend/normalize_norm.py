"""Normalizers that write one ONNX normalization op as several IR nodes of ops tensorgen already has:
LpNormalization (a norm reduction, then a division); and LRN's checks."""

from __future__ import annotations

import numpy as np

from tensorgen.graph.frontend.normalize import OnnxNode, normalizer
from tensorgen.graph.ir import Node


@normalizer("LpNormalization")
def _lp_normalization(n: OnnxNode) -> list[Node]:
    """x / max(||x||_p, tiny) along `axis`, p 1 or 2: ReduceL1/ReduceL2 (keepdims), Max, Div. The floor at the
    smallest normal number makes a zero vector 0 rather than 0/0, as ONNX Runtime gives it."""
    p = int(n.attrs["p"])
    if p not in (1, 2):
        raise n.error(f"p={p} is not supported (1 or 2)")
    shape, x = n.shape(), n.inputs[0]
    axis = n.axis(n.attrs["axis"], len(shape))
    norm_shape = tuple(1 if d == axis else size for d, size in enumerate(shape))
    norm, floored = n.temp("norm", norm_shape), n.temp("norm_floored", norm_shape)
    tiny = n.constant("tiny", np.array(np.finfo(n.out().dtype).tiny, n.out().dtype))
    return [Node(f"ReduceL{p}", f"{n.name}_norm", [x], [norm], {"axes": (axis,), "keepdims": 1}),
            Node("Max", f"{n.name}_floor", [norm, tiny], [floored]),
            n.make("Div", inputs=[x, floored])]


@normalizer("LRN")
def _lrn(n: OnnxNode) -> Node:
    size = n.attrs.get("size")
    if size is None or int(size) < 1:
        raise n.error(f"size={size} must be a positive number of channels")
    if len(n.shape()) < 3:
        raise n.error(f"input {list(n.shape())} is not (N, C, D1, ...)")
    return n.make(attrs={"size": int(size), **{k: float(n.attrs[k]) for k in ("alpha", "beta", "bias")}})
