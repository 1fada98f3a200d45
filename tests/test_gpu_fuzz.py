"""A fixed-seed sweep of the GPU search (search.gpu_rules, search.gpu_annotate) over small operators of the kinds
models have (element-wise and broadcast, long and short reductions, softmax, layer norm, matmuls, convolutions
plain, strided, depthwise and transposed, pooling, layout changes, a gather) and over the tasks of random ONNX
models: every sketch samples and lowers without a fault, every task gets valid programs, and a random program of
each operator run under the CPU emulation of CUDA computes what NumPy does. The tests after the sweep pin the
faults it found."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from fuzz_graphs import random_model
from te_eval import evaluate

from tensorgen import build, te
from tensorgen.errors import ScheduleError
from tensorgen.graph import extract_tasks, load_graph
from tensorgen.measure.runner import compare_outputs
from tensorgen.schedule.state import State
from tensorgen.search.sketch import generate_sketches
from tensorgen.search.targets import for_target
from tensorgen.task import SearchTask
from tensorgen.te import ops
from tensorgen.tuning.tune import make_task

EMULATED = "cuda -emulate=1"
DRAWS = 3  # random programs per sketch


def x(*shape: int, name: str = "X") -> te.Tensor:
    return te.placeholder(shape, name=name)


def unary(f: Callable[[te.Tensor], te.Tensor], *shape: int) -> Callable[[], list[te.Tensor]]:
    def make() -> list[te.Tensor]:
        a = x(*shape)
        return [a, f(a)]
    return make


def binary(f: Callable[[te.Tensor, te.Tensor], te.Tensor], a: tuple[int, ...],
           b: tuple[int, ...]) -> Callable[[], list[te.Tensor]]:
    def make() -> list[te.Tensor]:
        p, q = x(*a, name="A"), x(*b, name="B")
        return [p, q, f(p, q)]
    return make


def layer_norm() -> list[te.Tensor]:
    a, gamma, beta = x(6, 50), x(50, name="G"), x(50, name="B")
    return [a, gamma, beta, ops.layer_norm(a, gamma, beta)]


def dense() -> list[te.Tensor]:
    a, w, b = x(2, 300, name="A"), x(10, 300, name="W"), x(10, name="B")
    return [a, w, b, ops.dense(a, w, b)]


def concat() -> list[te.Tensor]:
    a, b, c = x(3, 4, name="A"), x(3, 1, name="B"), x(3, 5, name="C")
    return [a, b, c, ops.concatenate([a, b, c], axis=1)]


def gather() -> list[te.Tensor]:  # an embedding lookup: int64 ids index the table's rows
    table, ids = x(50, 24, name="table"), te.placeholder((3, 7), "int64", name="ids")
    return [table, ids, te.compute((3, 7, 24), lambda i, j, k: table[ids[i, j], k], name="gather")]


def reserved_names() -> list[te.Tensor]:  # ONNX's And, Or, Not name stages after C++'s alternative tokens
    a, b = x(4, 70, name="not"), x(4, 70, name="class")
    both = ops.mul(a, b, name="and")
    return [a, b, ops.add(ops.reduce_sum(both, axis=1, keepdims=True, name="or"), both, name="xor")]


OPERATORS: dict[str, Callable[[], list[te.Tensor]]] = {
    "elementwise": unary(lambda a: ops.sigmoid(ops.tanh(ops.gelu(a))), 33, 17),
    "broadcast": binary(ops.add, (4, 1), (1, 6)),
    "scalar": unary(ops.relu, 1),
    "sum_long_rows": unary(lambda a: ops.reduce_sum(a, axis=1), 3, 4099),
    "sum_first_axis": unary(lambda a: ops.reduce_sum(a, axis=0), 999, 3),
    "max_middle_axis": unary(lambda a: ops.reduce_max(a, axis=1), 3, 37, 11),
    "sum_to_scalar": unary(ops.reduce_sum, 5, 7, 9),
    "softmax": unary(ops.softmax, 1, 1000),
    "log_softmax_axis1": unary(lambda a: ops.softmax(a, axis=1, log_softmax=True), 7, 33, 3),
    "layer_norm": layer_norm,
    "matmul_primes": binary(ops.matmul, (29, 31), (31, 23)),
    "batch_matmul_thin": binary(ops.batch_matmul, (2, 1, 64), (2, 64, 3)),
    "dense": dense,
    "conv2d": binary(lambda a, w: ops.conv2d(a, w, 1, 1), (1, 9, 9, 6), (3, 3, 6, 10)),
    "conv2d_rect_stride": binary(lambda a, w: ops.conv2d(a, w, (2, 1), (1, 0)), (2, 9, 11, 5), (3, 1, 5, 6)),
    "depthwise_conv2d": binary(lambda a, w: ops.relu6(ops.depthwise_conv2d(a, w, 2, 1)), (1, 15, 15, 8),
                               (3, 3, 1, 8)),
    "conv2d_transpose": binary(lambda a, w: ops.conv2d_transpose(a, w, 2, 1), (1, 5, 5, 4), (3, 3, 4, 2)),
    "max_pool": unary(lambda a: ops.max_pool2d(a, 3, 2, 1), 1, 13, 13, 24),
    "global_avg_pool": unary(ops.global_avg_pool2d, 2, 7, 7, 40),
    "transpose": unary(lambda a: ops.transpose(a, (2, 0, 1)), 3, 5, 7),
    "reshape": unary(lambda a: ops.reshape(a, (5, 42)), 6, 35),
    "pad": unary(lambda a: ops.pad(a, (1, 2), (3, 0)), 5, 6),
    "concat": concat,
    "gather": gather,
    "reserved_names": reserved_names,
}

FUZZ_SEEDS = (3, 11, 21)  # random ONNX models of matmuls, convs, norms, gathers, slices, pools


def programs(task: SearchTask) -> list[State]:
    """The valid programs among DRAWS random ones per sketch of `task` (fixed seeds); a fault raises."""
    search = for_target(task)
    out = []
    for k, sketch in enumerate(generate_sketches(task)):
        for j in range(DRAWS):
            try:
                state = search.sample(task, sketch, np.random.default_rng([k, j]), search.annotation())
            except ScheduleError:  # no tile sizes within the GPU's limits this time
                continue
            if search.valid(task, state):
                out.append(state)
    return out


def inputs(task: SearchTask) -> dict[te.Tensor, np.ndarray]:
    rng = np.random.default_rng(0)
    return {t: rng.integers(0, 50, t.shape) if t.dtype == "int64" else rng.uniform(-1, 1, t.shape).astype(t.dtype)
            for t in task.dag.inputs}


@pytest.mark.parametrize("name", OPERATORS)
def test_random_gpu_programs_of_each_operator_compute_it_under_emulation(name):
    task = make_task(OPERATORS[name](), EMULATED)
    valid = programs(task)
    assert valid, f"{name}: no valid GPU program"
    state = valid[len(valid) // 2]
    feed = inputs(task)
    got = build(state, target=EMULATED).run(*(feed[t] for t in task.dag.inputs))
    why = compare_outputs(got, evaluate(task.dag.outputs, feed), [t.name for t in task.dag.outputs], 1e-4)
    assert why is None, f"{why}\n{state}"


@pytest.mark.parametrize("seed", FUZZ_SEEDS)
def test_every_task_of_a_random_model_gets_valid_gpu_programs(seed):
    tasks = extract_tasks(load_graph(random_model(np.random.default_rng(seed))), EMULATED)
    for model_task in tasks:
        assert programs(model_task.task), f"{model_task.task.desc}: no valid GPU program"
