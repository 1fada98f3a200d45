"""Tests for compiling C kernels (toolchain) and calling them from numpy (runtime)."""

from __future__ import annotations

import math
import os
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from tensorgen.codegen import toolchain
from tensorgen.codegen.toolchain import compile_source, compiler_info, numbered_source
from tensorgen.errors import CompileError, RuntimeCallError
from tensorgen.runtime import ArgSpec, Module, set_num_threads

N = 1024
VADD = r"""
#include <stdint.h>
#include <omp.h>
typedef float v8f __attribute__((vector_size(32), aligned(4)));
void tensorgen_set_num_threads(int n) { omp_set_num_threads(n); }
int tensorgen_get_max_threads(void) { return omp_get_max_threads(); }
void vadd(float* restrict a, float* restrict b, float* restrict c) {
  #pragma omp parallel for
  for (int i = 0; i < 1024; i += 8) {
    *(v8f*)(c + i) = *(const v8f*)(a + i) + *(const v8f*)(b + i);
  }
}
void scale_i64(int64_t* restrict x, int64_t* restrict y) {
  for (int i = 0; i < 6; i++) y[i] = 3 * x[i];
}
"""
VADD_ARGS = [ArgSpec("A", (N,), "float32"), ArgSpec("B", (N,), "float32"), ArgSpec("C", (N,), "float32")]


@pytest.fixture(autouse=True)
def cache(fresh_kernel_cache: Path) -> Path:
    return fresh_kernel_cache


@pytest.fixture
def vadd() -> tuple[Module, object]:
    mod = Module(compile_source(VADD))
    return mod, mod.kernel("vadd", VADD_ARGS)


def _fake_cc(tmp_path: Path, body: str) -> str:
    path = tmp_path / "fakecc"
    path.write_text(f'#!/bin/sh\nif [ "$1" = --version ]; then echo "fakecc 1.0"; exit 0; fi\n{body}\n')
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_compile_load_call(cache: Path, vadd) -> None:
    mod, k = vadd
    assert mod.path.parent == cache and mod.path.suffix == ".so"
    assert mod.path.with_suffix(".c").read_text() == VADD
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(N, dtype=np.float32), rng.standard_normal(N, dtype=np.float32)
    c = np.zeros(N, np.float32)
    k(a, b, c)
    np.testing.assert_array_equal(c, a + b)
    x, y = np.arange(6, dtype=np.int64).reshape(2, 3), np.zeros((2, 3), np.int64)
    mod.kernel("scale_i64", [ArgSpec("x", (2, 3), "int64"), ArgSpec("y", (2, 3), "int64")])(x, y)
    np.testing.assert_array_equal(y, 3 * x)
    assert not list(cache.glob("*.tmp"))


def test_cache_hit_does_not_recompile(monkeypatch: pytest.MonkeyPatch) -> None:
    first = compile_source(VADD)

    def boom(*args, **kwargs):
        raise AssertionError("compiler invoked on a cache hit")

    monkeypatch.setattr(toolchain, "run_group", boom)
    assert compile_source(VADD) == first
    with pytest.raises(AssertionError):
        compile_source(VADD, extra_flags=("-DX=1",))  # different flags -> different key -> compiles


def test_concurrent_compiles_agree() -> None:
    with ThreadPoolExecutor(4) as pool:
        paths = list(pool.map(lambda _: compile_source(VADD), range(4)))
    assert len(set(paths)) == 1
    Module(paths[0]).kernel("vadd", VADD_ARGS)


def test_cc_env_respected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", "tensorgen-no-such-cc")
    with pytest.raises(CompileError, match="tensorgen-no-such-cc.*CC"):
        compile_source(VADD)
    with pytest.raises(CompileError, match="other-missing-cc"):
        compile_source(VADD, cc="other-missing-cc")


def test_compiler_info() -> None:
    info = compiler_info()
    assert os.path.isabs(info["command"].split()[0]) and info["version"] and "-fopenmp" in info["flags"]


def test_gcc_workarounds_go_to_gcc_under_any_name_and_to_no_other_compiler(tmp_path: Path) -> None:
    """gcc's own flags (toolchain.GCC_FLAGS) are told by its --version notice, not by the command's name."""
    def compiler(name: str, version: str) -> str:
        path = tmp_path / name
        path.write_text(f'#!/bin/sh\n[ "$1" = --version ] && {{ printf "{version}"; exit 0; }}\nexec gcc "$@"\n')
        path.chmod(0o755)
        return str(path)

    gcc_as_cc = compiler("cc", "cc (Debian 12.2.0-14) 12.2.0\\nCopyright (C) 2022 Free Software Foundation, Inc.\\n")
    clang = compiler("clang", "Debian clang version 17.0.6\\nTarget: x86_64-pc-linux-gnu\\n")
    assert all(f in compiler_info(gcc_as_cc)["flags"] for f in toolchain.GCC_FLAGS)
    assert not any(f in compiler_info(clang)["flags"] for f in toolchain.GCC_FLAGS)


def test_syntax_error_reports_log_and_source(cache: Path) -> None:
    src = "void broken(float* a) {\n  a[0] = 1.0f\n}\n"
    with pytest.raises(CompileError) as ei:
        compile_source(src)
    err = ei.value
    assert "error" in str(err) and "expected" in str(err)
    c_files = list(cache.glob("*.c"))
    assert len(c_files) == 1 and str(c_files[0]) in str(err)
    assert err.source == src and "error" in err.log
    assert numbered_source(err.source).splitlines()[1] == "2 |   a[0] = 1.0f"
    assert not list(cache.glob("*.so*"))


def test_long_compiler_log_is_truncated(tmp_path: Path) -> None:
    cc = _fake_cc(tmp_path, 'for i in $(seq 1 50); do echo "line $i" >&2; done; exit 1')
    with pytest.raises(CompileError) as ei:
        compile_source(VADD, cc=cc)
    msg = str(ei.value)
    assert "line 20\n" in msg and "line 21" not in msg and "30 more lines" in msg
    assert "line 50" in ei.value.log


def test_timeout(tmp_path: Path) -> None:
    cc = _fake_cc(tmp_path, "exec sleep 10")
    with pytest.raises(CompileError, match="timed out"):
        compile_source(VADD, cc=cc, timeout=0.5)


@pytest.mark.parametrize(
    "args, match",
    [
        (
            (np.zeros(N, np.float64), np.zeros(N, np.float32), np.zeros(N, np.float32)),
            r"argument A: expected float32\[1024\], got float64\[1024\]",
        ),
        (
            (np.zeros(N, np.float32), np.zeros((N, 1), np.float32), np.zeros(N, np.float32)),
            r"argument B: expected float32\[1024\], got float32\[1024, 1\]",
        ),
        (
            (np.zeros(N, np.float32), np.zeros(N, np.float32), np.zeros(2 * N, np.float32)[::2]),
            r"argument C: .*not C-contiguous.*np\.ascontiguousarray",
        ),
        ((np.zeros(N, np.float32), np.zeros(N, np.float32)), r"takes 3 arrays \(A, B, C\), got 2"),
        (
            ([0.0] * N, np.zeros(N, np.float32), np.zeros(N, np.float32)),
            r"argument A: expected a numpy array",
        ),
    ],
)
def test_bad_arguments(vadd, args, match) -> None:
    with pytest.raises(RuntimeCallError, match=match):
        vadd[1](*args)


def test_missing_function_and_bad_dtype(vadd) -> None:
    with pytest.raises(RuntimeCallError, match="no function 'nope'"):
        vadd[0].kernel("nope", [])
    with pytest.raises(ValueError, match="unsupported dtype"):
        ArgSpec("A", (2,), "complex64")


def test_set_num_threads(vadd) -> None:
    mod, k = vadd
    mod.set_num_threads(1)
    assert mod.get_max_threads() == 1
    set_num_threads(mod, 2)
    assert mod.get_max_threads() == 2
    a = np.ones(N, np.float32)
    c = np.empty(N, np.float32)
    k(a, a, c)
    assert (c == 2).all()


@pytest.mark.parametrize("lanes", [4, 8, 16])
def test_vectorized_math_calls_libmvec(lanes):
    """expf/logf/erff/tanhf in a vectorized loop use glibc's vector versions (gcc never vectorizes them without
    -ffast-math); results match NumPy to float32 precision."""
    import numpy as np

    from tensorgen import te
    from tensorgen.build import build
    from tensorgen.codegen.toolchain import has_vector_math
    from tensorgen.schedule import State

    a = te.placeholder((8, 64), name="A")
    b = te.compute((8, 64), lambda i, j: te.exp(a[i, j] - 1.0) * 2.0 + te.log(a[i, j]) + te.erf(a[i, j] - 1.0)
                   * te.tanh(a[i, j]), name="B")
    s = State([a, b]).split("B", "j", [lanes]).vectorize("B", "j_1")
    f = build(s)
    for fn in ("exp", "log", "erf", "tanh"):  # erf, tanh: glibc >= 2.35
        if has_vector_math(lanes * 4, fn):
            assert f"v_{fn}f(" in f.source and f" {fn}f(" not in f.source and f"({fn}f(" not in f.source
    x = np.random.default_rng(0).uniform(0.1, 2.0, (8, 64)).astype("float32")
    y = np.empty_like(x)
    f(x, y)
    want = np.exp(x - 1) * 2 + np.log(x) + np.vectorize(math.erf)(x - 1.0) * np.tanh(x)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


def test_aligned_buffers_are_what_kernels_get():
    """Kernels are tuned on 64-byte aligned buffers; `aligned` copies only arrays that are not."""
    from tensorgen import te
    from tensorgen.build import build
    from tensorgen.runtime import ALIGNMENT, aligned, aligned_empty

    for shape, dtype in [((3, 5), "float32"), ((7,), "float64"), ((2, 2, 2), "int32")]:
        assert aligned_empty(shape, dtype).ctypes.data % ALIGNMENT == 0
        assert aligned_empty(shape, dtype).shape == shape and aligned_empty(shape, dtype).dtype == dtype
    off = np.arange(65, dtype="float32")[1:]  # 4 bytes past an aligned start at best
    assert off.ctypes.data % ALIGNMENT != 0
    fixed = aligned(off)
    assert fixed.ctypes.data % ALIGNMENT == 0 and np.array_equal(fixed, off)
    assert aligned(fixed) is fixed
    x = te.placeholder((64,), name="x")
    y = te.compute((64,), lambda i: x[i] * 2.0, name="y")
    (out,) = build([x, y]).run(off)
    assert out.ctypes.data % ALIGNMENT == 0 and np.array_equal(out, off * 2)
