"""Thread footprints of loop nests (loopir.footprint) and the partition alignment of a model's kernels
(graph.align): a consumer whose parallel loop splits another axis than its producer's is reordered to
read what its own thread wrote, and computes the same result."""

from __future__ import annotations

import ctypes

import numpy as np

from tensorgen import te
from tensorgen.codegen.c import render_c
from tensorgen.codegen.toolchain import compile_source
from tensorgen.dag import ComputeDAG
from tensorgen.graph.backend.align import align_partitions, digits, position
from tensorgen.loopir.footprint import accesses, points, static_thread, touched
from tensorgen.schedule import State
from tensorgen.schedule.lower import lower

SHAPE = (16, 16, 64)  # (h, w, c), channels last as a model's activations are


def _producer():
    """B = A * 2, thread t writing channel half t."""
    a = te.placeholder(SHAPE, name="A")
    b = te.compute(SHAPE, lambda h, w, c: a[h, w, c] * 2.0, name="B")
    s = State(ComputeDAG(b))
    s.split("B", "c", [32])
    s.reorder("B", ["c_0", "h", "w", "c_1"])
    s.parallel("B", "c_0")
    return lower(s, "producer")


def _consumer(weight_floats: int = 0):
    """C = B + 1 over a parallel loop fused from (w half, c half): as tuned, thread t takes column half t.
    With `weight_floats`, C also adds a weight of two panels of that many floats, one per channel half,
    which the tuned order keeps for a run of iterations (channel half outer)."""
    b = te.placeholder(SHAPE, name="B")
    args = [b]
    if weight_floats:
        wt = te.placeholder((2, weight_floats), name="W", constant=True)
        c = te.compute(SHAPE, lambda h, w, c: b[h, w, c] + wt[c // 32, h * 8 + w % 8], name="C")
        args.append(wt)
    else:
        c = te.compute(SHAPE, lambda h, w, c: b[h, w, c] + 1.0, name="C")
    s = State(ComputeDAG([*args, c]))
    s.split("C", "w", [8])
    s.split("C", "c", [32])
    order = ["c_0", "w_0"] if weight_floats else ["w_0", "c_0"]
    s.reorder("C", [*order, "h", "w_1", "c_1"])
    s.fuse("C", order)
    s.parallel("C", f"{order[0]}_{order[1]}_f")
    return lower(s, "consumer")


def _reads_from_other_thread(producer, consumer) -> float:
    rng = np.random.default_rng(0)
    owner = np.full(np.prod(SHAPE), -1)
    for a in accesses(producer.body):
        if a.store:
            index, iteration = touched(a, points(a, 1 << 20, rng))
            owner[index] = static_thread(iteration, a.parallel.extent, 2)
    (load,) = [a for a in accesses(consumer.body) if not a.store]
    index, iteration = touched(load, points(load, 1 << 20, rng))
    return float(np.mean(owner[index] != static_thread(iteration, load.parallel.extent, 2)))


def test_static_thread_is_openmps_static_schedule():
    assert static_thread(np.arange(7), 7, 2).tolist() == [0, 0, 0, 0, 1, 1, 1]
    assert static_thread(np.arange(6), 6, 4).tolist() == [0, 0, 1, 1, 2, 3]


def test_digits_and_positions_of_a_fused_loop():
    loop = _consumer().body
    assert loop.kind == "parallel" and digits(loop) == [2, 2]  # (c_0, w_0), least significant first
    it = np.arange(4)
    assert position(it, [2, 2], (1, 0)).tolist() == [0, 1, 2, 3]  # the tuned order
    assert position(it, [2, 2], (0, 1)).tolist() == [0, 2, 1, 3]  # channel half first


def test_consumer_is_reordered_to_its_producers_split_and_stays_correct():
    producer, consumer = _producer(), _consumer()
    assert _reads_from_other_thread(producer, consumer) == 0.5
    same, aligned = align_partitions([producer, consumer], [["A", "B"], ["B", "C"]], threads=2)
    assert same is producer and aligned is not consumer
    assert _reads_from_other_thread(producer, aligned) == 0.0
    assert align_partitions([producer, consumer], [["A", "B"], ["B", "C"]], threads=1)[1] is consumer

    lib = ctypes.CDLL(str(compile_source(render_c(aligned, 64))))
    x = np.random.default_rng(1).standard_normal(SHAPE).astype(np.float32)
    out = np.zeros_like(x)
    lib.consumer(ctypes.c_void_p(x.ctypes.data), ctypes.c_void_p(out.ctypes.data))
    np.testing.assert_allclose(out, x + 1.0)


def test_a_gathers_data_dependent_index_touches_nothing_known():
    table = te.placeholder((100, 8), name="T")
    ids = te.placeholder((4,), dtype="int32", name="I")
    out = te.compute((4, 8), lambda i, j: table[ids[i], j], name="G")
    func = lower(State(ComputeDAG(out)), "gather")
    (load,) = [a for a in accesses(func.body) if a.buffer.name == "T"]
    index, iteration = touched(load, points(load, 1000, np.random.default_rng(0)))
    assert len(index) == len(iteration) == 0


def test_a_reorder_that_would_reload_big_weight_panels_is_not_taken():
    """A consumer that keeps one weight panel per thread as tuned (channel half outer), after a producer
    that split the columns: matching the columns would switch panels every iteration. With 1 MB panels
    that costs more than the cross-core reads it saves; with 512-byte ones (cached anyway) it does not."""
    a = te.placeholder(SHAPE, name="A")
    b = te.compute(SHAPE, lambda h, w, c: a[h, w, c] * 2.0, name="B")
    s = State(ComputeDAG(b))
    s.split("B", "w", [8])
    s.reorder("B", ["w_0", "h", "w_1", "c"])
    s.parallel("B", "w_0")  # thread t writes column half t
    producer = lower(s, "producer")
    for floats, reordered in ((1 << 18, False), (128, True)):
        consumer = _consumer(weight_floats=floats)
        out = align_partitions([producer, consumer], [["A", "B"], ["B", "W", "C"]], threads=2)
        assert (out[1] is not consumer) == reordered
