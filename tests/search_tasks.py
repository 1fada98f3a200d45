"""Small search tasks shared by the sketch and evolution tests."""

from tensorgen.dag import ComputeDAG
from tensorgen.search.task import SearchTask
from tensorgen.target import HardwareParams, Target
from tensorgen.te import ops


def make_task(inputs, outputs, cores: int = 4) -> SearchTask:
    return SearchTask(ComputeDAG(list(inputs) + list(outputs)), Target.parse("cpu"), HardwareParams(cores=cores))


def gmm(n: int = 64) -> SearchTask:
    return make_task(*ops.make_gmm(n, n, n))


def c2d_relu() -> SearchTask:
    ins, (conv,) = ops.make_c2d(8, 8, 16, 16, 3, 1, 1)
    return make_task(ins, [ops.relu(conv)])


def nrm() -> SearchTask:
    return make_task(*ops.make_nrm(256, 256))
