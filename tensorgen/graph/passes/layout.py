"""Channels-last rewrite of a channels-first (ONNX) model for the CPU kernels.

ONNX convolutions are NCHW: the only contiguous axis of a conv's output is its width, which is 7 or
14 in the deep layers of a ResNet, so a vectorized, register-tiled kernel has little to work with
(C2D 14x14 256->256 3x3, 64 trials: 16.5 GFLOP/s NCHW against 79 NHWC on the same machine). In NHWC
the channels are innermost: 64-2048 of them, a natural vector and register-tile axis (ALT's point:
the data layout is part of the schedule).

`to_channels_last` walks the graph once in topological order:
- every Conv with a constant weight reads an NHWC (N-d: channels last) input and writes an NHWC output,
  with its weight repacked at compile time to (kernel..., C/group, M); so does a 2-D ConvTranspose
  without groups or dilation (weight (C, kh * kw * M) for col2im, else (kh, kw, C, M));
- an element-wise node whose tensor inputs all exist channels-last runs channels-last too (its
  constants are permuted to match), so bias adds, activations and residual adds stay in that layout;
- a Concat over the channel axis of such inputs concatenates over the last axis, and a pool or an LRN over
  such an input runs channels-last.
- the model's own Transposes between the two layouts are absorbed (a permute to channels-first of a value that is
  channels-last makes that value a twin; a permute to channels-last of a value with a twin is the twin).
Each rewritten node's channels-first result is still defined by a Transpose, so every other reader
(pools, reshapes, graph outputs) sees the value it saw before; the Transposes nobody reads are then
removed, and Transpose pairs that cancel are removed by the reshape/transpose simplification.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from tensorgen.graph.frontend.normalize import add_constant
from tensorgen.graph.ir import TENSOR_DTYPES, Graph, Node, Value
from tensorgen.graph.ops import op_kind
from tensorgen.graph.passes import eliminate_dead_code, remove_noops, simplify_reshapes
from tensorgen.te.ops.conv import gathers, plain_transpose

#: the layout attribute a channels-last Conv carries, by spatial rank
CHANNELS_LAST = {1: "NWC", 2: "NHWC", 3: "NDHWC"}
#: ops over the channel axis or the spatial ones that run channels-last given attribute `layout`
POOLS = frozenset({"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LRN"})


def to_last(rank: int) -> tuple[int, ...]:
    return (0, *range(2, rank), 1)


def to_first(rank: int) -> tuple[int, ...]:
    return (0, rank - 1, *range(1, rank - 1))


def _layout_free(node: Node) -> bool:
    """Element-wise ops (broadcasting, no axis attribute): they commute with any transpose."""
    return node.op != "BatchNormalization" and op_kind(node) == "elemwise"


class _Rewriter:
    def __init__(self, graph: Graph):
        self.g = graph.copy()
        self.last: dict[str, str] = {}  # channels-first value -> its channels-last twin
        self.nodes: list[Node] = []

    def value(self, base: str, shape: tuple[int, ...], dtype: str) -> str:
        name, k = base, 0
        while name in self.g.values:
            k += 1
            name = f"{base}_{k}"
        self.g.values[name] = Value(name, shape, dtype)
        return name

    def twin(self, name: str) -> str:
        """A new value: `name`'s data with the channels last."""
        v = self.g.value(name)
        return self.value(f"{name}_cl", tuple(v.shape[p] for p in to_last(len(v.shape))), v.dtype)

    def channels_last(self, name: str) -> str:
        """The channels-last twin of `name`, made by a Transpose if there is none yet."""
        if name not in self.last:
            twin = self.twin(name)
            perm = to_last(len(self.g.value(name).shape))
            self.nodes.append(Node("Transpose", f"{name}_to_channels_last", [name], [twin], {"perm": perm}))
            self.last[name] = twin
        return self.last[name]

    def emit_channels_last(self, node: Node, inputs: list[str], attrs: dict) -> None:
        """`node` over channels-last `inputs`; its channels-first outputs come from Transposes."""
        outputs = [self.twin(out) for out in node.outputs]
        self.nodes.append(replace(node, inputs=inputs, outputs=outputs, attrs=attrs))
        for out, twin in zip(node.outputs, outputs):
            shape = self.g.value(out).shape
            perm = to_first(len(shape))
            moved = [p for p, d in zip(perm, shape) if d != 1]
            if moved == sorted(moved):  # only axes of size 1 move, (1, 1, 1, C): the same memory
                back = Node("Reshape", f"{out}_to_channels_first", [twin], [out], {"shape": shape})
            else:  # not when the sizes merely look alike: (1, 16, 16, 16) is a real transpose
                back = Node("Transpose", f"{out}_to_channels_first", [twin], [out], {"perm": perm})
            self.nodes.append(back)
            self.last[out] = twin

    def constant(self, name: str, array: np.ndarray) -> str:
        return add_constant(self.g.values, self.g.constants, name, np.require(array, requirements="C"))

    def conv(self, node: Node) -> bool:
        x, w = node.inputs[0], node.inputs[1]
        rank = len(self.g.value(x).shape)
        weight = self.g.constants.get(w)
        if weight is None or rank - 2 not in CHANNELS_LAST or "layout" in node.attrs:
            return False
        packed = self.constant(f"{w}_cl", weight.transpose(*range(2, rank), 1, 0))
        self.emit_channels_last(node, [self.channels_last(x), packed, *node.inputs[2:]],
                                {**node.attrs, "layout": CHANNELS_LAST[rank - 2]})
        return True

    def conv_transpose(self, node: Node) -> bool:
        """A 2-D ConvTranspose without groups or dilation runs channels-last. Where each stride divides its
        kernel (DCGAN's k4 s2) it is te's conv2d_transpose_col2im, a matmul by the weight as a
        (C, kh * kw * M) matrix, then a gather; otherwise conv2d_transpose with a (kh, kw, C, M) weight.
        DCGAN, 512 trials: 5.70 ms channels-first (vectorized along the width, read at every other pixel),
        1.80 direct channels-last, 1.43 col2im; ONNX Runtime 1.35."""
        x, w = node.inputs[0], node.inputs[1]
        weight, a = self.g.constants.get(w), node.attrs
        if weight is None or "layout" in a or not plain_transpose(weight.shape[2:], a["strides"], a["pads"],
                                                                 a["output_padding"], a["group"], a["dilations"]):
            return False
        if gathers(a["strides"], weight.shape[2:]):
            packed = self.constant(f"{w}_columns", weight.transpose(0, 2, 3, 1).reshape(weight.shape[0], -1))
            attrs = {**a, "layout": "NHWC", "method": "col2im"}
        else:
            packed, attrs = self.constant(f"{w}_cl", weight.transpose(2, 3, 0, 1)), {**a, "layout": "NHWC"}
        self.emit_channels_last(node, [self.channels_last(x), packed, *node.inputs[2:]], attrs)
        return True

    def elementwise(self, node: Node) -> bool:
        out = self.g.value(node.outputs[0])
        if out.dtype not in TENSOR_DTYPES:  # a Cast to a float16 output: no Transpose may read its result
            return False
        out_rank = len(out.shape)
        tensors = [x for x in node.inputs if x and x not in self.g.constants]
        if out_rank < 3 or not tensors or any(x not in self.last or len(self.g.value(x).shape) != out_rank
                                              for x in tensors):
            return False
        if any(x in self.g.constants and self.g.constants[x].ndim > out_rank for x in node.inputs):
            return False
        inputs = []
        for x in node.inputs:
            if not x or x in self.last:
                inputs.append(self.last.get(x, x))
                continue
            array = self.g.constants[x]
            full = array.reshape((1,) * (out_rank - array.ndim) + array.shape)
            inputs.append(self.constant(f"{x}_cl", full.transpose(to_last(out_rank))))
        self.emit_channels_last(node, inputs, node.attrs)
        return True

    def pool(self, node: Node) -> bool:
        """A pool (or LRN) over a value that exists channels-last runs there (no Transpose before it)."""
        rank = len(self.g.value(node.inputs[0]).shape)
        if node.inputs[0] not in self.last or rank - 2 not in CHANNELS_LAST:
            return False
        self.emit_channels_last(node, [self.last[node.inputs[0]]], {**node.attrs, "layout": CHANNELS_LAST[rank - 2]})
        return True

    def concat(self, node: Node) -> bool:
        rank = len(self.g.value(node.outputs[0]).shape)
        if rank < 3 or node.attrs["axis"] % rank != 1 or any(x not in self.last for x in node.inputs):
            return False
        self.emit_channels_last(node, [self.last[x] for x in node.inputs], {**node.attrs, "axis": rank - 1})
        return True

    def transpose(self, node: Node) -> bool:
        """The model's own permutes between the two layouts are absorbed: a channels-last value permuted to
        channels-first has that value as its twin (ConvNeXt's `y.permute(0, 3, 1, 2)` after its Linear layers),
        and a value with a twin permuted to channels-last is the twin."""
        x, rank = node.inputs[0], len(self.g.value(node.inputs[0]).shape)
        perm = tuple(node.attrs["perm"])
        if rank < 3:
            return False
        if perm == to_first(rank):
            self.nodes.append(node)  # for the readers that want channels-first
            self.last[node.outputs[0]] = x
            return True
        if perm == to_last(rank) and x in self.last:
            self.nodes.append(Node("Identity", node.name, [self.last[x]], list(node.outputs)))
            return True
        return False

    def run(self) -> Graph:
        for node in self.g.nodes:
            handled = ((node.op == "Conv" and self.conv(node)) or (node.op == "Concat" and self.concat(node))
                       or (node.op == "Transpose" and self.transpose(node))
                       or (node.op == "ConvTranspose" and self.conv_transpose(node))
                       or (node.op in POOLS and self.pool(node)) or (_layout_free(node) and self.elementwise(node)))
            if not handled:
                self.nodes.append(node)
        self.g.nodes = self.nodes
        return self.g


def to_channels_last(graph: Graph) -> Graph:
    """`graph` with its convolutions (and the element-wise ops around them) channels-last; same inputs,
    outputs and results."""
    g = _Rewriter(graph).run()
    for cleanup in (simplify_reshapes, remove_noops, eliminate_dead_code):
        g = cleanup(g)
    g.validate()
    return g
