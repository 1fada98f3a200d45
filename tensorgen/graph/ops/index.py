"""Lowerings of ops defined by where each output element reads its inputs: Einsum (one stage: the product of
the operands at the letters' positions, summed over the letters the output lacks), GatherElements, DepthToSpace
and SpaceToDepth (one index-mapping stage each)."""

from __future__ import annotations

from collections.abc import Sequence

from tensorgen.graph.ir import Node
from tensorgen.graph.ops.base import READABLE, Args, lowering
from tensorgen.te import expr as E
from tensorgen.te.ops.common import INJECTIVE, named
from tensorgen.te.tensor import Tensor, compute, reduce_axis
from tensorgen.te.tensor import sum as te_sum

EINSUM = "einsum"


def _letter_sizes(args: Args, terms: Sequence[str]) -> dict[str, int]:
    """Each letter's extent: its dims agree, or are 1 and broadcast (as in ONNX Runtime); a letter repeated
    within one operand (a diagonal) needs equal dims there."""
    sizes: dict[str, int] = {}
    for k, term in enumerate(terms):
        shape = args.value(k).shape
        if len(term) != len(shape):
            raise args.error(f"operand {k} of shape {list(shape)} has subscripts {term!r}")
        seen: dict[str, int] = {}
        for c, n in zip(term, shape):
            if seen.setdefault(c, n) != n:
                raise args.error(f"letter {c!r} repeats in operand {k} over dims of sizes {seen[c]} and {n}")
            if sizes.get(c, 1) not in (1, n) and n != 1:
                raise args.error(f"letter {c!r} stands for dims of sizes {sizes[c]} and {n}")
            sizes[c] = max(sizes.get(c, 1), n)
    return sizes


@lowering("Einsum", kind="compute")
def _einsum(node: Node, args: Args) -> list[Tensor]:
    """`equation` is explicit and without ellipses (the frontend expands them): 'bij,bjk->bik'."""
    equation = str(args.attr("equation"))
    lhs, arrow, output = equation.partition("->")
    terms = lhs.split(",")
    if not arrow or len(terms) != len(node.inputs):
        raise args.error(f"equation {equation!r} must be explicit, with one term per input ({len(node.inputs)})")
    sizes = _letter_sizes(args, terms)
    unknown = set(output) - set(sizes)
    if unknown or len(set(output)) != len(output):
        raise args.error(f"output subscripts {output!r} repeat a letter or name one no operand has")
    args.expect_shape(0, [sizes[c] for c in output])
    operands = [(term, args.tensor(k), args.value(k).shape) for k, term in enumerate(terms)]
    reduced = {c: reduce_axis(sizes[c], f"r{c}") for c in dict.fromkeys(lhs.replace(",", "")) if c not in output}

    def body(*idx):
        at = {**dict(zip(output, idx)), **reduced}  # a 0-d output's te shape is (1,): its index is unused
        product = None
        for term, x, shape in operands:
            index = tuple(at[c] if n == sizes[c] else 0 for c, n in zip(term, shape))
            value = x[index or (0,)]
            product = value if product is None else product * value
        return te_sum(product, axis=list(reduced.values())) if reduced else product

    names = list(output) or ["i"]
    return [compute(args.out_shape(), named(body, names), name=args.name(), tag=EINSUM, attrs={"equation": equation})]


@lowering("GatherElements", kind="injective", dtypes=READABLE)
def _gather_elements(node: Node, args: Args) -> list[Tensor]:
    """out[i..., j, k...] = x[i..., indices[i..., j, k...], k...] along `axis`; negative indices count from the end
    (run-time ones are checked to lie in [-n, n) by the executor, constant ones at import)."""
    x, axis = args.tensor(0), int(args.attr("axis"))
    if args.value(1).dtype not in ("int32", "int64"):
        raise args.error(f"indices must be int32 or int64, got {args.value(1).dtype}")
    shape, ishape = args.value(0).shape, args.value(1).shape
    if len(ishape) != len(shape) or any(m > n for d, (m, n) in enumerate(zip(ishape, shape)) if d != axis):
        raise args.error(f"indices of shape {list(ishape)} do not fit data of shape {list(shape)} off axis {axis}")
    args.expect_shape(0, ishape)
    indices, dim = args.tensor(1), shape[axis]

    def body(*idx):
        i = indices[idx]
        i = E.select(i < 0, i + dim, i)
        return x[(*idx[:axis], i, *idx[axis + 1:])]

    return [compute(args.out_shape(), body, name=args.name(), tag=INJECTIVE)]


@lowering("DepthToSpace", "SpaceToDepth", kind="injective", dtypes=READABLE)
def _depth_space(node: Node, args: Args) -> list[Tensor]:
    """Blocks of `blocksize`^2 channels become blocksize x blocksize pixels (DepthToSpace) or the reverse. A
    channel splits into (block row, block column, channel) with mode DCR, (channel, block row, block column)
    with CRD; SpaceToDepth has no mode (DCR)."""
    to_space = node.op == "DepthToSpace"
    x, b, mode = args.tensor(0), int(args.attr("blocksize")), args.attr("mode") if to_space else "DCR"
    if x.ndim != 4 or mode not in ("DCR", "CRD") or b < 1:
        raise args.error(f"needs a 4-D input, mode DCR or CRD and blocksize >= 1 (got {list(x.shape)}, {mode!r}, {b})")
    n, c, h, w = x.shape
    if (c % (b * b) if to_space else h % b or w % b):
        raise args.error(f"input {list(x.shape)} does not split into blocks of {b}")
    depth = c // (b * b) if to_space else c  # the channels of the spatial side
    args.expect_shape(0, (n, depth, h * b, w * b) if to_space else (n, c * b * b, h // b, w // b))

    def channel(ch, block):
        return block * depth + ch if mode == "DCR" else ch * (b * b) + block

    def depth_to_space(i, o, y, z):
        return x[i, channel(o, (y % b) * b + z % b), y // b, z // b]

    def space_to_depth(i, o, y, z):
        block, ch = o // depth, o % depth
        return x[i, ch, y * b + block // b, z * b + block % b]

    body = depth_to_space if to_space else space_to_depth
    return [compute(args.out_shape(), body, name=args.name(), tag=INJECTIVE, attrs={"blocksize": b})]
