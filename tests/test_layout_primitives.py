"""Layout primitives (tensorgen.schedule.layout, ALT §4.1): random primitive sequences on random shapes, each
layout checked against NumPy — the packed array holds every element where `index` says, `source_index` says
what every place holds, unpack and the inverse primitives undo it, and records replay."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorgen.errors import ScheduleError
from tensorgen.loopir.footprint import evaluate
from tensorgen.schedule.layout import (
    Fold,
    Fuse,
    Layout,
    LayoutPrimitive,
    Pad,
    Reorder,
    Split,
    StoreAt,
    Unfold,
    inverse_primitives,
)
from tensorgen.te.expr import Var


def _divisor_pair(n: int, draw) -> tuple[int, int]:
    a = draw(st.sampled_from([d for d in range(1, n + 1) if n % d == 0]))
    return a, n // a


@st.composite
def layouts(draw, unfold: bool = True, store: bool = False):
    """A random shape, primitives and their layout; `store`: a guest stored at one dimension first."""
    shape = tuple(draw(st.lists(st.sampled_from([1, 2, 3, 4, 6, 8, 12]), min_size=1, max_size=4)))
    layout, prims = Layout.identity(shape), []
    if store:  # at a dimension of more than one element (one of 1 has no digit to lengthen)
        shape = (*shape, 2)
        layout = Layout.identity(shape)
        prims.append(StoreAt(draw(st.sampled_from([d for d, n in enumerate(shape) if n > 1])), "guest"))
        layout = prims[0].apply(layout)
    for _ in range(draw(st.integers(0, 5))):
        n = len(layout.dims)
        kind = draw(st.sampled_from(["split", "reorder", "fuse", "pad", "unfold"] if unfold else
                                    ["split", "reorder", "fuse", "pad"]))
        dim = draw(st.integers(0, n - 1))
        extent = layout.new_shape[dim]
        if kind == "split":
            prim = Split(dim, _divisor_pair(extent, draw))
        elif kind == "reorder":
            prim = Reorder(tuple(draw(st.permutations(range(n)))))
        elif kind == "fuse":
            prim = Fuse(dim, draw(st.integers(dim, n - 1)))
        elif kind == "pad":
            prim = Pad(dim, draw(st.integers(0, 3)))
        else:
            tile = draw(st.integers(2, max(2, extent)))
            prim = Unfold(dim, tile, draw(st.integers(1, tile - 1)))
        try:
            layout = prim.apply(layout)
        except ScheduleError:
            continue  # a primitive this layout does not admit (a split cutting a digit, a pad of a split dim)
        prims.append(prim)
    return shape, prims, layout


def _grid(shape):
    idx = np.indices(shape).reshape(len(shape), -1)
    axes = [Var(f"a{d}", "int32", n) for d, n in enumerate(shape)]
    return idx, axes, {a: i for a, i in zip(axes, idx)}


def _values(exprs, env, count):
    return [np.broadcast_to(evaluate(e, env), (count,)) for e in exprs]


@settings(max_examples=200, deadline=None)
@given(layouts())
def test_every_place_holds_its_source_element(case):
    shape, prims, layout = case
    array = np.arange(1, math.prod(shape) + 1, dtype=np.int64).reshape(shape)
    packed = layout.pack(array)
    assert packed.shape == layout.new_shape
    idx, axes, env = _grid(layout.new_shape)
    source = _values(layout.source_index(axes), env, idx.shape[1])
    valid = np.ones(idx.shape[1], bool)
    cond = layout.in_bounds(axes)
    if cond is not None:
        valid = np.broadcast_to(evaluate(cond, env), valid.shape)
    assert all((s[valid] < n).all() and (s[valid] >= 0).all() for s, n in zip(source, shape))
    flat_packed = packed.reshape(-1)
    expected = array[tuple(np.minimum(s, n - 1) for s, n in zip(source, shape))]
    np.testing.assert_array_equal(flat_packed[valid], expected[valid])
    assert (flat_packed[~valid] == 0).all()  # padding reads as zero
    assert layout.is_padded == (not valid.all())


@settings(max_examples=200, deadline=None)
@given(layouts())
def test_every_element_is_read_where_index_points(case):
    shape, prims, layout = case
    array = np.arange(1, math.prod(shape) + 1, dtype=np.int64).reshape(shape)
    packed = layout.pack(array)
    idx, axes, env = _grid(shape)
    tiles = {}
    for d in range(len(shape)):  # an unfolded dimension: each element read from the last tile that holds it
        tile = next((p for parts in layout.dims for p in parts if p.dim == d and p.window), None)
        if tile is not None:
            tiles[d] = np.minimum(idx[d] // tile.place, tile.extent - 1)
    tile_vars = {d: Var(f"t{d}", "int32") for d in tiles}
    env.update({tile_vars[d]: t for d, t in tiles.items()})
    where = _values(layout.index(axes, tiles=tile_vars), env, idx.shape[1])
    np.testing.assert_array_equal(packed[tuple(where)], array.reshape(-1))
    np.testing.assert_array_equal(layout.unpack(packed), array)


@settings(max_examples=100, deadline=None)
@given(layouts())
def test_inverse_primitives_undo_the_layout(case):
    shape, prims, layout = case
    inverse = inverse_primitives(shape, prims)
    back = layout
    for p in inverse:
        back = p.apply(back)
    assert back.new_shape == shape
    array = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    np.testing.assert_array_equal(Layout.of(shape, [*prims, *inverse]).pack(array), array)


@settings(max_examples=50, deadline=None)
@given(layouts())
def test_primitives_replay_from_json_and_print_as_python(case):
    shape, prims, layout = case
    records = json.loads(json.dumps([p.to_json() for p in prims]))
    assert Layout.of(shape, [LayoutPrimitive.from_json(r) for r in records]) == layout
    for p in prims:
        assert p.to_python().startswith(f"{p.name}(")


def test_blocked_channel_layouts():
    """§4.1: NOHW -> N(O/ot)HW(ot) by split and reorder (NCHW16c-style), and NHWO -> N(O/4)(HW)4 by fuse too."""
    x = np.arange(32 * 9).reshape(1, 32, 3, 3)
    nchwc = Layout.of(x.shape, [Split(1, (2, 16)), Reorder((0, 1, 3, 4, 2))])
    np.testing.assert_array_equal(nchwc.pack(x), x.reshape(1, 2, 16, 3, 3).transpose(0, 1, 3, 4, 2))
    y = np.arange(128).reshape(1, 4, 4, 8)
    blocked = Layout.of(y.shape, [Split(3, (2, 4)), Reorder((0, 3, 1, 2, 4)), Fuse(2, 3)])
    np.testing.assert_array_equal(blocked.pack(y), y.reshape(1, 16, 2, 4).transpose(0, 2, 1, 3))


def test_unfold_is_overlapped_tiling():
    """§4.1.2: {1, 2, 3, 4, 5} unfolded with tile 3, stride 2 is {{1, 2, 3}, {3, 4, 5}}; fold undoes it."""
    layout = Layout.of((5,), [Unfold(0, 3, 2)])
    np.testing.assert_array_equal(layout.pack(np.arange(1, 6)), [[1, 2, 3], [3, 4, 5]])
    assert Fold(0, 5).apply(layout) == Layout.identity((5,))
    ragged = Layout.of((6,), [Unfold(0, 3, 2)])  # the last tile runs past the end: padded
    np.testing.assert_array_equal(ragged.pack(np.arange(1, 7)), [[1, 2, 3], [3, 4, 5], [5, 6, 0]])


@pytest.mark.parametrize(("prims", "message"), [
    ([Split(0, (3, 3))], "multiply to 8"),
    ([Fuse(0, 1), Split(0, (3, 16))], "cuts a digit"),  # 16 places across the 6 of dimension 1
    ([Reorder((0, 0))], "no permutation"),
    ([Split(0, (2, 4)), Pad(0, 1)], "not split, fused or unfolded"),
    ([Unfold(0, 3, 4)], "stride"),
    ([Unfold(0, 8, 4)], "the dimension itself"),  # one tile: its digit of extent 1 got lost in fuse + split
    ([Fuse(1, 0)], "fuse"),
])
def test_bad_primitives_say_why(prims, message):
    with pytest.raises(ScheduleError, match=message):
        Layout.of((8, 6), prims)


@settings(max_examples=100, deadline=None)
@given(layouts(unfold=False, store=True))
def test_a_stored_guest_is_read_where_its_index_points_and_decouples(case):
    """store_at: the host's elements and the guest's (shape: the host's without the dimension) are each where
    `index` (of `guest_index` for the guest) points; the inverse primitives give the host back; records replay."""
    shape, prims, layout = case
    d = prims[0].dim
    rng = np.random.default_rng(0)
    host = rng.standard_normal(shape).astype(np.float32)
    guest_shape = tuple(n for e, n in enumerate(shape) if e != d) or (1,)  # a 1-d host's guest: one element
    guest = rng.standard_normal(guest_shape).astype(np.float32)
    packed = layout.pack(host, {"guest": guest})
    idx, axes, env = _grid(shape)
    np.testing.assert_array_equal(packed[tuple(_values(layout.index(axes), env, idx.shape[1]))], host.reshape(-1))
    gidx, gaxes, genv = _grid(guest_shape)
    where = _values(layout.index(layout.guest_index(d, guest_shape, gaxes)), genv, gidx.shape[1])
    np.testing.assert_array_equal(packed[tuple(where)], guest.reshape(-1))
    np.testing.assert_array_equal(layout.unpack(packed), host)
    back = Layout.of(shape, [*prims, *inverse_primitives(shape, prims)])
    assert back.new_shape == shape and not back.guests
    records = json.loads(json.dumps([p.to_json() for p in prims]))
    assert Layout.of(shape, [LayoutPrimitive.from_json(r) for r in records]) == layout
    assert prims[0].to_python() == f"store_at({d}, 'guest')"


@pytest.mark.parametrize(("prims", "message"), [
    ([StoreAt(0, "g"), StoreAt(1, "g")], "stored once"),
    ([Pad(0, 1), StoreAt(0, "g")], "neither padded"),
    ([Split(0, (2, 4)), StoreAt(0, "g")], "not split, fused or unfolded"),
])
def test_bad_store_at_says_why(prims, message):
    with pytest.raises(ScheduleError, match=message):
        Layout.of((8, 6), prims)
