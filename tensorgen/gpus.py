"""NVIDIA GPUs as HardwareParams, from their data sheets: what a `cuda` target compiles for when no GPU is at hand
to ask (`cuda -arch=sm_90` is an H100; `-device=h200` picks another of the same or any architecture).

Peaks are FP32 (non-tensor-core) GFLOP/s and DRAM GB/s of the SXM/PCIe part named; a kernel's static shared
memory is limited to 48 KiB per block on every architecture (more needs dynamic allocation and an opt-in)."""

from __future__ import annotations

from dataclasses import dataclass

from tensorgen.target import HardwareParams, Target, TargetError


@dataclass(frozen=True)
class Gpu:
    name: str
    arch: str
    sm_count: int
    peak_gflops: float
    bandwidth_gbs: float
    l2_bytes: int
    max_threads_per_sm: int = 2048
    shared_mem_per_sm: int = 228 * 1024
    max_blocks_per_sm: int = 32
    registers_per_sm: int = 64 * 1024
    memory_gib: int = 80


MIB = 1024 * 1024
GPUS: dict[str, Gpu] = {g.name: g for g in (
    Gpu("v100", "sm_70", 80, 15_700, 900, 6 * MIB, shared_mem_per_sm=96 * 1024, memory_gib=32),
    Gpu("t4", "sm_75", 40, 8_100, 320, 4 * MIB, max_threads_per_sm=1024, shared_mem_per_sm=64 * 1024,
        max_blocks_per_sm=16, memory_gib=16),
    Gpu("a100", "sm_80", 108, 19_500, 2_039, 40 * MIB, shared_mem_per_sm=164 * 1024),
    Gpu("rtx3090", "sm_86", 82, 35_600, 936, 6 * MIB, max_threads_per_sm=1536, shared_mem_per_sm=100 * 1024,
        max_blocks_per_sm=16, memory_gib=24),
    Gpu("l4", "sm_89", 58, 30_300, 300, 48 * MIB, max_threads_per_sm=1536, shared_mem_per_sm=100 * 1024,
        max_blocks_per_sm=24, memory_gib=24),
    Gpu("h100", "sm_90", 132, 66_900, 3_350, 50 * MIB),
    Gpu("h200", "sm_90", 132, 66_900, 4_800, 50 * MIB, memory_gib=141),
)}
#: the GPU a bare `-arch` stands for
DEFAULT_FOR_ARCH = {"sm_70": "v100", "sm_75": "t4", "sm_80": "a100", "sm_86": "rtx3090", "sm_89": "l4",
                    "sm_90": "h100"}
DEFAULT_ARCH = "sm_90"


def gpu_of(target: Target) -> Gpu:
    """The GPU `target` (kind cuda) names by `-device`, else its `-arch`'s usual part; TargetError if unknown."""
    arch = target.get("arch")
    device = target.get("device")
    if device is None:
        arch = arch or DEFAULT_ARCH
        if arch not in DEFAULT_FOR_ARCH:
            raise TargetError(f"target {target}: unknown -arch {arch!r}; known: {', '.join(DEFAULT_FOR_ARCH)}")
        return GPUS[DEFAULT_FOR_ARCH[arch]]
    gpu = GPUS.get(device.lower())
    if gpu is None:
        raise TargetError(f"target {target}: unknown -device {device!r}; known: {', '.join(GPUS)}")
    if arch is not None and arch != gpu.arch:
        raise TargetError(f"target {target}: {gpu.name} is {gpu.arch}, not {arch}")
    return gpu


def gpu_hardware(gpu: Gpu) -> HardwareParams:
    """HardwareParams of `gpu`: `cores` are its SMs; a cache line is a 128-byte segment."""
    return HardwareParams(cores=gpu.sm_count, simd_bytes=4, cache_line_bytes=128, l1_bytes=gpu.shared_mem_per_sm,
                          l2_bytes=gpu.l2_bytes, l3_bytes=0, peak_gflops=gpu.peak_gflops,
                          bandwidth_gbs=gpu.bandwidth_gbs, sm_count=gpu.sm_count,
                          extra={"gpu": gpu.name, "arch": gpu.arch, "max_threads_per_sm": gpu.max_threads_per_sm,
                                 "max_blocks_per_sm": gpu.max_blocks_per_sm, "registers_per_sm": gpu.registers_per_sm})


def closest_gpu(arch: str, sm_count: int, memory_gib: float) -> Gpu | None:
    """The GPU of the table a detected one is: same architecture and SMs, the nearest in memory (an H100 and an H200
    differ in memory alone); None if the table has no GPU of that architecture and SM count."""
    same = [g for g in GPUS.values() if g.arch == arch and g.sm_count == sm_count]
    return min(same, key=lambda g: abs(g.memory_gib - memory_gib)) if same else None
