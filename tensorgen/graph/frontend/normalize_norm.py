"""Normalizers that write one ONNX normalization op as several IR nodes of ops tensorgen already has:
LpNormalization (a norm reduction, then a division), GroupNormalization (InstanceNormalization of the input viewed
as groups), MeanVarianceNormalization (mean and deviation reductions); and LRN's checks."""

from __future__ import annotations

import numpy as np

from tensorgen.graph.frontend.normalize import OnnxNode, Steps, normalizer
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
    tiny = n.constant("tiny", np.array(np.finfo(n.out().dtype).tiny, n.out().dtype))
    step = Steps(n)
    norm = step("norm", f"ReduceL{p}", [x], norm_shape, axes=(axis,), keepdims=1)
    return step.last("Div", [x, step("floor", "Max", [norm, tiny], norm_shape)])


@normalizer("LRN")
def _lrn(n: OnnxNode) -> Node:
    size = n.attrs.get("size")
    if size is None or int(size) < 1:
        raise n.error(f"size={size} must be a positive number of channels")
    if len(n.shape()) < 3:
        raise n.error(f"input {list(n.shape())} is not (N, C, D1, ...)")
    return n.make(attrs={"size": int(size), **{k: float(n.attrs[k]) for k in ("alpha", "beta", "bias")}})


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
    step = Steps(n)
    flat_shape = (shape[0], groups, int(np.prod(shape[1:])) // groups)
    flat = step("groups", "Reshape", [n.inputs[0]], flat_shape, shape=flat_shape)
    affine = [n.inputs[1], n.inputs[2]]
    if per_channel:
        affine = [n.constant(name, np.full(groups, fill, dtype)) for name, fill in (("unit_scale", 1), ("zero", 0))]
    normed = step("instance", "InstanceNormalization", [flat, *affine], flat_shape, epsilon=float(n.attrs["epsilon"]))
    if not per_channel:
        return step.last("Reshape", [normed], shape=shape)
    out = step("normalized", "Reshape", [normed], shape, shape=shape)
    column = (shape[1], *(1,) * (len(shape) - 2))
    scale, bias = (step(what, "Reshape", [n.inputs[i]], column, shape=column)
                   for i, what in ((1, "scale"), (2, "bias")))
    return step.last("Add", [step("scaled", "Mul", [out, scale], shape), bias])


@normalizer("MeanVarianceNormalization")
def _mean_variance_normalization(n: OnnxNode) -> list[Node]:
    """(x - mean) / (sqrt(variance) + 1e-9) over `axes` (default 0, 2, 3), as ONNX's function body has it: ReduceMean,
    Sub, Mul, ReduceMean, Sqrt, Add, Div; the variance as the mean squared deviation (never negative)."""
    shape, x = n.shape(), n.inputs[0]
    axes = n.axes(n.attrs["axes"], len(shape))
    stat = tuple(1 if d in axes else size for d, size in enumerate(shape))
    reduce = {"axes": axes, "keepdims": 1}
    eps = n.constant("epsilon", np.array(1e-9, n.out().dtype))
    step = Steps(n)
    mean = step("mean", "ReduceMean", [x], stat, **reduce)
    dev = step("dev", "Sub", [x, mean], shape)
    var = step("var", "ReduceMean", [step("square", "Mul", [dev, dev], shape)], stat, **reduce)
    return step.last("Div", [dev, step("den", "Add", [step("std", "Sqrt", [var], stat), eps], stat)])
