"""The thread pool of a model's module (codegen.pool): every iteration of every loop runs exactly once, with
any team size, oversubscribed, from two calling threads at once, and after fork(); kernels rendered on it
compute what NumPy does."""

import ctypes
import os
import threading

import numpy as np
import pytest

from tensorgen import te
from tensorgen.codegen.c import render_module
from tensorgen.codegen.toolchain import compile_source
from tensorgen.dag import ComputeDAG
from tensorgen.schedule.lower import lower
from tensorgen.schedule.state import State

COUNTING = """
static void count_body(void* ctx, int64_t begin, int64_t end) {
  int* hits = (int*)ctx;
  for (int64_t i = begin; i < end; ++i) __atomic_add_fetch(&hits[i], 1, __ATOMIC_RELAXED);
}
/* `reps` loops over each n in [1, max_n], counting into hits (max_n ints) */
void count(int* hits, int max_n, int reps) {
  for (int r = 0; r < reps; ++r)
    for (int n = 1; n <= max_n; ++n) tensorgen_parallel_for(count_body, hits, n);
}
"""


@pytest.fixture(scope="module")
def pool_lib():
    lib = ctypes.CDLL(str(compile_source(render_module([], scratch=True, tail=COUNTING))))
    lib.count.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    lib.tensorgen_set_num_threads.argtypes = [ctypes.c_int]
    return lib


def expected_hits(max_n: int, reps: int) -> np.ndarray:
    return reps * (max_n - np.arange(max_n)).astype(np.int32)  # index i is in every loop with n > i


@pytest.mark.parametrize("threads", [1, 2, 3, 8])  # 8 on a 2-core machine: workers are preempted mid-loop
def test_every_iteration_runs_exactly_once(pool_lib, threads):
    pool_lib.tensorgen_set_num_threads(threads)
    max_n, reps = 37, 300
    hits = np.zeros(max_n, np.int32)
    pool_lib.count(hits.ctypes.data, max_n, reps)
    np.testing.assert_array_equal(hits, expected_hits(max_n, reps))
    assert pool_lib.tensorgen_get_max_threads() == threads


def test_two_callers_at_once(pool_lib):
    """A second caller while the pool is busy runs its loops alone; both results are right."""
    pool_lib.tensorgen_set_num_threads(2)
    max_n, reps = 50, 400
    results = [np.zeros(max_n, np.int32) for _ in range(2)]
    threads = [threading.Thread(target=pool_lib.count, args=(h.ctypes.data, max_n, reps)) for h in results]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for h in results:
        np.testing.assert_array_equal(h, expected_hits(max_n, reps))


def test_pool_works_after_fork(pool_lib):
    pool_lib.tensorgen_set_num_threads(2)
    hits = np.zeros(20, np.int32)
    pool_lib.count(hits.ctypes.data, 20, 10)  # the parent's workers are running
    pid = os.fork()
    if pid == 0:  # the child has none until its first loop starts them again
        child = np.zeros(20, np.int32)
        pool_lib.count(child.ctypes.data, 20, 50)
        os._exit(0 if (child == expected_hits(20, 50)).all() else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_model_kernels_run_their_parallel_loops_on_the_pool():
    """A model's kernel: each outermost parallel loop, top-level or under a serial loop, becomes a function of
    the iterations it is given that takes what it reads in a struct; with a shared scratch buffer computed
    serially first and rows read across shares, the result is NumPy's for any team size."""
    a = te.placeholder((64, 32), name="A")
    b = te.compute((64, 32), lambda i, j: a[i, j] * 2.0, name="B")  # at root, serial: into the scratch
    c = te.compute((64, 32), lambda i, j: b[63 - i, j] + 1.0, name="C")  # reads rows another thread wrote
    top = State(ComputeDAG(c))
    top.parallel("C", "i")
    nested = State(ComputeDAG(c))
    nested.split("C", "i", [8])
    nested.parallel("C", "i_1")  # under the serial i_0 loop: its variable is passed in
    funcs = [lower(top, "top_f"), lower(nested, "nested_f")]
    tail = ("void run(const float* A, float* C, float* D, char* scratch) {\n  tensorgen_scratch = scratch;\n"
            "  top_f(A, C);\n  nested_f(A, D);\n}\n")
    source = render_module(funcs, scratch=True, tail=tail)
    assert "omp parallel" not in source
    assert "tensorgen_parallel_for(top_f_loop0_task, &top_f_loop0_in, 64);" in source
    assert "tensorgen_parallel_for(nested_f_loop0_task, &nested_f_loop0_in, 8);" in source
    assert "int32_t i_0, int64_t begin, int64_t end" in source  # the serial loop's variable, passed in
    lib = ctypes.CDLL(str(compile_source(source)))
    x = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    for threads in (1, 2, 3, 5):
        lib.tensorgen_set_num_threads(threads)
        out, out2, scratch = np.zeros_like(x), np.zeros_like(x), np.zeros(1 << 16, np.uint8)
        lib.run(*(ctypes.c_void_p(v.ctypes.data) for v in (x, out, out2, scratch)))
        np.testing.assert_allclose(out, x[::-1] * 2.0 + 1.0, rtol=1e-6)
        np.testing.assert_allclose(out2, x[::-1] * 2.0 + 1.0, rtol=1e-6)


def test_a_kernel_alone_runs_the_same_loop_function_as_in_a_model():
    """Tuning times a kernel alone (OpenMP) and the model runs it on the pool: both call one function of its
    iterations, the same text (gcc compiled the loop inlined into OpenMP's outlined body differently: a conv tile
    timed at 1.04 ms ran 1.78 ms in ResNet-50), and the OpenMP team's shares cover every iteration once for any
    team size, more threads than iterations included."""
    a = te.placeholder((5, 32), name="A")
    c = te.compute((5, 32), lambda i, j: a[i, j] * 2.0 + 1.0, name="C")
    s = State(ComputeDAG(c))
    s.parallel("C", "i")
    func = lower(s, "f")
    alone, model = render_module([func]), render_module([func], scratch=True)
    loop = alone[alone.index("static __attribute__((noinline)) void f_loop0("):]
    loop = loop[:loop.index("\n}\n") + 3]
    assert loop in model and "#pragma omp parallel\n" in alone and "omp parallel for" not in alone
    lib = ctypes.CDLL(str(compile_source(alone)))
    x = np.random.default_rng(0).standard_normal((5, 32)).astype(np.float32)
    for threads in (1, 2, 3, 5, 8):
        lib.tensorgen_set_num_threads(threads)
        out = np.full_like(x, np.nan)
        lib.f(*(ctypes.c_void_p(v.ctypes.data) for v in (x, out)))
        np.testing.assert_allclose(out, x * 2.0 + 1.0, rtol=1e-6)
