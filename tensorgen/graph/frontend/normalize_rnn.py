"""ONNX's recurrent ops (RNN, GRU, LSTM) unrolled over their sequence, which is static here, into ops the IR has.

Per direction, each gate's input projection for every step is one MatMul (X as (T * B, I) by the gate's W^T,
plus both biases where they add), split into the T steps; then each step is, per gate, a MatMul of the previous
hidden state by the gate's R^T, the step's projection added, the activation, and the state update. The steps of a
direction are the same subgraph on different values, so they become one task. Y stacks the steps' hidden states
in time order (a reverse direction runs from the last step to the first), Y_h and Y_c are the final states.

The weights (W, R, B, P) must be constants, as exporters write them; so must sequence_lens, where given, holding the
full length for every batch entry (shorter sequences would need masking)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from tensorgen.graph.frontend.normalize import OnnxNode, normalizer
from tensorgen.graph.ir import Node

GATES = {"RNN": "i", "GRU": "zrh", "LSTM": "iofc"}  # ONNX's order of the gates in W, R and B
ACTIVATIONS = {"RNN": ("Tanh",), "GRU": ("Sigmoid", "Tanh"), "LSTM": ("Sigmoid", "Tanh", "Tanh")}
#: activations by ONNX name: the IR op and the attributes it takes from activation_alpha / activation_beta
_UNARY = {"sigmoid": ("Sigmoid", ()), "tanh": ("Tanh", ()), "relu": ("Relu", ()), "softsign": ("Softsign", ()),
          "softplus": ("Softplus", ()), "leakyrelu": ("LeakyRelu", (("alpha", 0.01),)),
          "thresholdedrelu": ("ThresholdedRelu", (("alpha", 1.0),)), "elu": ("Elu", (("alpha", 1.0),)),
          "hardsigmoid": ("HardSigmoid", (("alpha", 0.2), ("beta", 0.5)))}


@dataclass
class _Writer:
    """Appends IR nodes for one ONNX node, each with a fresh output value (or `out`, an output of the ONNX node)."""

    n: OnnxNode
    dtype: str
    nodes: list[Node] = field(default_factory=list)

    def __call__(self, op: str, inputs: Sequence[str], shape: Sequence[int], attrs: dict | None = None,
                 out: str = "") -> str:
        tag = f"{op.lower()}{len(self.nodes)}"
        out = out or self.n.temp(tag, shape, self.dtype)
        self.nodes.append(Node(op, f"{self.n.name}_{tag}", list(inputs), [out], attrs or {}))
        return out

    def split(self, x: str, axis: int, sizes: Sequence[int], shape: Sequence[int]) -> list[str]:
        outs = [self.n.temp(f"part{len(self.nodes)}_{k}", (*shape[:axis], size, *shape[axis + 1:]), self.dtype)
                for k, size in enumerate(sizes)]
        self.nodes.append(Node("Split", f"{self.n.name}_split{len(self.nodes)}", [x], outs,
                               {"axis": axis, "split": tuple(sizes)}))
        return outs

    def const(self, array: np.ndarray) -> str:
        return self.n.constant("weight", array)


def _activations(n: OnnxNode, directions: int) -> list[list[tuple[str, dict]]]:
    """Each direction's activations as (IR op, attributes), alphas and betas consumed in order by the activations
    that take them."""
    names = [str(a) for a in n.attrs.get("activations") or ACTIVATIONS[n.op]]
    per = len(ACTIVATIONS[n.op])
    if len(names) == per and directions == 2:
        names *= 2  # one set for both directions
    if len(names) not in (per * directions, per * 2):  # RNN's schema default names two, forward or not
        raise n.error(f"activations {names} are not {per} per direction")
    params = {"alpha": list(n.attrs.get("activation_alpha") or []), "beta": list(n.attrs.get("activation_beta") or [])}
    out = []
    for name in names:
        if name.lower() not in _UNARY:
            raise n.error(f"activation {name!r} is not supported (supported: {', '.join(sorted(_UNARY))})")
        op, wanted = _UNARY[name.lower()]
        out.append((op, {k: float(params[k].pop(0)) if params[k] else default for k, default in wanted}))
    return [out[d * per:(d + 1) * per] for d in range(directions)]


@normalizer("RNN", "GRU", "LSTM")
def _recurrent(n: OnnxNode) -> list[Node]:
    gates = GATES[n.op]
    direction = str(n.attrs.get("direction", "forward"))
    if direction not in ("forward", "reverse", "bidirectional"):
        raise n.error(f"direction={direction!r} is not forward, reverse or bidirectional")
    dirs = 2 if direction == "bidirectional" else 1
    batch_first = int(n.attrs.get("layout", 0)) == 1
    x_shape, dtype = n.shape(0), n.state.values[n.inputs[0]].dtype
    steps, batch, size = (x_shape[1], x_shape[0], x_shape[2]) if batch_first else x_shape
    lens = n.const(4)  # W, R, B, sequence_lens and P are constants (CONST_INPUTS)
    if lens is not None and np.any(lens != steps):
        raise n.error(f"sequence_lens {lens.tolist()} shorter than the sequence ({steps}) are not supported")
    w, r = n.const(1), n.const(2)
    hidden = r.shape[-1]
    b = n.const(3)
    b = np.zeros((dirs, 2 * len(gates) * hidden), dtype) if b is None else b
    peep = n.const(7) if n.op == "LSTM" else None
    clip = n.attrs.get("clip")
    linear_before_reset = bool(n.attrs.get("linear_before_reset", 0))
    input_forget = bool(n.attrs.get("input_forget", 0))
    acts = _activations(n, dirs)
    put = _Writer(n, dtype)

    x = n.inputs[0]
    if batch_first:
        x = put("Transpose", [x], (steps, batch, size), {"perm": (1, 0, 2)})
    flat = put("Reshape", [x], (steps * batch, size), {"shape": (steps * batch, size)})
    state_shape = (batch, hidden)
    initial = [_initial(n, put, i, dirs, state_shape, batch_first) for i in (5, 6)]

    ys, finals, cells = [], [], []
    for d in range(dirs):
        def gate(k: int, m: np.ndarray) -> np.ndarray:
            """Gate k's rows of a direction's W, R or bias."""
            return m[k * hidden:(k + 1) * hidden]

        wb, rb = b[d, :len(gates) * hidden], b[d, len(gates) * hidden:]
        projections = {}
        for k, g in enumerate(gates):
            bias = gate(k, wb) + (0 if (n.op == "GRU" and g == "h" and linear_before_reset) else gate(k, rb))
            xw = put("MatMul", [flat, put.const(np.ascontiguousarray(gate(k, w[d]).T).astype(dtype))],
                     (steps * batch, hidden))
            xw = put("Add", [xw, put.const(bias.astype(dtype))], (steps * batch, hidden))
            xw = put("Reshape", [xw], (steps, batch, hidden), {"shape": (steps, batch, hidden)})
            projections[g] = [put("Reshape", [s], state_shape, {"shape": state_shape})
                              for s in put.split(xw, 0, [1] * steps, (steps, batch, hidden))]
        recur = {g: put.const(np.ascontiguousarray(gate(k, r[d]).T).astype(dtype)) for k, g in enumerate(gates)}
        step = _Step(put, n.op, acts[d], state_shape, clip, recur, dtype,
                     gru_rb=gate(2, rb).astype(dtype) if n.op == "GRU" else None,
                     linear_before_reset=linear_before_reset, input_forget=input_forget,
                     peep=None if peep is None else [peep[d, k * hidden:(k + 1) * hidden] for k in range(3)])
        h = initial[0][d] if initial[0] else put.const(np.zeros(state_shape, dtype))
        c = initial[1][d] if initial[1] else put.const(np.zeros(state_shape, dtype))
        order = range(steps - 1, -1, -1) if (direction == "reverse" or d == 1) else range(steps)
        hs: dict[int, str] = {}
        for t in order:
            h, c = step({g: projections[g][t] for g in gates}, h, c)
            hs[t] = h
        ys.append([hs[t] for t in range(steps)])
        finals.append(h)
        cells.append(c)
    return _outputs(n, put, ys, finals, cells, (steps, batch, hidden), dirs, batch_first)


def _initial(n: OnnxNode, put: _Writer, i: int, dirs: int, state_shape: tuple[int, int], batch_first: bool
             ) -> list[str]:
    """Input `i` (initial_h, initial_c: (directions, batch, hidden); layout 1: (batch, directions, hidden)) as one
    (batch, hidden) value per direction."""
    if not n.input(i) or (i == 6 and n.op != "LSTM"):
        return []
    x = n.inputs[i]
    if batch_first and dirs > 1:
        x = put("Transpose", [x], (dirs, *state_shape), {"perm": (1, 0, 2)})
    parts = put.split(x, 0, [1] * dirs, (dirs, *state_shape)) if dirs > 1 else [x]
    return [put("Reshape", [p], state_shape, {"shape": state_shape}) for p in parts]


@dataclass
class _Step:
    """One step of one direction: the gates from the step's projections and the previous state, then the update."""

    put: _Writer
    op: str
    acts: list[tuple[str, dict]]
    shape: tuple[int, int]
    clip: float | None
    recur: dict[str, str]
    dtype: str
    gru_rb: np.ndarray | None
    linear_before_reset: bool
    input_forget: bool
    peep: list[np.ndarray] | None

    def act(self, k: int, x: str, clipped: bool = True) -> str:
        """Activation k of `x`, clipped first where `clip` is set (the gates' inputs; not the cell state LSTM's h
        reads, as ONNX Runtime does it)."""
        if self.clip is not None and clipped:
            x = self.put("Clip", [x], self.shape, {"min": -float(self.clip), "max": float(self.clip)})
        op, attrs = self.acts[k]
        return self.put(op, [x], self.shape, attrs)

    def pre(self, g: str, xw: str, h: str) -> str:
        """x W_g^T + biases + h R_g^T."""
        return self.put("Add", [self.put("MatMul", [h, self.recur[g]], self.shape), xw], self.shape)

    def binary(self, op: str, a: str, b: str) -> str:
        return self.put(op, [a, b], self.shape)

    def __call__(self, xw: dict[str, str], h: str, c: str) -> tuple[str, str]:
        if self.op == "RNN":
            return self.act(0, self.pre("i", xw["i"], h)), c
        if self.op == "GRU":
            z, reset = (self.act(0, self.pre(g, xw[g], h)) for g in "zr")
            if self.linear_before_reset:
                hr = self.put("Add", [self.put("MatMul", [h, self.recur["h"]], self.shape),
                                      self.put.const(self.gru_rb)], self.shape)
                candidate = self.act(1, self.binary("Add", xw["h"], self.binary("Mul", reset, hr)))
            else:
                candidate = self.act(1, self.pre("h", xw["h"], self.binary("Mul", reset, h)))
            one = self.put.const(np.array(1, self.dtype))
            return self.binary("Add", self.binary("Mul", self.binary("Sub", one, z), candidate),
                               self.binary("Mul", z, h)), c
        pre = {g: self.pre(g, xw[g], h) for g in "iofc"}
        if self.peep is not None:
            for k, g in enumerate("if"):
                pre[g] = self.binary("Add", pre[g], self.binary("Mul", c, self.put.const(self.peep[k + (k > 0)])))
        i = self.act(0, pre["i"])
        f = self.binary("Sub", self.put.const(np.array(1, self.dtype)), i) if self.input_forget else \
            self.act(0, pre["f"])
        c = self.binary("Add", self.binary("Mul", f, c), self.binary("Mul", i, self.act(1, pre["c"])))
        if self.peep is not None:
            pre["o"] = self.binary("Add", pre["o"], self.binary("Mul", c, self.put.const(self.peep[1])))
        return self.binary("Mul", self.act(0, pre["o"]), self.act(2, c, clipped=False)), c


def _outputs(n: OnnxNode, put: _Writer, ys: list[list[str]], finals: list[str], cells: list[str],
             sizes: tuple[int, int, int], dirs: int, batch_first: bool) -> list[Node]:
    """Y (T, dirs, B, H) (layout 1: (B, T, dirs, H)), Y_h and Y_c (dirs, B, H) (layout 1: (B, dirs, H))."""
    steps, batch, hidden = sizes

    def stack(values: list[str], lead: tuple[int, ...], axis: int) -> str:
        """The values, each viewed as (*lead, B, H), concatenated along `axis`."""
        shaped = [put("Reshape", [v], (*lead, batch, hidden), {"shape": (*lead, batch, hidden)}) for v in values]
        shape = [*lead, batch, hidden]
        shape[axis] *= len(values)
        return shaped[0] if len(values) == 1 else put("Concat", shaped, tuple(shape), {"axis": axis})

    def written(k: int, value: str, shape: tuple[int, ...], perm: tuple[int, ...]) -> None:
        """Output k (where the model uses it) as `value`, transposed by `perm` for layout 1."""
        if k >= len(n.outputs) or not n.outputs[k]:
            return
        if batch_first:
            put("Transpose", [value], tuple(shape[p] for p in perm), {"perm": perm}, out=n.outputs[k])
        else:
            put("Identity", [value], shape, out=n.outputs[k])

    written(0, stack([stack(y, (1, 1), 0) for y in ys], (steps, 1), 1), (steps, dirs, batch, hidden), (2, 0, 1, 3))
    written(1, stack(finals, (1,), 0), (dirs, batch, hidden), (1, 0, 2))
    if n.op == "LSTM":
        written(2, stack(cells, (1,), 0), (dirs, batch, hidden), (1, 0, 2))
    return put.nodes
