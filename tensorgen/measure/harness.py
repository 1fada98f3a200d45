"""A native timing harness, compiled once, that dlopen()s a candidate and times its kernel.

Timing in a separate native process keeps Python and ctypes overhead out of the numbers, and a crash or
hang in a candidate kills only that process. Inputs come from a seeded xorshift generator inside the
harness, so a candidate and the naive reference see identical data without shipping arrays around.

Arguments are inputs (`i`), outputs (`o`) or weights (`w`: a model's constant inputs). With `flush_bytes`
-1 the weights are evicted from every cache level before each timed call and only the calls are timed,
like TVM's cache_flush_cpu_non_first_arg: a layer of a network whose weights do not fit the last-level
cache finds them in memory. Its inputs are rewritten before each call as the layer before leaves them
(`PRODUCER_C`, compiled into every candidate): each thread's contiguous share in that thread's cache.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tensorgen.codegen.toolchain import cache_dir, find_compiler, intact, seal, usable_cache_dir
from tensorgen.dag import ComputeDAG
from tensorgen.errors import CompileError
from tensorgen.loopir.nodes import row_major
from tensorgen.schedule.layout_rewrite import LayoutRewrite

MAX_ARGS = 64
REPEAT_CAP = 3.0  # a repeat of min_repeat_ms ends after this many times as long, with the calls it made
HARNESS_FAILED = 3  # the harness's exit status when it fails itself (die(): dlopen, allocation, its output file)
#: dtype -> (harness kind letter, numpy dtype of the bytes it writes)
KINDS: dict[str, tuple[str, str]] = {
    "float32": ("f", "float32"), "float64": ("d", "float64"), "int32": ("i", "int32"),
    "int64": ("l", "int64"), "float16": ("h", "float16"), "bool": ("b", "bool"),
}

#: Rewrites a model task's input before each timed call the way the kernel before it leaves it in a model:
#: in equal contiguous shares, one per thread (the outer dimension split, as a row-partitioned producer
#: writes it). A candidate that splits its threads another way (by channels, say) then reads half its input
#: from the other core's cache, as it will in the model: timed with its inputs where its own last call put
#: them, MobileNet-V2's 14x14x576 depthwise conv split by channels took 22 us alone and 36 in the model,
#: where one split by rows took 24.
PRODUCER_C = r"""
void tensorgen_produce(void* p, long bytes) {
  #pragma omp parallel for schedule(static)
  for (long at = 0; at < bytes; at += 64) ((volatile char*)p)[at] = ((volatile char*)p)[at];
}
"""

_HARNESS_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#ifdef __linux__
#include <signal.h>
#include <sys/prctl.h>
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void die(const char *what, const char *detail) {
  fprintf(stderr, "harness: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
  exit(3);
}
/* evict [p, p + bytes) from every cache level */
static void evict(const void *p, size_t bytes) {
#if defined(__x86_64__) || defined(__i386__)
  for (size_t o = 0; o < bytes; o += 64) __builtin_ia32_clflush((const char *)p + o);
  __builtin_ia32_mfence();
#elif defined(__aarch64__)
  for (size_t o = 0; o < bytes; o += 64) __asm__ volatile("dc civac, %0" : : "r"((const char *)p + o) : "memory");
  __asm__ volatile("dsb ish" : : : "memory");
#else
  (void)p; (void)bytes;
#endif
}
static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}
static uint64_t xorshift(uint64_t *s) {
  uint64_t x = *s;
  x ^= x << 13; x ^= x >> 7; x ^= x << 17;
  return *s = x;
}
/* uniform in [-1, 1) */
static double uniform(uint64_t *s) { return (double)(xorshift(s) >> 11) * (2.0 / 9007199254740992.0) - 1.0; }
static uint16_t to_half(float f) { /* normal numbers only; |f| < 2^-14 flushes to zero */
  uint32_t x; memcpy(&x, &f, 4);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
  int e = (int)((x >> 23) & 0xff) - 127 + 15;
  return e <= 0 ? sign : (uint16_t)(sign | (e << 10) | ((x >> 13) & 0x3ff));
}
static size_t elem_size(char k) { return k == 'd' || k == 'l' ? 8 : k == 'h' ? 2 : k == 'b' ? 1 : 4; }
static void fill(void *p, char k, long n, uint64_t seed) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
  for (long i = 0; i < n; i++) {
    double u = uniform(&s);
    switch (k) {
      case 'f': ((float *)p)[i] = (float)u; break;
      case 'd': ((double *)p)[i] = u; break;
      case 'i': ((int32_t *)p)[i] = (int32_t)((u + 1.0) * 2.0); break;
      /* int64 inputs are indices (ONNX Gather's, as constants or ids): 0 is the one value in range of any axis,
         and a candidate reading past a small axis (qkv[:, :, 2] gathers from an axis of 3) reads garbage the
         naive program does not, so every candidate of the task failed the correctness check */
      case 'l': ((int64_t *)p)[i] = 0; (void)u; break;
      case 'h': ((uint16_t *)p)[i] = to_half((float)u); break;
      case 'b': ((uint8_t *)p)[i] = u > 0.0; break;
      default: die("unknown element kind", NULL);
    }
  }
}
/* A repacked constant (layout rewrite): spec suffix ":e,s;e,s;..." gives the new layout's dims, outer
   to inner, as (extent, stride in the original layout). The data are generated in the original order,
   as for the naive program, then element j of the new layout takes the original element it stands for. */
static void fill_repacked(void *p, char k, long n, uint64_t seed, const char *layout) {
  long ext[16], stride[16], digit[16] = {0};
  int nd = 0;
  for (const char *c = layout; *c && nd < 16; nd++) {
    if (sscanf(c, "%ld,%ld", &ext[nd], &stride[nd]) != 2) die("bad layout in arg spec", layout);
    while (*c && *c != ';') c++;
    if (*c == ';') c++;
  }
  size_t es = elem_size(k);
  unsigned char *orig = malloc(es * (size_t)n);
  if (!orig) die("out of memory repacking", layout);
  fill(orig, k, n, seed);
  long at = 0; /* original index of element j */
  for (long j = 0; j < n; j++) {
    memcpy((unsigned char *)p + es * (size_t)j, orig + es * (size_t)at, es);
    for (int d = nd - 1; d >= 0; d--) { /* next j: mixed-radix increment */
      at += stride[d];
      if (++digit[d] < ext[d]) break;
      at -= stride[d] * ext[d];
      digit[d] = 0;
    }
  }
  free(orig);
}
typedef void *P;
/* A CUDA candidate's entry point takes device pointers and returns its CUDA error; cudaMalloc & co. come from
   the candidate's own dependencies (libcudart), or from the candidate itself when it is emulated (cuda_emu) */
typedef int (*cuda_malloc_t)(void **, size_t);
typedef int (*cuda_memcpy_t)(void *, const void *, size_t, int);
typedef int (*cuda_sync_t)(void);
static cuda_malloc_t cuda_malloc;
static cuda_memcpy_t cuda_memcpy;
static cuda_sync_t cuda_sync;
enum { TO_DEVICE = 1, TO_HOST = 2 }; /* cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost */
static void load_cuda(void *lib) {
  cuda_malloc = (cuda_malloc_t)dlsym(lib, "cudaMalloc");
  cuda_memcpy = (cuda_memcpy_t)dlsym(lib, "cudaMemcpy");
  cuda_sync = (cuda_sync_t)dlsym(lib, "cudaDeviceSynchronize");
  if (!cuda_malloc || !cuda_memcpy || !cuda_sync) die("the candidate has no CUDA runtime", "cudaMalloc");
}
static void call(void *fn, int n, P *a) {
  if (cuda_sync) {
    int err = 0;
    switch (n) {
@INT_CASES@
      default: die("too many kernel arguments", NULL);
    }
    if (!err) err = cuda_sync();
    if (err) { fprintf(stderr, "candidate failed with CUDA error %d\n", err); exit(4); }
    return;
  }
  switch (n) {
@CASES@
    default: die("too many kernel arguments", NULL);
  }
}
/* argv: so symbol threads number repeat min_repeat_ms flush_bytes cooldown_s seed out_path give_up_s device
   nargs {kind:count:io}* (device: cpu, or cuda for a CUDA candidate) */
int main(int argc, char **argv) {
#ifdef __linux__
  prctl(PR_SET_PDEATHSIG, SIGKILL);  /* a hung candidate dies with the tuner that started it, even after kill -9 */
#endif
  if (argc < 14) die("usage", "see the comment above main()");
  int threads = atoi(argv[3]), number = atoi(argv[4]), repeat = atoi(argv[5]), nargs = atoi(argv[13]);
  double min_ms = atof(argv[6]), cooldown = atof(argv[8]), give_up = atof(argv[11]);
  long flush_bytes = atol(argv[7]);
  uint64_t seed = strtoull(argv[9], NULL, 10);
  const char *out_path = argv[10];
  if (argc != 14 + nargs || nargs < 1) die("argument count does not match nargs", NULL);
  void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) die("dlopen failed", dlerror());
  void *fn = dlsym(lib, argv[2]);
  if (!fn) die("kernel symbol not found", argv[2]);
  void (*set_threads)(int) = (void (*)(int))dlsym(lib, "tensorgen_set_num_threads");
  if (set_threads && threads > 0) set_threads(threads);
  void (*produce)(void *, long) = (void (*)(void *, long))dlsym(lib, "tensorgen_produce");
  if (strcmp(argv[12], "cuda") == 0) load_cuda(lib);
  P bufs[@MAX@], args[@MAX@]; char kinds[@MAX@], io[@MAX@]; long counts[@MAX@];
  for (int i = 0; i < nargs; i++) {
    int used = 0;
    const char *spec = argv[14 + i];
    if (sscanf(spec, "%c:%ld:%c%n", &kinds[i], &counts[i], &io[i], &used) != 3) die("bad arg spec", spec);
    size_t bytes = elem_size(kinds[i]) * (size_t)(counts[i] > 0 ? counts[i] : 1);
    bufs[i] = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!bufs[i]) die("out of memory allocating", spec);
    if (io[i] != 'o' && spec[used] == ':')
      fill_repacked(bufs[i], kinds[i], counts[i], seed + (uint64_t)i, spec + used + 1);
    else if (io[i] != 'o') fill(bufs[i], kinds[i], counts[i], seed + (uint64_t)i);
    else memset(bufs[i], 0xff, bytes); /* NaN / -1: elements a kernel forgets to write show up */
    args[i] = bufs[i];
    if (cuda_malloc && (cuda_malloc(&args[i], bytes) || cuda_memcpy(args[i], bufs[i], bytes, TO_DEVICE)))
      die("cannot copy an argument to the GPU", spec);
  }
  double warm = now();
  call(fn, nargs, args); /* warm-up; its outputs are what correctness checks see */
  warm = now() - warm;
  for (int i = 0; i < nargs; i++)
    if (cuda_memcpy && io[i] == 'o' && cuda_memcpy(bufs[i], args[i], elem_size(kinds[i]) * (size_t)counts[i], TO_HOST))
      die("cannot copy an output from the GPU", argv[14 + i]);
  if (warm * number > 1.0) number = 1; /* a slow candidate: one call per repeat keeps it inside the timeout */
  if (strcmp(out_path, "-") != 0) {
    FILE *f = fopen(out_path, "wb");
    if (!f) die("cannot open output file", out_path);
    for (int i = 0; i < nargs; i++)
      if (io[i] == 'o' && fwrite(bufs[i], elem_size(kinds[i]), (size_t)counts[i], f) != (size_t)counts[i])
        die("short write to", out_path);
    if (fclose(f) != 0) die("cannot close", out_path);
  }
  /* a first call starts the OpenMP threads and faults the pages in: milliseconds, which is many times a
     small kernel's time. Up to five more calls (50 ms in all) decide, or every small candidate after a
     fast one gives up; several, since one call on a busy machine can lose a whole scheduler time slice */
  for (double spent = warm; give_up > 0 && warm > give_up && spent < 0.05;) {
    double again = now();
    call(fn, nargs, args);
    again = now() - again;
    spent += again < 0.01 ? 0.01 : again;
    if (again < warm) warm = again;
  }
  if (give_up > 0 && warm > give_up) { /* far slower than the best known: the warm-up call is its timing */
    for (int r = 0; r < repeat; r++) printf("repeat 1 %.17g\n", warm);
    fflush(stdout);
    return 0;
  }
  /* fast kernels still run cold for a few calls after the first (thread wake-up, clocks): ~1.2x on the
     first repeat under 3 ms; warming up for 20 ms in all removes it */
  for (double spent = warm; spent < 0.02;) {
    double t = now();
    call(fn, nargs, args);
    spent += now() - t;
  }
  unsigned char *flush = flush_bytes > 0 ? malloc((size_t)flush_bytes) : NULL;
  int evict_weights = flush_bytes < 0;
  /* a repeat ends after REPEAT_CAP times min_ms with the calls made so far: on a busy machine a call of a parallel
     kernel may wait out a time slice, and `number` counted from fast calls then ran a 32x32 matmul's 100 ms
     repeats for 2-16 s in all */
  double cap = min_ms * 1e-3 * @REPEAT_CAP@;
  volatile unsigned char sink = 0;
  for (int r = 0; r < repeat; r++) {
    if (r > 0 && cooldown > 0) {
      struct timespec ts = {(time_t)cooldown, (long)((cooldown - (double)(time_t)cooldown) * 1e9)};
      nanosleep(&ts, NULL);
    }
    double el, wall; /* the calls' time; the repeat's, evictions included (min_ms bounds it, not `el`:
                          evicting 5 MB of weights takes ~20x a GEMV's call, and reaching min_ms of calls
                          alone ran the fastest fc programs past their timeout) */
    for (;;) {
      if (flush) { memset(flush, r + 1, (size_t)flush_bytes); sink += flush[(size_t)r % (size_t)flush_bytes]; }
      if (evict_weights) {
        el = 0.0;
        wall = now();
        for (int k = 0; k < number; k++) {
          for (int i = 0; i < nargs; i++) {
            size_t bytes = elem_size(kinds[i]) * (size_t)counts[i];
            if (io[i] == 'w') evict(bufs[i], bytes);
            else if (io[i] == 'i' && produce) produce(bufs[i], (long)bytes);
          }
          double t0 = now();
          call(fn, nargs, args);
          el += now() - t0;
          if (cap > 0 && now() - wall > cap) number = k + 1;
        }
        wall = now() - wall;
      } else {
        double t0 = now();
        for (int k = 0; k < number; k++) {
          call(fn, nargs, args);
          if (cap > 0 && (k & 15) == 15 && now() - t0 > cap) number = k + 1;
        }
        el = wall = now() - t0;
      }
      if (wall * 1e3 >= min_ms || number >= (1 << 30)) break;
      double per = wall / number > 1e-9 ? wall / number : 1e-9;
      double grown = min_ms * 1e-3 / per * 1.1 + 1.0, doubled = 2.0 * number;
      grown = grown > doubled ? grown : doubled;
      number = grown < (double)(1 << 30) ? (int)grown : (1 << 30);
    }
    printf("repeat %d %.17g\n", number, el / number);
  }
  fflush(stdout);
  (void)sink;
  return 0;
}
"""


def harness_source() -> str:
    cases, int_cases = [], []
    for n in range(1, MAX_ARGS + 1):
        params = ", ".join(["P"] * n)
        args = ", ".join(f"a[{i}]" for i in range(n))
        cases.append(f"    case {n}: ((void (*)({params}))fn)({args}); break;")
        int_cases.append(f"      case {n}: err = ((int (*)({params}))fn)({args}); break;")
    return _HARNESS_C.replace("@CASES@", "\n".join(cases)).replace("@INT_CASES@", "\n".join(int_cases)) \
        .replace("@MAX@", str(MAX_ARGS)).replace("@REPEAT_CAP@", repr(float(REPEAT_CAP)))


def harness_executable(cc: str | None = None, timeout: float = 120.0) -> Path:
    """Compile the harness (once per compiler and source, cached next to the kernels) and return its path."""
    cmd = find_compiler(cc)
    source = harness_source()
    key = hashlib.sha256("\0".join([source, *cmd]).encode()).hexdigest()[:24]
    exe = cache_dir() / f"harness-{key}"
    if intact(exe):
        return exe
    root = usable_cache_dir()
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        c_path, out = Path(tmp) / "harness.c", Path(tmp) / "harness"
        c_path.write_text(source)
        argv = [*cmd, "-O2", "-std=gnu11", "-o", str(out), str(c_path), "-ldl"]
        try:
            proc = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise CompileError(f"cannot compile the timing harness: {exc}", source=source) from exc
        if proc.returncode != 0:
            raise CompileError(f"timing harness failed to compile:\n{proc.stderr}", source=source, log=proc.stderr)
        seal(exe, out)
        os.replace(out, exe)
    return exe


@dataclass(frozen=True)
class HarnessConfig:
    """How to time: `number` runs per repeat (grown until a repeat lasts `min_repeat_ms`), `repeat` repeats."""

    number: int = 3
    repeat: int = 3
    min_repeat_ms: float = 0.0
    flush_bytes: int = 0  # > 0: overwrite this many bytes before each repeat; -1: evict the weights before each call
    cooldown_interval: float = 0.0
    threads: int = 1
    seed: int = 1
    give_up_seconds: float = 0.0  # > 0: a warm-up call slower than this is the only timing taken
    cuda: bool = False  # a CUDA candidate: arguments in GPU memory, every call synchronized and its error checked


@dataclass(frozen=True)
class HarnessRun:
    """What one harness process did; `returncode < 0` is the signal that killed it."""

    costs: tuple[float, ...]
    numbers: tuple[int, ...]
    returncode: int | None
    stderr: str
    wall_seconds: float
    timed_out: bool = False


def arg_specs(dag: ComputeDAG, layouts: Sequence[LayoutRewrite] = ()) -> list[str]:
    """Harness argument specs `kind:count:io` for the kernel's arguments, in dag.args order (io: `i`nput,
    `o`utput, `w`eight: a constant input); a constant
    repacked by one of `layouts` gets its new layout as `:extent,stride;...` (strides of the original),
    so that it holds the data the naive program reads, repacked."""
    outs = {t.name for t in dag.outputs}
    repacked = {r.name: r for r in layouts}
    specs = []
    for t in dag.args:
        io = "o" if t.name in outs else "w" if t.attrs.get("constant") else "i"
        spec = f"{KINDS[t.dtype][0]}:{int(np.prod(t.shape, dtype=np.int64))}:{io}"
        if t.name in repacked:
            r = repacked[t.name]
            strides = row_major(r.shape)
            spec += ":" + ";".join(f"{extent},{strides[dim] * place}" for dim, place, extent in r.parts)
        specs.append(spec)
    return specs


def read_outputs(dag: ComputeDAG, path: str | os.PathLike) -> list[np.ndarray]:
    """The output buffers the harness wrote after its warm-up call."""
    data, out, offset = Path(path).read_bytes(), [], 0
    for t in dag.outputs:
        dt = np.dtype(KINDS[t.dtype][1])
        n = int(np.prod(t.shape, dtype=np.int64))
        out.append(np.frombuffer(data, dt, n, offset).reshape(t.shape))
        offset += n * dt.itemsize
    return out


def run_harness(
    exe: str | os.PathLike, so_path: str, kernel: str, specs: Sequence[str], config: HarnessConfig,
    timeout: float, out_path: str | None = None,
) -> HarnessRun:
    """Time `kernel` from `so_path` in a fresh harness process; killed after `timeout` seconds."""
    if len(specs) > MAX_ARGS:
        raise ValueError(f"kernel has {len(specs)} arguments; the harness supports at most {MAX_ARGS}")
    argv = [str(exe), so_path, kernel, str(config.threads), str(max(1, config.number)), str(config.repeat),
            repr(float(config.min_repeat_ms)), str(config.flush_bytes), repr(float(config.cooldown_interval)),
            str(config.seed), out_path or "-", repr(float(config.give_up_seconds)), "cuda" if config.cuda else "cpu",
            str(len(specs)), *specs]
    start = time.perf_counter()
    try:
        proc = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:  # subprocess.run has already killed the child
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
        return HarnessRun((), (), None, err, time.perf_counter() - start, timed_out=True)
    wall = time.perf_counter() - start
    costs, numbers = [], []
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "repeat":
            numbers.append(int(parts[1]))
            costs.append(float(parts[2]))
    return HarnessRun(tuple(costs), tuple(numbers), proc.returncode, proc.stderr, wall)
