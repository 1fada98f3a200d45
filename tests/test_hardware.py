"""Tests for hardware detection, the micro-benchmarks, the per-machine measurement cache and `tensorgen hw`."""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

import pytest

from tensorgen import hardware
from tensorgen.cli.hw import format_table, parse_overrides, register
from tensorgen.errors import TensorgenError
from tensorgen.hardware import (
    coerce_override,
    detect_cpu,
    fingerprint,
    hardware_for,
    load_cache,
    local_hardware,
    march_simd_bytes,
    parse_cpuinfo,
    parse_getconf,
    parse_key_values,
    parse_lscpu_caches,
    parse_size,
    physical_cores,
    read_sysfs_caches,
    save_measurement,
    simd_bytes_from_flags,
)

REQUIRED_JSON_KEYS = {"peak_gflops", "bandwidth_gbs", "cores", "simd_bytes"}


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own empty measurement cache."""
    monkeypatch.setenv("TENSORGEN_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(hardware.QUICK_ENV, raising=False)
    return tmp_path / "home"


# ---------------------------------------------------------------- detection on this machine
def test_detect_cpu_is_sane():
    hw = detect_cpu()
    assert 1 <= hw.cores <= len(os.sched_getaffinity(0))
    assert hw.simd_bytes in (16, 32, 64)
    assert hw.cache_line_bytes in (32, 64, 128, 256)
    assert 4 << 10 <= hw.l1_bytes < hw.l2_bytes <= 1 << 30 and hw.l3_bytes >= 1 << 20
    assert hw.peak_gflops is None and hw.bandwidth_gbs is None  # nothing measured in a fresh cache
    assert hw.extra["fingerprint"] == fingerprint(hw.extra["model"], hw.cores, hw.simd_bytes)
    flags = parse_cpuinfo(Path("/proc/cpuinfo").read_text())[1]
    if "avx2" in flags and "avx512f" not in flags:  # the Zen3 dev box: 2 cores, AVX2
        assert hw.simd_bytes == 32


# ---------------------------------------------------------------- pure parsers on fake text
@pytest.mark.parametrize(
    "text, expected",
    [("32K", 32 << 10), ("32768K", 32 << 20), ("1 MiB", 1 << 20), ("524288", 524288), ("512 KiB", 512 << 10),
     ("32M\n", 32 << 20), ("64 B", 64), ("2 GB", 2 << 30), ("1.5M", 3 << 19)],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "K", "-1K", "12 furlongs"])
def test_parse_size_rejects_garbage(bad):
    with pytest.raises(ValueError):
        parse_size(bad)


X86_CPUINFO = """processor\t: 0
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse sse2 avx fma avx2
cpu cores\t: 2

processor\t: 1
model name\t: ignored second entry
flags\t\t: fpu avx512f
"""
ARM_CPUINFO = "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd evtstrm aes crc32\nCPU part\t: 0xd0c\n"


def test_parse_cpuinfo_x86_and_arm():
    model, flags = parse_cpuinfo(X86_CPUINFO)
    assert model == "AMD EPYC 7B13" and "avx2" in flags and "avx512f" not in flags
    assert simd_bytes_from_flags(flags) == 32
    model, flags = parse_cpuinfo(ARM_CPUINFO)
    assert model == "" and "asimd" in flags and simd_bytes_from_flags(flags) == 16
    assert parse_cpuinfo("") == ("", frozenset())


@pytest.mark.parametrize(
    "flags, width", [({"sse2", "avx512f", "avx2"}, 64), ({"avx"}, 32), ({"sse2"}, 16), ({"asimd"}, 16), (set(), 16)]
)
def test_simd_bytes_from_flags(flags, width):
    assert simd_bytes_from_flags(frozenset(flags)) == width


def test_physical_cores_from_lscpu():
    text = "CPU(s):   16\nThread(s) per core:  2\nCore(s) per socket:  4\nSocket(s):  2\nModel name: X: Y\n"
    info = parse_key_values(text)
    assert info["Model name"] == "X: Y" and physical_cores(info) == 8
    assert physical_cores(parse_key_values("Core(s) per cluster: 4\n")) == 4  # some arm lscpu
    assert physical_cores(parse_key_values("CPU(s): 4\n")) is None
    assert physical_cores(parse_key_values("Core(s) per socket: n/a\n")) is None


def _fake_index(root: Path, name: str, **files: str) -> None:
    (root / name).mkdir(parents=True)
    for fname, text in files.items():
        (root / name / fname).write_text(text + "\n")


def test_read_sysfs_caches(tmp_path: Path):
    _fake_index(tmp_path, "index0", level="1", type="Data", size="48K", coherency_line_size="64")
    _fake_index(tmp_path, "index1", level="1", type="Instruction", size="32K", coherency_line_size="64")
    _fake_index(tmp_path, "index2", level="2", type="Unified", size="2048K")  # line size missing: still used
    _fake_index(tmp_path, "index3", level="3", type="Unified")  # size missing: skipped
    assert read_sysfs_caches(tmp_path) == {"l1_bytes": 48 << 10, "cache_line_bytes": 64, "l2_bytes": 2 << 20}
    assert read_sysfs_caches(tmp_path / "missing") == {}


def test_parse_lscpu_caches_and_getconf():
    lscpu = """NAME ONE-SIZE ALL-SIZE WAYS TYPE        LEVEL  SETS PHY-LINE COHERENCY-SIZE
L1d       32K      64K    8 Data            1    64        1             64
L1i       32K      64K    8 Instruction     1    64        1             64
L2       512K       1M    8 Unified         2  1024        1             64
L3        32M      32M   16 Unified         3 32768        1             64
"""
    assert parse_lscpu_caches(lscpu) == {"l1_bytes": 32 << 10, "cache_line_bytes": 64, "l2_bytes": 512 << 10,
                                         "l3_bytes": 32 << 20}
    assert parse_lscpu_caches("") == {} and parse_lscpu_caches("lscpu: invalid option -- 'C'\n") == {}
    getconf = "LEVEL1_DCACHE_SIZE                 32768\nLEVEL1_DCACHE_LINESIZE             64\n" \
              "LEVEL2_CACHE_SIZE                  524288\nLEVEL3_CACHE_SIZE                  0\nLEVEL4_CACHE_SIZE\n"
    assert parse_getconf(getconf) == {"l1_bytes": 32768, "cache_line_bytes": 64, "l2_bytes": 524288}


# ---------------------------------------------------------------- cache, overrides, targets
def test_cache_round_trip_keyed_by_fingerprint(home: Path):
    assert load_cache() == {}
    mine = detect_cpu().extra["fingerprint"]
    save_measurement("Some Other CPU|64 cores|64B simd", 5000.0, 300.0)
    assert detect_cpu().peak_gflops is None  # another machine's numbers are never used
    save_measurement(mine, 123.5, 17.25)
    hw = detect_cpu()
    assert (hw.peak_gflops, hw.bandwidth_gbs) == (123.5, 17.25)
    data = json.loads((home / "hardware.json").read_text())
    assert set(data["machines"]) == {mine, "Some Other CPU|64 cores|64B simd"}  # other entries kept
    assert fingerprint("AMD EPYC", 2, 32) != fingerprint("AMD EPYC", 1, 32) != fingerprint("AMD EPYC", 1, 16)
    (home / "hardware.json").write_text("{not json")
    assert load_cache() == {} and detect_cpu().peak_gflops is None


def test_measure_true_caches(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(hardware, "measure_peak_gflops", lambda cores, simd, iters: 190.0)
    monkeypatch.setattr(hardware, "measure_bandwidth_gbs", lambda cores, mib: 20.0)
    said: list[str] = []
    hw = local_hardware(measure=True, progress=said.append)
    assert (hw.peak_gflops, hw.bandwidth_gbs) == (190.0, 20.0) and len(said) == 2
    assert local_hardware().peak_gflops == 190.0  # read back from the cache, no measuring


def test_overrides_apply_last():
    save_measurement(detect_cpu().extra["fingerprint"], 100.0, 10.0)
    hw = local_hardware(overrides={"cores": "1", "l2_bytes": "1M", "peak_gflops": 55, "bandwidth_gbs": None})
    assert (hw.cores, hw.l2_bytes, hw.peak_gflops, hw.bandwidth_gbs) == (1, 1 << 20, 55.0, None)
    assert coerce_override("l1_bytes", 4096) == 4096 and coerce_override("peak_gflops", "none") is None


def test_bad_overrides_are_clear():
    with pytest.raises(TensorgenError, match=r"unknown hardware parameter 'l4_bytes'; valid keys: cores, .*l3_bytes"):
        local_hardware(overrides={"l4_bytes": 1})
    for key, value in [("cores", "two"), ("cores", 0), ("cores", None), ("peak_gflops", "nan"), ("l1_bytes", "-1")]:
        with pytest.raises(TensorgenError, match=f"hardware parameter {key}: bad value"):
            coerce_override(key, value)


def test_hardware_for_targets():
    local = local_hardware()
    assert hardware_for("cpu") == local
    save_measurement(local.extra["fingerprint"], 200.0, 20.0)
    one = hardware_for("cpu -mcpu=znver3 -cores=1")  # AVX2: 32-byte vectors, narrower than an AVX-512 machine's
    narrow = min(32, local.simd_bytes) / local.simd_bytes
    assert one.cores == 1 and one.simd_bytes == min(32, local.simd_bytes) and one.bandwidth_gbs == 20.0
    assert one.peak_gflops == pytest.approx(200.0 / local.cores * narrow)
    assert hardware_for("cpu -cores=64").peak_gflops == 200.0  # more threads than cores: no more peak
    with pytest.raises(TensorgenError, match="-cores must be a positive integer"):
        hardware_for("cpu -cores=zero")
    h200 = hardware_for("cuda -device=h200")
    assert (h200.sm_count, h200.bandwidth_gbs, h200.extra["arch"]) == (132, 4800, "sm_90")
    assert hardware_for("cuda -arch=sm_80").extra["gpu"] == "a100"
    with pytest.raises(TensorgenError, match="a100 is sm_80, not sm_90"):
        hardware_for("cuda -arch=sm_90 -device=a100")


@pytest.mark.parametrize("march, simd", [("haswell", 32), ("skylake-avx512", 64), ("x86-64", 16),
                                         ("no-such-cpu", None)])
def test_vector_width_of_a_gcc_cpu_name(march, simd):
    assert march_simd_bytes(march) == simd


# ---------------------------------------------------------------- micro-benchmarks (tiny sizes)
def test_micro_benchmarks_small():
    hw = detect_cpu()
    peak = hardware.measure_peak_gflops(hw.cores, hw.simd_bytes, iters=1 << 16, repeats=3)
    bandwidth = hardware.measure_bandwidth_gbs(hw.cores, mib=2, repeats=2)
    assert math.isfinite(peak) and peak > 0 and math.isfinite(bandwidth) and bandwidth > 0
    assert hardware.measure_peak_gflops(1, 16, iters=1 << 12, repeats=1) > 0  # any width compiles


# ---------------------------------------------------------------- the `hw` subcommand
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tensorgen")
    register(parser.add_subparsers(dest="command", required=True))
    return parser


def test_cli_measure_writes_json(tmp_path: Path, home: Path, monkeypatch, capsys):
    monkeypatch.setenv(hardware.QUICK_ENV, "1")
    out = tmp_path / "hw.json"
    args = _parser().parse_args(["hw", "--measure", "--json", str(out), "--set", "l3_bytes=16M"])
    assert args.fn(args) == 0
    data = json.loads(out.read_text())
    assert REQUIRED_JSON_KEYS <= data.keys() and data["peak_gflops"] > 0 and data["bandwidth_gbs"] > 0
    assert data["l3_bytes"] == 16 << 20
    captured = capsys.readouterr()
    assert "measuring FP32 peak" in captured.err and "GFLOP/s" in captured.out and "l3_bytes" in captured.out
    assert not (home / "hardware.json").exists()  # quick numbers never reach the cache


def test_cli_table_and_errors(capsys):
    args = _parser().parse_args(["hw", "--json", "-"])
    assert args.fn(args) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["peak_gflops"] is None and "not measured" in captured.err
    table = format_table(detect_cpu().replace(peak_gflops=197.0, bandwidth_gbs=21.5), frozenset({"cores"}))
    assert "197.0 GFLOP/s" in table and "21.5 GB/s" in table and "KiB" in table and "[--set]" in table
    assert parse_overrides(["cores=1", "l2_bytes = 1M"]) == {"cores": "1", "l2_bytes": "1M"}
    with pytest.raises(TensorgenError, match="expected KEY=VALUE"):
        parse_overrides(["cores"])
    args = _parser().parse_args(["hw", "--set", "bogus=1"])
    with pytest.raises(TensorgenError, match="valid keys"):
        args.fn(args)


class FakeDevice:
    """What the CUDA runtime says of an H200 (cudaDeviceGetAttribute, cudaMemGetInfo)."""

    ATTRIBUTES = {75: 9, 76: 0, 16: 132, 1: 1024, 8: 48 * 1024, 10: 32, 38: 60 * 2**20}

    def attribute(self, attr: int, device: int = 0) -> int:
        return self.ATTRIBUTES[attr]

    def memory_bytes(self) -> int:
        return 143_771 * 2**20


def test_a_cuda_target_without_a_device_is_the_gpu_at_hand(monkeypatch):
    """The GPU at hand is told by its architecture, SMs and memory (an H100 and an H200 differ in memory alone); its
    limits are read from it. An explicit -device, another -arch or emulation keep the table's GPU."""
    from tensorgen import hardware

    monkeypatch.setattr(hardware, "cuda_available", lambda: True)
    monkeypatch.setattr(hardware, "cudart", FakeDevice)
    here = hardware_for("cuda")
    assert (here.extra["gpu"], here.bandwidth_gbs, here.sm_count, here.l2_bytes) == ("h200", 4800, 132, 60 * 2**20)
    assert hardware_for("cuda -arch=sm_90").extra["gpu"] == "h200"
    assert hardware_for("cuda -device=a100").extra["gpu"] == "a100"
    assert hardware_for("cuda -arch=sm_80").extra["gpu"] == "a100"
    assert hardware_for("cuda -emulate=1").extra["gpu"] == "h100"
