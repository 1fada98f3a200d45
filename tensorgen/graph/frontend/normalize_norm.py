"""Normalizers that write one ONNX normalization op as several IR nodes of ops tensorgen already has:
LpNormalization (a norm reduction, then a division), GroupNormalization (InstanceNormalization of the input viewed
as groups), MeanVarianceNormalization (mean and deviation reductions); and LRN's checks."""

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


def _reshape(n: OnnxNode, x: str, shape: tuple[int, ...], suffix: str) -> tuple[Node, str]:
    out = n.temp(suffix, shape)
    return Node("Reshape", f"{n.name}_{suffix}", [x], [out], {"shape": shape}), out


@normalizer("GroupNormalization")
def _group_normalization(n: OnnxNode) -> list[Node]:
    """The input viewed as (N, groups, rest), InstanceNormalization of that (each group's statistics), viewed back.
    Opset 18's scale and bias are per group: they are the InstanceNormalization's. Opset 21's (the version with
    stash_type) are per channel: a unit InstanceNormalization, then Mul and Add by them as (C, 1, ...)."""
    shape, dtype = n.shape(), n.out().dtype
    groups = int(n.attrs["num_groups"])
    if len(shape) < 2 or groups < 1 or shape[1] % groups:
        raise n.error(f"num_groups={groups} does not divide the channels of input {list(shape)}")
    per_channel = "stash_type" in n.attrs  # an attribute from opset 21, where scale and bias became per channel
    want = shape[1] if per_channel else groups
    for i in (1, 2):
        if n.shape(i) != (want,):
            raise n.error(f"{'scale' if i == 1 else 'bias'} {list(n.shape(i))} must be ({want},): one per "
                          f"{'channel' if per_channel else 'group'} at this opset")
    nodes: list[Node] = []
    flat_shape = (shape[0], groups, int(np.prod(shape[1:])) // groups)
    view, flat = _reshape(n, n.inputs[0], flat_shape, "groups")
    nodes.append(view)
    affine = [n.inputs[1], n.inputs[2]]
    if per_channel:
        affine = [n.constant(name, np.full(groups, fill, dtype)) for name, fill in (("unit_scale", 1), ("zero", 0))]
    normed = n.temp("normed", flat_shape)
    nodes.append(Node("InstanceNormalization", f"{n.name}_instance", [flat, *affine], [normed],
                      {"epsilon": float(n.attrs["epsilon"])}))
    if not per_channel:
        return [*nodes, n.make("Reshape", {"shape": shape}, [normed])]
    back, out = _reshape(n, normed, shape, "normalized")
    column = (shape[1], *(1,) * (len(shape) - 2))
    scale_view, scale = _reshape(n, n.inputs[1], column, "scale")
    bias_view, bias = _reshape(n, n.inputs[2], column, "bias")
    scaled = n.temp("scaled", shape)
    return [*nodes, back, scale_view, bias_view, Node("Mul", f"{n.name}_scale", [out, scale], [scaled]),
            n.make("Add", inputs=[scaled, bias])]


@normalizer("MeanVarianceNormalization")
def _mean_variance_normalization(n: OnnxNode) -> list[Node]:
    """(x - mean) / (sqrt(variance) + 1e-9) over `axes` (default 0, 2, 3), as ONNX's function body has it: ReduceMean,
    Sub, Mul, ReduceMean, Sqrt, Add, Div; the variance as the mean squared deviation (never negative)."""
    shape, x = n.shape(), n.inputs[0]
    axes = n.axes(n.attrs["axes"], len(shape))
    stat = tuple(1 if d in axes else size for d, size in enumerate(shape))
    reduce = {"axes": axes, "keepdims": 1}
    eps = n.constant("epsilon", np.array(1e-9, n.out().dtype))
    nodes: list[Node] = []

    def step(suffix: str, op: str, inputs: list[str], attrs: dict | None = None, full: bool = False) -> str:
        out = n.temp(suffix, shape if full else stat)
        nodes.append(Node(op, f"{n.name}_{suffix}", inputs, [out], attrs or {}))
        return out

    mean = step("mean", "ReduceMean", [x], reduce)
    dev = step("dev", "Sub", [x, mean], full=True)
    var = step("var", "ReduceMean", [step("square", "Mul", [dev, dev], full=True)], reduce)
    den = step("den", "Add", [step("std", "Sqrt", [var]), eps])
    return [*nodes, n.make("Div", inputs=[dev, den])]
