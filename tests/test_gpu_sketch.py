"""Ansor's GPU search space (search.gpu_rules, search.gpu_annotate, search.targets): the sketches of CUDA tasks, random
programs of every sketch lowered and rendered as CUDA within the GPU's limits, mutations, and a sample of the
programs run under the CPU emulation of CUDA against NumPy."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from cuda_run import run
from te_eval import evaluate

from tensorgen import te
from tensorgen.codegen.cuda import launch_of, render_cuda, split_kernels
from tensorgen.codegen.cuda_toolchain import compile_cuda
from tensorgen.dag import ComputeDAG
from tensorgen.hardware import hardware_for
from tensorgen.loopir.nodes import Allocate, statements
from tensorgen.schedule.lower import lower
from tensorgen.schedule.state import State
from tensorgen.schedule.steps import PragmaStep
from tensorgen.search.gpu_annotate import GpuAnnotationPolicy, block_of, is_valid_gpu
from tensorgen.search.mutations import DEFAULT_MUTATIONS, mutate
from tensorgen.search.random_policy import RandomPolicy
from tensorgen.search.rules import DEFAULT_RULES
from tensorgen.search.sketch import generate_sketches
from tensorgen.search.targets import GPU_MUTATIONS, for_target
from tensorgen.target import Target
from tensorgen.task import SearchTask
from tensorgen.te import ops
from tensorgen.te.ops import suite

HW = hardware_for("cuda")


def cuda_task(tensors) -> SearchTask:
    return SearchTask(ComputeDAG(tensors), Target.parse("cuda"), HW)


def gmm(m=64, n=48, k=40):
    a, b = te.placeholder((m, k), name="A"), te.placeholder((k, n), name="B")
    return [a, b, ops.matmul(a, b, name="C")]


def matmul_relu():  # extents that share few factors: 60 x 50, k 70
    a, b = te.placeholder((60, 70), name="A"), te.placeholder((70, 50), name="B")
    return [a, b, ops.relu(ops.matmul(a, b))]


def batch_matmul():
    a, b = te.placeholder((3, 20, 30), name="A"), te.placeholder((3, 30, 24), name="B")
    return [a, b, ops.batch_matmul(a, b)]


def conv2d():
    ins, outs = suite.make_c2d(10, 10, 8, 16, 3, 1, 1)
    return [*ins, *outs]


def softmax():
    x = te.placeholder((6, 100), name="X")
    return [x, ops.softmax(x)]


def elementwise():  # 37 x 53: no thread count divides it
    x, y = te.placeholder((37, 53), name="X"), te.placeholder((37, 53), name="Y")
    return [x, y, ops.relu(ops.mul(ops.add(x, y), 2.0))]


def row_sums():  # 4 outputs of 3000 terms each: a reduction with little space parallelism
    x = te.placeholder((4, 3000), name="X")
    return [x, ops.reduce_sum(x, axis=1)]


def thin_matmul():  # 4 x 4 outputs of 512 terms: cross-thread reduction besides tiling
    a, b = te.placeholder((4, 512), name="A"), te.placeholder((512, 4), name="B")
    return [a, b, ops.matmul(a, b)]


WORKLOADS = {f.__name__: f for f in (gmm, matmul_relu, batch_matmul, conv2d, softmax, elementwise, row_sums,
                                      thin_matmul)}


def sketch_text(sketches: list[State]) -> list[str]:
    return [str(s) for s in sketches]


def test_cuda_tasks_take_the_gpu_tables_and_cpu_tasks_keep_theirs():
    cpu = SearchTask(ComputeDAG(gmm()), Target.parse("cpu"), hardware_for("cpu"))
    assert for_target(cpu).rules is DEFAULT_RULES and for_target(cpu).mutations is DEFAULT_MUTATIONS
    assert sketch_text(generate_sketches(cpu)) == sketch_text(generate_sketches(cpu, DEFAULT_RULES))
    cuda = for_target(cuda_task(gmm()))
    assert cuda.mutations is GPU_MUTATIONS and isinstance(cuda.annotation(), GpuAnnotationPolicy)
    assert cuda.annotation().unroll_steps == (0, 16, 64, 512, 1024)


def test_the_gpu_matmul_sketch_is_ansors():
    (sketch,) = generate_sketches(cuda_task(gmm()))
    text = str(sketch)
    assert "s.cache_write('C', 'local')" in text
    assert "s.split('C_local', 'i', [None, None, None, None])" in text  # SSSRRSRS: five space levels
    assert "s.split('C_local', 'k', [None, None])" in text  # three reduction levels
    assert "s.compute_at('C_local', 'C', 'j_2')" in text  # fused at the thread level
    for operand in "AB":  # shared tiles at the outer reduction tile
        assert f"s.cache_read('{operand}', 'shared', ['C_local'])" in text
        assert f"s.compute_at('{operand}_shared', 'C_local', 'k_0')" in text


def test_gpu_sketches_inline_fuse_and_factor_reductions():
    (relu,) = generate_sketches(cuda_task(matmul_relu()))
    assert "s.compute_at('matmul', 'relu', 'i1_2')" in str(relu) and "cache_write" not in str(relu)
    (chain,) = generate_sketches(cuda_task(elementwise()))
    assert [st.location for st in chain.stages if not st.is_placeholder] == ["inline", "inline", "root"]
    (conv,) = generate_sketches(cuda_task(conv2d()))
    assert "s.compute_inline('pad')" in str(conv) and "s.compute_at('pad_shared', 'conv2d_local', 'rc_0')" \
        in str(conv)
    # a long reduction is offered with and without partial sums (softmax: two reductions, four sketches)
    for make, n in ((row_sums, 2), (thin_matmul, 2), (softmax, 4), (gmm, 1)):
        sketches = generate_sketches(cuda_task(make()))
        assert len(sketches) == n and sum("rfactor" not in str(s) for s in sketches) == 1, make.__name__


def test_an_operand_read_at_two_indices_is_not_copied_to_shared_memory():
    """A @ A reads A at [i, k] and at [k, j]: one shared copy of it would hold the tiles of both, i.e. all of A (64
    KiB here, more than a block may have), so that no tile sizes fit and the task had no valid program."""
    a = te.placeholder((128, 128), name="A")
    task = cuda_task([a, ops.matmul(a, a, name="C")])
    (sketch,) = generate_sketches(task)
    assert "cache_read" not in str(sketch) and "s.cache_write('C', 'local')" in str(sketch)
    state = for_target(task).sample(task, sketch, np.random.default_rng(0), None)
    assert is_valid_gpu(state, HW)


def shared_bytes(func) -> list[int]:
    """Per kernel, the bytes of shared memory its tiles take."""
    _, nests = split_kernels(func.body)
    return [sum(s.buffer.nbytes for s in statements(nest) if isinstance(s, Allocate) and s.buffer.scope == "shared")
            for nest in nests]


@pytest.mark.parametrize("name", WORKLOADS)
def test_random_gpu_programs_lower_and_render_within_the_limits(name):
    task = cuda_task(WORKLOADS[name]())
    search = for_target(task)
    rng = np.random.default_rng(0)
    policy = GpuAnnotationPolicy()
    for sketch in generate_sketches(task):
        for _ in range(6):
            state = search.sample(task, sketch, rng, policy)
            func = lower(state, "prog", gpu=True)
            render_cuda(func, HW.max_threads_per_block, HW.shared_mem_per_block)
            _, nests = split_kernels(func.body)
            assert all(launch_of(nest).threads <= HW.max_threads_per_block for nest in nests)
            assert all(b <= HW.shared_mem_per_block for b in shared_bytes(func))
            for i in range(len(state.stages)):
                if (block := block_of(state, i)) is not None:
                    assert block.vthreads <= policy.max_vthread and block.local <= policy.max_local_tile
                    assert block.fits(HW, policy)


def grouped_conv2d():  # 128 output channels a group: a block of 32 of them straddles two groups' inputs
    ins, outs = suite.make_grp(7, 7, 512, 512, 3, 1, 1, 4)
    return [*ins, *outs]


@pytest.mark.parametrize("make", [grouped_conv2d, conv2d, gmm])
def test_the_shared_memory_a_tiling_asks_for_is_what_lowering_allocates(make):
    """block_of's shared bytes, which the sampler keeps within the GPU's, are those of the lowered program: a
    virtual thread's tiles (the tiles of all of a block's virtual threads were counted), from a block anywhere
    (one at the start of each axis was assumed: a grouped conv's block of output channels that straddles two
    groups fetches both groups' inputs)."""
    task = cuda_task(make())
    (sketch,) = generate_sketches(task)
    for j in range(12):
        state = for_target(task).sample(task, sketch, np.random.default_rng(j), None)
        blocks = [b for i in range(len(state.stages)) if (b := block_of(state, i)) is not None]
        assert sum(b.shared_bytes for b in blocks) == sum(shared_bytes(lower(state, gpu=True))), str(state)


def test_threads_fetch_shared_tiles_together_and_blocks_are_whole_warps_where_they_can_be():
    task = cuda_task(gmm(256, 256, 128))
    (sketch,) = generate_sketches(task)
    rng = np.random.default_rng(3)
    for _ in range(8):
        state = for_target(task).sample(task, sketch, rng, None)
        threads = {st.name: [it.extent for it in st.iters if it.annotation == "threadIdx.x"] for st in state.stages}
        (block,) = threads["C"]
        assert block % HW.warp_size == 0
        for tile in ("A_shared", "B_shared"):  # split by the block's thread count (or smaller than it)
            assert threads[tile] and threads[tile][0] <= block
            assert threads[tile][0] == block or len(state.stage(tile).iters) == 1


def test_gpu_mutations_make_valid_programs_or_none():
    task = cuda_task(gmm())
    (sketch,) = generate_sketches(task)
    rng = np.random.default_rng(5)
    parent = for_target(task).sample(task, sketch, rng, None)
    valid = 0
    for _ in range(40):
        child, rule = mutate(task, parent, rng, GPU_MUTATIONS)
        assert rule in GPU_MUTATIONS
        if child is not None and is_valid_gpu(child, HW):
            valid += 1
            pragmas = [s.pragma for s in child.steps if isinstance(s, PragmaStep)]
            assert all(int(p.partition("$")[2]) in (0, 16, 64, 512, 1024) for p in pragmas)
    assert valid >= 20


def test_random_policy_proposes_gpu_programs():
    task = cuda_task(row_sums())
    batch = RandomPolicy(task, seed=1).next_batch(6)
    assert len(batch) == 6 and all(is_valid_gpu(s, HW) for s in batch)


EMULATED = (("gmm", 0), ("matmul_relu", 0), ("batch_matmul", 0), ("conv2d", 0), ("softmax", 0), ("softmax", 3),
            ("elementwise", 0), ("row_sums", 0), ("thin_matmul", 0), ("thin_matmul", 1))


@pytest.mark.parametrize("name,sketch", EMULATED)
def test_random_gpu_programs_compute_what_numpy_does_under_emulation(name, sketch):
    tensors = WORKLOADS[name]()
    task = cuda_task(tensors)
    state = for_target(task).sample(task, generate_sketches(task)[sketch], np.random.default_rng(11), None)
    data = np.random.default_rng(2)
    feed = {t: data.uniform(-1, 1, t.shape).astype(t.dtype) for t in task.dag.inputs}
    outs = [np.full(t.shape, np.nan, t.dtype) for t in task.dag.outputs]
    run(render_cuda(lower(state, "prog", gpu=True)), "prog", *feed.values(), *outs)
    for got, want in zip(outs, evaluate(task.dag.outputs, feed)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_nvcc_compiles_a_random_gpu_matmul():
    task = cuda_task(gmm(128, 96, 80))
    state = for_target(task).sample(task, generate_sketches(task)[0], np.random.default_rng(4), None)
    assert compile_cuda(render_cuda(lower(state, "prog", gpu=True))).exists()
