"""Normalizers of the ops defined by where each output element is read from: Einsum, GatherElements, GatherND
(constant indices: a Gather of the data with its indexed axes flattened), DepthToSpace and SpaceToDepth.

Einsum's equation is made explicit: spaces dropped, the implicit output spelled out, and every ellipsis
replaced by letters the equation does not use, so the lowering only ever sees `ab,bc->ac`.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tensorgen.graph.frontend.normalize import CONST_INPUTS, OnnxNode, Steps, gather_inputs, normalizer
from tensorgen.graph.ir import Node

CONST_INPUTS.update({"GatherND": {1: "indices"}})

_TERM = re.compile(r"[A-Za-z]*(\.\.\.)?[A-Za-z]*")
ELLIPSIS = "..."


@dataclass(frozen=True)
class Term:
    """One operand's subscripts: the letters before and after its ellipsis (all in `head` without one)."""

    head: str
    tail: str
    ellipsis: bool

    @property
    def letters(self) -> str:
        return self.head + self.tail

    def expand(self, dims: str) -> str:
        """The subscripts with the ellipsis standing for the letters `dims`."""
        return self.head + dims + self.tail


class EinsumError(ValueError):
    """An equation Einsum cannot mean; the normalizer reports it naming the node."""


def _term(text: str, what: str) -> Term:
    if not _TERM.fullmatch(text):
        raise EinsumError(f"{what} {text!r} may hold only letters and one '...'")
    head, sep, tail = text.partition(ELLIPSIS)
    return Term(head, tail, bool(sep))


def explicit_equation(equation: str, ranks: Sequence[int]) -> str:
    """`equation` for operands of `ranks`, explicit and without ellipses: 'ij,jk' -> 'ij,jk->ik',
    '...ii->...i' on a rank-4 operand -> 'abii->abi' (a, b: letters the equation does not use)."""
    text = "".join(equation.split())
    lhs, arrow, rhs = text.partition("->")
    terms = [_term(t, "operand subscripts") for t in lhs.split(",")]
    if len(terms) != len(ranks):
        raise EinsumError(f"equation {equation!r} has {len(terms)} operands, but the node has {len(ranks)} inputs")
    widths = []
    for k, (term, rank) in enumerate(zip(terms, ranks)):
        width = rank - len(term.letters)
        if width < 0 or (width and not term.ellipsis):
            shown = term.expand(ELLIPSIS if term.ellipsis else "")
            raise EinsumError(f"operand {k} has rank {rank}; its subscripts {shown!r} name {len(term.letters)} dims")
        widths.append(width)
    fresh = [c for c in string.ascii_letters if c not in text]
    width = max(widths, default=0)
    if width > len(fresh):
        raise EinsumError(f"the ellipsis spans {width} dims, more than the {len(fresh)} letters left unused")
    dims = "".join(fresh[:width])
    inputs = [t.expand(dims[width - w:]) for t, w in zip(terms, widths)]
    if arrow:
        out = _term(rhs, "output subscripts")
        if width and not out.ellipsis:
            raise EinsumError(f"the operands' ellipsis spans {width} dims, but the output {rhs!r} has no '...'")
        output = out.expand(dims)
    else:
        counts = Counter("".join(t.letters for t in terms))
        output = dims + "".join(sorted(c for c, k in counts.items() if k == 1))
    used = set("".join(inputs))
    for c, k in Counter(output).items():
        if k > 1 or c not in used:
            raise EinsumError(f"output letter {c!r} is {'repeated' if k > 1 else 'in no operand'}")
    return f"{','.join(inputs)}->{output}"


@normalizer("Einsum")
def _einsum(n: OnnxNode) -> Node:
    try:
        equation = explicit_equation(n.attrs["equation"], [len(n.shape(i)) for i in range(len(n.inputs))])
    except EinsumError as err:
        raise n.error(str(err)) from None
    return n.make(attrs={"equation": equation})


@normalizer("GatherElements")
def _gather_elements(n: OnnxNode) -> Node:
    axis = n.axis(n.attrs["axis"], len(n.shape()))
    return n.make(attrs={"axis": axis}, inputs=gather_inputs(n, axis))


@normalizer("GatherND")
def _gather_nd(n: OnnxNode) -> list[Node]:
    """data[b..., i_0, ..., i_k-1, :] for each row (i_0..i_k-1) of the constant indices (after batch_dims b): the
    data reshaped to (batches x the k indexed axes, rest...) and a Gather of the rows' flat positions along its first
    axis (Swin-v2's relative position bias table as torch.onnx's dynamo exporter writes it)."""
    shape, indices, b = n.shape(), n.const(1).astype(np.int64), int(n.attrs.get("batch_dims", 0))
    k = indices.shape[-1] if indices.ndim else 0
    if indices.ndim < 1 or not 1 <= k <= len(shape) - b or indices.shape[:b] != shape[:b]:
        raise n.error(f"indices of shape {list(indices.shape)} do not index data of shape {list(shape)} "
                      f"with batch_dims={b}")
    dims = np.array(shape[b:b + k])
    if ((indices < -dims) | (indices >= dims)).any():
        raise n.error(f"indices {int(indices.min())}..{int(indices.max())} out of range for axes of {list(dims)}")
    positions = (np.where(indices < 0, indices + dims, indices) * np.cumprod([1, *dims[:0:-1]])[::-1]).sum(-1)
    batches = int(np.prod(shape[:b], dtype=np.int64))
    positions += (np.arange(batches) * int(np.prod(dims))).reshape(*shape[:b], *(1,) * (indices.ndim - 1 - b))
    flat = (batches * int(np.prod(dims)), *shape[b + k:])
    step = Steps(n)
    rows = step("rows", "Reshape", [n.inputs[0]], flat, shape=flat)
    return step.last("Gather", [rows, n.constant("positions", positions)], axis=0)


@normalizer("DepthToSpace", "SpaceToDepth")
def _depth_space(n: OnnxNode) -> Node:
    """DepthToSpace keeps its mode; SpaceToDepth (no mode before opset 28) is DCR and has none."""
    if len(n.shape()) != 4:
        raise n.error(f"input of shape {list(n.shape())} must be 4-D (N, C, H, W)")
    attrs = {"blocksize": int(n.attrs["blocksize"])}
    if n.op == "DepthToSpace":
        if n.attrs["mode"] not in ("DCR", "CRD"):
            raise n.error(f"mode {n.attrs['mode']!r} is not supported (DCR, CRD)")
        attrs["mode"] = n.attrs["mode"]
    return n.make(attrs=attrs)
