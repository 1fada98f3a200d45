"""Matrix products and the matrix 2-norm."""

from __future__ import annotations

from tensorgen.errors import TensorExprError
from tensorgen.te.expr import sqrt
from tensorgen.te.ops.common import (
    BATCH_MATMUL,
    BROADCAST,
    DENSE,
    ELEMWISE,
    MATMUL,
    REDUCE,
    check_same_dtype,
    check_tensor,
    named,
)
from tensorgen.te.tensor import Tensor, compute, reduce_axis
from tensorgen.te.tensor import sum as te_sum


def matmul(a: Tensor, b: Tensor, transpose_a: bool = False, transpose_b: bool = False,
           name: str = "matmul") -> Tensor:
    """`C[i, j] = sum_k A[i, k] * B[k, j]` for 2-D A (N, K) and B (K, M); the flags read A^T / B^T."""
    check_tensor(a, "matmul", "a", ndim=2)
    check_tensor(b, "matmul", "b", ndim=2)
    check_same_dtype("matmul", a, b)
    n, ka = a.shape[::-1] if transpose_a else a.shape
    kb, m = b.shape[::-1] if transpose_b else b.shape
    if ka != kb:
        raise TensorExprError(
            f"matmul: reduction lengths differ: {a.name}{list(a.shape)}{'^T' if transpose_a else ''} has "
            f"K={ka} but {b.name}{list(b.shape)}{'^T' if transpose_b else ''} has K={kb}"
        )
    k = reduce_axis(ka, "k")

    def body(i, j):
        av = a[k, i] if transpose_a else a[i, k]
        bv = b[j, k] if transpose_b else b[k, j]
        return te_sum(av * bv, axis=k)

    return compute((n, m), body, name=name, tag=MATMUL)


def batch_matmul(a: Tensor, b: Tensor, transpose_b: bool = False, name: str = "batch_matmul") -> Tensor:
    """Matrix products over identical leading batch dims: A (..., N, K) @ B (..., K, M) -> (..., N, M).

    With `transpose_b`, B is (..., M, K) (as in attention scores Q K^T).
    """
    check_tensor(a, "batch_matmul", "a")
    check_tensor(b, "batch_matmul", "b")
    if a.ndim < 3 or b.ndim != a.ndim:
        raise TensorExprError(
            f"batch_matmul: needs two tensors of the same rank >= 3, got {a.name}{list(a.shape)} and "
            f"{b.name}{list(b.shape)}"
        )
    check_same_dtype("batch_matmul", a, b)
    batch = a.shape[:-2]
    if b.shape[:-2] != batch:
        raise TensorExprError(
            f"batch_matmul: batch dimensions differ: {a.name}{list(a.shape)} vs {b.name}{list(b.shape)}"
        )
    n, ka = a.shape[-2:]
    m, kb = b.shape[-2:] if transpose_b else b.shape[-1:-3:-1]
    if ka != kb:
        raise TensorExprError(
            f"batch_matmul: reduction lengths differ: {a.name}{list(a.shape)} has K={ka} but "
            f"{b.name}{list(b.shape)}{' (transposed)' if transpose_b else ''} has K={kb}"
        )
    k = reduce_axis(ka, "k")
    names = ["b"] if len(batch) == 1 else [f"b{d}" for d in range(len(batch))]

    def body(*idx):
        bi, i, j = idx[:-2], idx[-2], idx[-1]
        bv = b[bi + (j, k)] if transpose_b else b[bi + (k, j)]
        return te_sum(a[bi + (i, k)] * bv, axis=k)

    return compute(batch + (n, m), named(body, names + ["i", "j"]), name=name, tag=BATCH_MATMUL,
                   attrs={"transpose_b": transpose_b})


def dense(x: Tensor, weight: Tensor, bias: Tensor | None = None, name: str = "dense") -> Tensor:
    """Fully connected layer: `x (B, K) @ weight (N, K)^T (+ bias (N,))`; the bias is its own stage."""
    check_tensor(x, "dense", "x", ndim=2)
    check_tensor(weight, "dense", "weight", ndim=2)
    check_same_dtype("dense", x, weight)
    if x.shape[1] != weight.shape[1]:
        raise TensorExprError(
            f"dense: {x.name}{list(x.shape)} has {x.shape[1]} input features but weight "
            f"{weight.name}{list(weight.shape)} (out_features, in_features) expects {weight.shape[1]}"
        )
    k = reduce_axis(x.shape[1], "k")
    out = compute((x.shape[0], weight.shape[0]), lambda i, j: te_sum(x[i, k] * weight[j, k], axis=k),
                  name=name, tag=DENSE)
    if bias is None:
        return out
    check_tensor(bias, "dense", "bias", ndim=1)
    check_same_dtype("dense", x, bias)
    if bias.shape[0] != weight.shape[0]:
        raise TensorExprError(
            f"dense: bias {bias.name}{list(bias.shape)} does not match {weight.shape[0]} output features"
        )
    return compute(out.shape, lambda i, j: out[i, j] + bias[j], name=f"{name}_bias", tag=BROADCAST)


def matrix_norm(a: Tensor, name: str = "norm") -> Tensor:
    """Frobenius (2-)norm `sqrt(sum(A * A))`: a 2-D A gives shape (1,); a batch (B, N, M) gives (B,)."""
    check_tensor(a, "matrix_norm", "a", ndim=(2, 3))
    i = reduce_axis(a.shape[-2], "i")
    j = reduce_axis(a.shape[-1], "j")
    if a.ndim == 2:
        sumsq = compute((1,), lambda b: te_sum(a[i, j] * a[i, j], axis=[i, j]), name=f"{name}_sumsq",
                        tag=REDUCE)
    else:
        sumsq = compute((a.shape[0],), lambda b: te_sum(a[b, i, j] * a[b, i, j], axis=[i, j]),
                        name=f"{name}_sumsq", tag=REDUCE)
    return compute(sumsq.shape, lambda b: sqrt(sumsq[b]), name=name, tag=ELEMWISE)
