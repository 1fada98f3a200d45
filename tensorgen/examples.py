"""Hand-written schedules of a matmul and a conv2d, with their NumPy peers: what `tensorgen demo` shows, what
bench/hand_schedules.py times, and a starting point for writing schedules of your own.

Both follow the classic CPU recipe (as in TVM's x86 schedules and Ansor's sketches):

* layout stages (`te.compute`) that repack operands so the innermost loop reads contiguous,
  vector-aligned memory;
* a `cache_write` accumulator holding a register tile (rows x one float8 vector of columns), whose
  reduction loops sit outside the unrolled row loop and the vectorized column loop, so GCC keeps
  the tile in ymm registers and the hot loop is broadcast + FMA;
* the outer spatial loops fused into one parallel (OpenMP) loop, with the accumulator computed at it.
"""

from __future__ import annotations

import numpy as np

from tensorgen import te
from tensorgen.schedule import State
from tensorgen.te import ops

VEC = 8  # float32 lanes of a 256-bit (AVX2) vector


def _check_divides(what: str, extent: int, factor: int) -> None:
    if factor <= 0 or extent % factor:
        raise ValueError(f"{what}: tile {factor} must divide the extent {extent}")


# ---------------------------------------------------------------------------------------------
# matmul (GMM): C[i, j] = sum_k A[i, k] * B[k, j]


def gmm_state(m: int, n: int, k: int, tile_m: int = 8, tile_n: int = VEC, n_blocks: int = 1,
              k_block: int = 256, j_outer: bool = False) -> State:
    """Hand-scheduled `A (m, k) @ B (k, n)`; the program's arguments are A, B, C.

    Layout stages `A_packed (m/tile_m, k, tile_m)` and `B_packed (n/tile_n, k, tile_n)` are part of
    the program (they run, in parallel, on every call). Each parallel task owns a `tile_m` x
    `tile_n * n_blocks` block of C; its accumulator `C_local` is walked as k_0 (blocks of `k_block`),
    column block, k_1, then the register tile: `tile_m` unrolled rows x one vectorized
    `tile_n`-wide column vector (8 x 8 -> 8 ymm accumulators, one B vector, A broadcasts).
    The defaults (one column block, k_0 x k_1 = k/256 x 256, row blocks outer) are the schedule of
    the hand-written GMM this module started from.
    """
    _check_divides("gmm m", m, tile_m)
    _check_divides("gmm n", n, tile_n * n_blocks)
    k_block = min(k_block, k)
    _check_divides("gmm k", k, k_block)
    a = te.placeholder((m, k), name="A")
    b = te.placeholder((k, n), name="B")
    b_packed = te.compute((n // tile_n, k, tile_n), lambda jo, kk, ji: b[kk, jo * tile_n + ji], name="B_packed")
    a_packed = te.compute((m // tile_m, k, tile_m), lambda io, kk, ii: a[io * tile_m + ii, kk], name="A_packed")
    r = te.reduce_axis(k, "k")
    c = te.compute(
        (m, n),
        lambda i, j: te.sum(a_packed[i // tile_m, r, i % tile_m] * b_packed[j // tile_n, r, j % tile_n], axis=r),
        name="C",
    )
    s = State([a, b, c])
    s.cache_write("C", "local")
    s.split("C", "i", [tile_m])
    s.split("C", "j", [tile_n * n_blocks])
    # row blocks outer (consecutive tasks of a thread reuse one A panel), or with `j_outer` the
    # column blocks (they reuse one B panel, k x tile_n*n_blocks)
    outer = ["j_0", "i_0"] if j_outer else ["i_0", "j_0"]
    s.reorder("C", [*outer, "i_1", "j_1"])
    s.fuse("C", outer)
    fused = "_".join(outer) + "_f"
    s.parallel("C", fused)
    s.compute_at("C_local", "C", fused)
    s.split("C_local", "k", [k_block])
    if n_blocks > 1:
        s.split("C_local", "j", [tile_n])
        s.reorder("C_local", ["k_0", "j_0", "k_1", "i", "j_1"])
        s.unroll("C_local", "i")
        s.vectorize("C_local", "j_1")
    else:
        s.reorder("C_local", ["k_0", "k_1", "i", "j"])
        s.unroll("C_local", "i")
        s.vectorize("C_local", "j")
    s.parallel("B_packed", "jo")
    s.vectorize("B_packed", "ji")
    s.parallel("A_packed", "io")
    return s


def gpu_gmm_state(m: int, n: int, k: int, threads: tuple[int, int] = (8, 8), thread_tile: tuple[int, int] = (2, 1),
                  vthreads: tuple[int, int] = (1, 1), k_tile: int = 8, fetch_threads: int | None = None,
                  fetch_by_columns: bool = False) -> State:
    """Hand-scheduled `A (m, k) @ B (k, n)` for a CUDA target, in the shape of Ansor's GPU sketch: C's rows and
    columns split into blocks (blockIdx.x), virtual threads, `threads` (threadIdx.x) and a `thread_tile` per
    thread, accumulated in registers (`C_local`); per `k_tile` step of the reduction, the block's rows of A and
    columns of B are copied into shared memory by `fetch_threads` threads together (default: all of the block's),
    consecutive threads along a row of the tile (`fetch_by_columns`: down a column, uncoalesced). Extents need not
    divide."""
    a = te.placeholder((m, k), name="A")
    b = te.placeholder((k, n), name="B")
    s = State(ops.matmul(a, b, name="C"))
    s = s.cache_write("C", "local")
    s = s.cache_read("A", "shared", ["C_local"]).cache_read("B", "shared", ["C_local"])
    for axis, v, t, tile in zip("ij", vthreads, threads, thread_tile):
        s = s.split("C", axis, [v, t, tile])
    s = s.reorder("C", ["i_0", "j_0", "i_1", "j_1", "i_2", "j_2", "i_3", "j_3"])
    for level, axis in enumerate(("blockIdx.x", "vthread", "threadIdx.x")):
        s = s.fuse("C", [f"i_{level}", f"j_{level}"]).bind("C", f"i_{level}_j_{level}_f", axis)
    s = s.compute_at("C_local", "C", "i_2_j_2_f")
    s = s.split("C_local", "k", [k_tile]).reorder("C_local", ["k_0", "i", "j", "k_1"])
    for tile in ("A_shared", "B_shared"):
        s = s.compute_at(tile, "C_local", "k_0")
        order = ["ax1", "ax0"] if fetch_by_columns else ["ax0", "ax1"]
        fused = f"{order[0]}_{order[1]}_f"
        s = s.reorder(tile, order).fuse(tile, order).split(tile, fused, [fetch_threads or threads[0] * threads[1]])
        s = s.bind(tile, f"{fused}_1", "threadIdx.x")
    return s


# ---------------------------------------------------------------------------------------------
# conv2d, NHWC data, HWIO weights


def conv2d_state(batch: int, height: int, width: int, in_channels: int, out_channels: int, kernel: int = 3,
                 padding: int = 1, stride: int = 1, tile_w: int = 8, tile_co: int = VEC,
                 tile_h: int = 1, pack_weight: bool = True, co_outer: bool = False) -> State:
    """Hand-scheduled NHWC conv2d with HWIO weights; the program's arguments are data, weight, conv2d.

    `pad` is its own root stage, parallel over (n, rows) with a vectorized channel loop. With
    `pack_weight` a layout stage `weight_packed (co/tile_co, kh, kw, ci, tile_co)` makes the weights
    of one output-channel block contiguous (18 KiB for the ResNet layer, L1-resident) and the conv
    is written against it; otherwise `ops.conv2d` is used as is. The accumulator `conv2d_local` is a
    register tile of `tile_h` rows x `tile_w` output pixels along w (both unrolled) x `tile_co`
    output channels (vectorized, one float8 when 8), with the reduction loops rh, rw, rc outside
    it, computed at the fused parallel loop over (n, h/tile_h, w/tile_w, co/tile_co) (with
    `co_outer`: (n, co/tile_co, h/tile_h, w/tile_w), which keeps one weight block in L1).
    """
    _check_divides("conv2d out channels", out_channels, tile_co)
    if tile_co > VEC:
        _check_divides("conv2d tile_co", tile_co, VEC)
    data = te.placeholder((batch, height, width, in_channels), name="data")
    weight = te.placeholder((kernel, kernel, in_channels, out_channels), name="weight")
    if pack_weight:
        pd = ops.pad(data, (0, padding, padding, 0), (0, padding, padding, 0)) if padding else data
        wp = te.compute(
            (out_channels // tile_co, kernel, kernel, in_channels, tile_co),
            lambda o, kh, kw, ci, oi: weight[kh, kw, ci, o * tile_co + oi],
            name="weight_packed",
        )
        rh = te.reduce_axis(kernel, "rh")
        rw = te.reduce_axis(kernel, "rw")
        rc = te.reduce_axis(in_channels, "rc")
        out_h = (height + 2 * padding - kernel) // stride + 1
        out_w = (width + 2 * padding - kernel) // stride + 1

        def body(n, h, w, co):
            x = pd[n, h * stride + rh, w * stride + rw, rc]
            return te.sum(x * wp[co // tile_co, rh, rw, rc, co % tile_co], axis=[rh, rw, rc])

        out = te.compute((batch, out_h, out_w, out_channels), body, name="conv2d", tag=ops.CONV2D)
    else:
        out = ops.conv2d(data, weight, stride=stride, padding=padding)
    _check_divides("conv2d out height", out.shape[1], tile_h)
    _check_divides("conv2d out width", out.shape[2], tile_w)
    s = State([data, weight, out])
    s.cache_write("conv2d", "local")
    hs = ["h"]
    if tile_h > 1:
        s.split("conv2d", "h", [tile_h])
        hs = ["h_0", "h_1"]
    s.split("conv2d", "w", [tile_w])
    s.split("conv2d", "co", [tile_co])
    outer = ["n", "co_0", hs[0], "w_0"] if co_outer else ["n", hs[0], "w_0", "co_0"]
    s.reorder("conv2d", [*outer, *hs[1:], "w_1", "co_1"])
    s.fuse("conv2d", outer)
    fused = "_".join(outer) + "_f"
    s.parallel("conv2d", fused)
    s.compute_at("conv2d_local", "conv2d", fused)
    cos = ["co"]
    if tile_co > VEC:  # several vectors of output channels: unroll them too
        s.split("conv2d_local", "co", [VEC])
        cos = ["co_0", "co_1"]
    tile = [*cos[:-1], *(["h"] if tile_h > 1 else []), "w"]  # the unrolled part of the register tile
    s.reorder("conv2d_local", ["n", *([] if tile_h > 1 else ["h"]), "rh", "rw", "rc", *tile, cos[-1]])
    for it in tile:
        s.unroll("conv2d_local", it)
    s.vectorize("conv2d_local", cos[-1])
    if padding:
        s.fuse("pad", ["i0", "i1"])
        s.parallel("pad", "i0_i1_f")
        if in_channels % VEC == 0:
            s.split("pad", "i3", [VEC])
            s.vectorize("pad", "i3_1")
    if pack_weight:
        s.parallel("weight_packed", "o")
        if tile_co == VEC:
            s.vectorize("weight_packed", "oi")
    return s


# ---------------------------------------------------------------------------------------------
# NumPy references


def conv2d_nhwc_reference(data: np.ndarray, weight: np.ndarray, padding: int = 1, stride: int = 1) -> np.ndarray:
    """Independent reference: sliding windows + einsum (slow, exact)."""
    kh, kw = weight.shape[:2]
    x = np.pad(data, ((0, 0), (padding, padding), (padding, padding), (0, 0)))
    win = np.lib.stride_tricks.sliding_window_view(x, (kh, kw), axis=(1, 2))[:, ::stride, ::stride]
    return np.einsum("nhwcij,ijco->nhwo", win, weight, optimize=True).astype(data.dtype)


def conv2d_nhwc_im2col(data: np.ndarray, weight: np.ndarray, padding: int = 1, stride: int = 1) -> np.ndarray:
    """A fast NumPy conv: im2col (one copy) + one BLAS matmul."""
    n, h, w, c = data.shape
    kh, kw, _, co = weight.shape
    x = np.pad(data, ((0, 0), (padding, padding), (padding, padding), (0, 0)))
    win = np.lib.stride_tricks.sliding_window_view(x, (kh, kw), axis=(1, 2))[:, ::stride, ::stride]
    oh, ow = win.shape[1:3]
    cols = np.ascontiguousarray(win.transpose(0, 1, 2, 4, 5, 3)).reshape(n * oh * ow, kh * kw * c)
    return (cols @ weight.reshape(kh * kw * c, co)).reshape(n, oh, ow, co)


def max_rel_error(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(got - ref).max() / max(float(np.abs(ref).max()), 1e-30))
