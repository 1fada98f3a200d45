"""The local CPU as HardwareParams: cores, SIMD width and caches read from the OS (cheap), and the roofline
numbers peak GFLOP/s and GB/s from micro-benchmarks (seconds, so cached on disk per machine)."""

from __future__ import annotations

import ctypes
import json
import math
import os
import platform
import re
import resource
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import fields
from datetime import datetime, timezone
from functools import cache
from pathlib import Path
from typing import Any

from tensorgen.codegen.toolchain import compile_source
from tensorgen.errors import MemoryBudgetError, TensorgenError
from tensorgen.gpus import closest_gpu, gpu_hardware, gpu_of
from tensorgen.runtime.cuda import cuda_available, cudart
from tensorgen.target import HardwareParams, Target

SYSFS_CACHE = Path("/sys/devices/system/cpu/cpu0/cache")
PEAK_ITERS = 1 << 22  # per thread per repeat (~8 ms on Zen3): short repeats dodge other processes
BANDWIDTH_MIB = 64  # per array; three arrays, far larger than any L3 we expect
QUICK_ENV = "TENSORGEN_HW_QUICK"  # set to 1 for tiny benchmark sizes (tests); quick results are not cached


def parse_size(text: str) -> int:
    """'32K', '32768K', '1 MiB', '524288' -> bytes (sysfs, lscpu and getconf each spell sizes differently)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*", text.upper())
    if not m:
        raise ValueError(f"cannot parse size {text!r}")
    return int(float(m.group(1)) * 1024 ** " KMGT".index(m.group(2) or " "))


MEMORY_ENV = "TENSORGEN_MEMORY_LIMIT"
MEMORY_SHARE = 0.8  # of physical memory, the default budget of a model


def memory_limit() -> int:
    """Bytes a model's buffers, weights and inputs may take: $TENSORGEN_MEMORY_LIMIT (e.g. '12G'), else
    MEMORY_SHARE of physical memory; never more than the process's address-space limit (ulimit -v). Sizes
    are checked against it before anything is allocated: a tiny file can declare a tensor of 40 GB, and
    allocating it ends in the kernel's OOM killer, not in an error."""
    text = os.environ.get(MEMORY_ENV)
    if text:
        try:
            return parse_size(text)
        except ValueError:
            raise TensorgenError(f"{MEMORY_ENV}={text!r} is not a size (bytes, or e.g. 512M, 12G)") from None
    limit = int(MEMORY_SHARE * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return min(limit, soft) if soft != resource.RLIM_INFINITY else limit


def check_memory_budget(need: int, what: str) -> None:
    """MemoryBudgetError "<what>; the limit is ..." when `need` bytes exceed memory_limit()."""
    limit = memory_limit()
    if need > limit:
        raise MemoryBudgetError(f"{what}; the limit is {format_bytes(limit)} (set {MEMORY_ENV} to change it)")


def format_bytes(n: float) -> str:
    """'40.0 GB', '512.0 MB': decimal units, as memory figures in messages are read."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} bytes"


def parse_key_values(text: str) -> dict[str, str]:
    """'Key: value' lines (lscpu, /proc/cpuinfo) as a dict; the first occurrence of a key wins."""
    pairs = [(k.strip(), v.strip()) for k, _, v in (ln.partition(":") for ln in text.splitlines())]
    return dict(reversed([(k, v) for k, v in pairs if v]))


def parse_cpuinfo(text: str) -> tuple[str, frozenset[str]]:
    """Model name and feature flags of the first processor in /proc/cpuinfo (x86 'flags', arm 'Features')."""
    info = parse_key_values(text)
    model = info.get("model name") or info.get("Model name") or info.get("cpu model", "")
    return model, frozenset((info.get("flags") or info.get("Features", "")).split())


def simd_bytes_from_flags(flags: frozenset[str] | set[str]) -> int:
    """Widest usable FP vector register in bytes: avx512f 64, avx/avx2 32, sse2/asimd 16."""
    return 64 if "avx512f" in flags else 32 if flags & {"avx", "avx2"} else 16  # sse2/asimd are baselines


def physical_cores(info: dict[str, str]) -> int | None:
    """Core(s) per socket x Socket(s) from parsed lscpu, or None when lscpu does not say."""
    try:
        per = int(info.get("Core(s) per socket") or info["Core(s) per cluster"])
        return per * int(info.get("Socket(s)") or info.get("Cluster(s)") or 1)
    except (KeyError, ValueError):
        return None


def _read(path: str | Path) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _add_cache(out: dict[str, int], kind: str, level: int, size: int, line: int) -> None:
    """Record a data/unified cache level and the line size; the first entry seen wins."""
    if kind in ("Data", "Unified") and 1 <= level <= 3:
        out.setdefault(f"l{level}_bytes", size)
    if line > 0:
        out.setdefault("cache_line_bytes", line)


def read_sysfs_caches(root: Path = SYSFS_CACHE) -> dict[str, int]:
    """l1/l2/l3 data-cache sizes and line size from sysfs index*/ dirs; unreadable entries are skipped."""
    out: dict[str, int] = {}
    for d in sorted(root.glob("index*")):
        f = {n: _read(d / n).strip() for n in ("level", "type", "size", "coherency_line_size")}
        try:
            _add_cache(out, f["type"], int(f["level"]), parse_size(f["size"]), int(f["coherency_line_size"] or 0))
        except ValueError:
            continue
    return out


def parse_lscpu_caches(text: str) -> dict[str, int]:
    """Cache sizes from the `lscpu -C` table (NAME ONE-SIZE ... TYPE LEVEL ... COHERENCY-SIZE columns)."""
    lines = [ln.split() for ln in text.splitlines() if ln.strip()]
    col = {name: i for i, name in enumerate(lines[0] if lines else [])}
    out: dict[str, int] = {}
    for row in lines[1:]:
        try:
            line = int(row[col["COHERENCY-SIZE"]]) if "COHERENCY-SIZE" in col else 0
            _add_cache(out, row[col["TYPE"]], int(row[col["LEVEL"]]), parse_size(row[col["ONE-SIZE"]]), line)
        except (KeyError, IndexError, ValueError):
            continue
    return out


def parse_getconf(text: str) -> dict[str, int]:
    """Cache sizes from `getconf -a` (LEVEL1_DCACHE_SIZE etc.); zero or blank means unknown."""
    names = {"LEVEL1_DCACHE_SIZE": "l1_bytes", "LEVEL2_CACHE_SIZE": "l2_bytes", "LEVEL3_CACHE_SIZE": "l3_bytes",
             "LEVEL1_DCACHE_LINESIZE": "cache_line_bytes"}
    rows = [ln.split() for ln in text.splitlines()]
    return {names[r[0]]: int(r[1]) for r in rows if len(r) == 2 and r[0] in names and r[1].isdigit() and int(r[1])}


def _run(*argv: str) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


@cache
def _detect() -> HardwareParams:
    model, flags = parse_cpuinfo(_read("/proc/cpuinfo"))
    lscpu = parse_key_values(_run("lscpu"))
    model = model or lscpu.get("Model name", "") or platform.processor() or "unknown cpu"
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    cores = max(1, min(usable, physical_cores(lscpu) or usable))  # no SMT siblings, only CPUs we may run on
    caches = read_sysfs_caches()
    for fallback in (lambda: parse_lscpu_caches(_run("lscpu", "-C")), lambda: parse_getconf(_run("getconf", "-a"))):
        if not {"l1_bytes", "l2_bytes", "l3_bytes", "cache_line_bytes"} <= caches.keys():
            caches = {**fallback(), **caches}
    simd = simd_bytes_from_flags(flags)
    extra = {"model": model, "fingerprint": fingerprint(model, cores, simd)}
    return HardwareParams(cores=cores, simd_bytes=simd, **caches, extra=extra)


def detect_cpu() -> HardwareParams:
    """This machine's cores, SIMD width and caches from the OS; peak/bandwidth from the cache if measured."""
    hw = _detect()
    entry = load_cache().get(hw.extra["fingerprint"], {})
    return hw.replace(peak_gflops=entry.get("peak_gflops"), bandwidth_gbs=entry.get("bandwidth_gbs"))


_BENCH_C = r"""
#include <omp.h>
#include <stdlib.h>
#include <time.h>
typedef float vf __attribute__((vector_size(SIMD_BYTES)));
enum { LANES = SIMD_BYTES / 4, NACC = 12 };
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
/* NACC independent FMA chains hide the FMA latency so both FMA pipes stay busy; returns best GFLOP/s. */
double tg_peak_gflops(int threads, long iters, int repeats, float mul, float add, float *sink) {
  double best = 0.0; float total = 0.0f;
  for (int r = 0; r < repeats; r++) {
    float part = 0.0f; double t0 = now();
    #pragma omp parallel num_threads(threads) reduction(+:part)
    {
      vf m = (vf){} + mul, a = (vf){} + add, acc[NACC];
      for (int k = 0; k < NACC; k++) acc[k] = (vf){} + (float)(k + omp_get_thread_num()) * 1e-3f;
      for (long i = 0; i < iters; i++) {
        #pragma GCC unroll 16
        for (int k = 0; k < NACC; k++) acc[k] = acc[k] * m + a;
      }
      for (int k = 0; k < NACC; k++) for (int l = 0; l < LANES; l++) part += acc[k][l];
    }
    double g = 2.0 * NACC * LANES * (double)iters * threads / (now() - t0) * 1e-9;
    total += part; if (g > best) best = g;
  }
  *sink = total; return best;  /* the sums escape, so the chains cannot be optimised away */
}
/* STREAM triad a = b + s*c; counts 24 bytes per element (2 reads + 1 write, write-allocate not counted). */
double tg_triad_gbs(int threads, long n, int repeats, double *sink) {
  double *a = aligned_alloc(64, n * 8), *b = aligned_alloc(64, n * 8), *c = aligned_alloc(64, n * 8), best = 0.0;
  if (!a || !b || !c) { free(a); free(b); free(c); return -1.0; }
  #pragma omp parallel for num_threads(threads) schedule(static)
  for (long i = 0; i < n; i++) { a[i] = 0.0; b[i] = 1.0; c[i] = 2.0; }
  for (int r = 0; r < repeats; r++) {
    double s = 0.5 + r, t0 = now();
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (long i = 0; i < n; i++) a[i] = b[i] + s * c[i];
    double g = 24.0 * n / (now() - t0) * 1e-9; if (g > best) best = g;
  }
  *sink = a[0] + a[n / 2] + a[n - 1]; free(a); free(b); free(c);
  return best;
}
"""


@cache
def _bench_lib(simd_bytes: int) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(compile_source(_BENCH_C.replace("SIMD_BYTES", str(simd_bytes)))))
    lib.tg_peak_gflops.argtypes = [ctypes.c_int, ctypes.c_long, ctypes.c_int, ctypes.c_float, ctypes.c_float,
                                   ctypes.POINTER(ctypes.c_float)]
    lib.tg_triad_gbs.argtypes = [ctypes.c_int, ctypes.c_long, ctypes.c_int, ctypes.POINTER(ctypes.c_double)]
    lib.tg_peak_gflops.restype = lib.tg_triad_gbs.restype = ctypes.c_double
    return lib


def _checked(value: float, what: str) -> float:
    if math.isfinite(value) and value > 0:
        return value
    raise TensorgenError(f"{what} benchmark failed (got {value}); not enough memory?")


def measure_peak_gflops(cores: int, simd_bytes: int, iters: int = PEAK_ITERS, repeats: int = 20) -> float:
    """Best-of-`repeats` FP32 FMA throughput on `cores` threads, in GFLOP/s (2 flops per FMA lane)."""
    sink = ctypes.c_float()
    value = _bench_lib(simd_bytes).tg_peak_gflops(cores, iters, repeats, 0.999999, 1e-6, ctypes.byref(sink))
    return _checked(value, "peak FLOP/s")


def measure_bandwidth_gbs(cores: int, mib: int = BANDWIDTH_MIB, repeats: int = 30) -> float:
    """Best-of-`repeats` STREAM-triad bandwidth over 3 arrays of `mib` MiB, in GB/s (10^9 B/s, 24 B/element)."""
    n, sink = max(8, mib * (1 << 20) // 64 * 8), ctypes.c_double()  # n doubles, a multiple of 8 (64 B aligned)
    return _checked(_bench_lib(32).tg_triad_gbs(cores, n, repeats, ctypes.byref(sink)), "memory bandwidth")


def fingerprint(model: str, cores: int, simd_bytes: int) -> str:
    """Cache key: a measurement is only valid for the same CPU model, core count and SIMD width."""
    return f"{model.strip()}|{cores} cores|{simd_bytes}B simd"


def cache_path() -> Path:
    """$TENSORGEN_HOME/hardware.json, else ~/.cache/tensorgen/hardware.json."""
    home = os.environ.get("TENSORGEN_HOME")
    return (Path(home) if home else Path.home() / ".cache" / "tensorgen") / "hardware.json"


def load_cache() -> dict[str, dict[str, Any]]:
    """All cached measurements by fingerprint; a missing or corrupt file reads as empty."""
    try:
        data = json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return {}
    return data.get("machines", {}) if isinstance(data, dict) else {}


def save_measurement(key: str, peak_gflops: float, bandwidth_gbs: float) -> None:
    """Record one machine's measurement, keeping other machines' entries; written atomically."""
    machines = {**load_cache(), key: {"peak_gflops": peak_gflops, "bandwidth_gbs": bandwidth_gbs,
                                      "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}}
    path = cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix="hardware.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump({"version": 1, "machines": machines}, f, indent=2, sort_keys=True)
    os.replace(tmp, path)


_FIELDS = {f.name: str(f.type) for f in fields(HardwareParams) if f.name != "extra"}


def coerce_override(key: str, value: Any) -> int | float | None:
    """Validate one override (e.g. from `--set l2_bytes=1M`) and convert it to the field's type."""
    if key not in _FIELDS:
        raise TensorgenError(f"unknown hardware parameter {key!r}; valid keys: {', '.join(_FIELDS)}")
    if (value is None or str(value).lower() in ("none", "")) and "None" in _FIELDS[key]:
        return None
    try:
        kind = float if "float" in _FIELDS[key] else parse_size if isinstance(value, str) and "_bytes" in key else int
        if (out := kind(value)) > 0 and math.isfinite(out):
            return out
        raise ValueError("must be positive")
    except (TypeError, ValueError) as exc:
        raise TensorgenError(f"hardware parameter {key}: bad value {value!r} ({exc})") from None


def local_hardware(measure: bool = False, overrides: dict[str, Any] | None = None,
                   progress: Callable[[str], None] | None = None) -> HardwareParams:
    """Detected params + cached peak/bandwidth; `measure` re-runs (and caches) the benchmarks; overrides last."""
    changes = {k: coerce_override(k, v) for k, v in (overrides or {}).items()}  # fail before measuring
    hw = detect_cpu()
    if measure:
        quick = os.environ.get(QUICK_ENV, "") not in ("", "0")
        iters, mib = (1 << 16, 1) if quick else (PEAK_ITERS, BANDWIDTH_MIB)
        say = progress or (lambda _msg: None)
        say(f"measuring FP32 peak: {hw.cores} threads x {hw.simd_bytes}-byte FMA ...")
        peak = measure_peak_gflops(hw.cores, hw.simd_bytes, iters=iters)
        say(f"measuring memory bandwidth: STREAM triad over 3 x {mib} MiB ...")
        bandwidth = measure_bandwidth_gbs(hw.cores, mib=mib)
        if not quick:  # tiny sizes are for tests; never let them replace a real measurement
            save_measurement(hw.extra["fingerprint"], peak, bandwidth)
        hw = hw.replace(peak_gflops=peak, bandwidth_gbs=bandwidth)
    return hw.replace(**changes) if changes else hw


@cache
def march_simd_bytes(march: str) -> int | None:
    """The widest FP vector register gcc's `-march=MARCH` may use (64 with AVX-512F, 32 with AVX, else 16), from
    the macros it predefines; None where gcc does not know the name."""
    try:
        run = subprocess.run(["gcc", f"-march={march}", "-dM", "-E", "-"], input="", capture_output=True, text=True,
                             timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if run.returncode != 0:
        return None
    macros = set(re.findall(r"#define (__\w+__) 1", run.stdout))
    return 64 if "__AVX512F__" in macros else 32 if "__AVX__" in macros else 16


#: HardwareParams field -> the cudaDeviceAttr that gives it on the device at hand
DEVICE_ATTRIBUTES = {"sm_count": 16, "max_threads_per_block": 1, "shared_mem_per_block": 8, "warp_size": 10,
                     "l2_bytes": 38}
_CC_MAJOR, _CC_MINOR = 75, 76


def cuda_hardware(target: Target) -> HardwareParams:
    """Params of a cuda target: the GPU its -device names, else the GPU at hand when one is usable and of the
    target's -arch (its limits read from the device, its peaks from the table's entry for it), else the usual part of
    the -arch (tensorgen.gpus)."""
    if target.get("device") is not None or target.emulated or not cuda_available():
        return gpu_hardware(gpu_of(target))
    runtime = cudart()
    arch = f"sm_{runtime.attribute(_CC_MAJOR)}{runtime.attribute(_CC_MINOR)}"
    read = {field: runtime.attribute(attr) for field, attr in DEVICE_ATTRIBUTES.items()}
    gpu = closest_gpu(arch, read["sm_count"], runtime.memory_bytes() / 2**30)
    if target.get("arch") not in (None, arch) or gpu is None:
        return gpu_hardware(gpu_of(target))  # compiling for another GPU than this one, or one the table lacks
    return gpu_hardware(gpu).replace(**read)


def hardware_for(target: Target | str) -> HardwareParams:
    """Params for compiling to `target`: the local CPU, with `-cores=N` limiting threads (and peak with it) and
    `-mcpu=NAME` the vector width gcc may use for NAME (narrower than the machine's: `cpu -mcpu=haswell` makes AVX2
    programs on an AVX-512 machine; peak scales with it)."""
    target = Target.parse(target)
    if target.kind == "cuda":
        return cuda_hardware(target)
    hw = local_hardware()
    simd = march_simd_bytes(target.march) if target.get("mcpu") else None
    if simd is not None and simd < hw.simd_bytes:
        hw = hw.replace(simd_bytes=simd, peak_gflops=hw.peak_gflops and hw.peak_gflops * simd / hw.simd_bytes)
    if (text := target.get("cores")) is None:
        return hw
    if not text.isdigit() or int(text) < 1:
        raise TensorgenError(f"target {target}: -cores must be a positive integer, got {text!r}")
    peak = hw.peak_gflops and hw.peak_gflops * min(int(text), hw.cores) / hw.cores  # fewer threads, less peak
    return hw.replace(cores=int(text), peak_gflops=peak)
