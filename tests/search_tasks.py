"""Small search tasks shared by the sketch and evolution tests."""

from tensorgen import te
from tensorgen.dag import ComputeDAG
from tensorgen.schedule.state import State
from tensorgen.target import HardwareParams, Target
from tensorgen.task import SearchTask
from tensorgen.te import ops


def make_task(inputs, outputs, cores: int = 4, l2_bytes: int = 512 * 1024) -> SearchTask:
    hw = HardwareParams(cores=cores, l2_bytes=l2_bytes)
    return SearchTask(ComputeDAG(list(inputs) + list(outputs)), Target.parse("cpu"), hw)


def gmm(n: int = 64) -> SearchTask:
    """GMM on a machine whose L2 is smaller than B, so that B's packing is among the sketches
    (rules.PackOperand), as for GMM 1024 on a real one."""
    return make_task(*ops.make_gmm(n, n, n), l2_bytes=4 * n * n - 1)


def c2d_relu() -> SearchTask:
    ins, (conv,) = ops.make_c2d(8, 8, 16, 16, 3, 1, 1)
    return make_task(ins, [ops.relu(conv)])


def nrm() -> SearchTask:
    return make_task(*ops.make_nrm(256, 256))


def cached_gmm(m: int, n: int, k: int) -> State:
    """C = A @ B (A: m x k, B: k x n) with its accumulation in a cache stage C_local, untiled."""
    a = te.placeholder((m, k), name="A")
    b = te.placeholder((k, n), name="B")
    r = te.reduce_axis(k, "k")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    s = State([a, b, c])
    s.cache_write("C", "local")
    return s
