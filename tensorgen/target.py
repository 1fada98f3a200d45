"""Targets (`cpu`, `cpu -mcpu=znver3 -cores=2`, `cuda -arch=sm_90`) and hardware parameters as data."""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, field, fields

from tensorgen.errors import TensorgenError

TARGET_KINDS = ("cpu", "cuda")
# The options each kind understands: an unknown one is a typo that would otherwise be ignored in silence.
TARGET_OPTIONS = {"cpu": ("cores", "mcpu"), "cuda": ("arch", "device", "emulate")}


class TargetError(TensorgenError, ValueError):
    """A target string could not be parsed."""


@dataclass(frozen=True)
class Target:
    """What to compile for. `options` are the `-key=value` flags of the target string."""

    kind: str
    options: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, text: str | Target) -> Target:
        if isinstance(text, Target):
            return text
        try:
            parts = shlex.split(text or "")
        except ValueError as err:  # an unbalanced quote
            raise TargetError(f"target {text!r}: {err}") from None
        if not parts or parts[0] not in TARGET_KINDS:
            raise TargetError(f"target {text!r}: must start with one of {', '.join(TARGET_KINDS)}")
        kind, known = parts[0], TARGET_OPTIONS[parts[0]]
        opts: dict[str, str] = {}
        for p in parts[1:]:
            key, eq, value = p.lstrip("-").partition("=")
            if not p.startswith("-") or not eq or not key or not value:
                raise TargetError(f"target {text!r}: option {p!r} must look like -key=value")
            if key not in known:
                raise TargetError(f"target {text!r}: unknown option -{key}; a {kind} target takes "
                                  f"{', '.join(f'-{k}' for k in known)}")
            if key in opts:
                raise TargetError(f"target {text!r}: option -{key} is given twice")
            opts[key] = value
        cores = opts.get("cores")
        if cores is not None and (not cores.isdigit() or int(cores) < 1):
            raise TargetError(f"target {text!r}: -cores must be a positive integer, got {cores!r}")
        if opts.get("emulate", "0") not in ("0", "1"):
            raise TargetError(f"target {text!r}: -emulate takes 0 or 1, got {opts['emulate']!r}")
        return cls(kind, tuple(sorted(opts.items())))

    def get(self, key: str, default: str | None = None) -> str | None:
        return dict(self.options).get(key, default)

    @property
    def emulated(self) -> bool:
        """A CUDA target whose programs run on this CPU under the emulation (`cuda -emulate=1`): right answers,
        times that say nothing of a GPU's."""
        return self.get("emulate") == "1"

    @property
    def march(self) -> str:
        """The value for gcc's -march: the target's -mcpu, or `native`."""
        return self.get("mcpu", "native")

    def __str__(self) -> str:
        return " ".join([self.kind, *(f"-{k}={v}" for k, v in self.options)])


#: the HardwareParams fields that describe a GPU (left at their defaults on a CPU, and not shown for one)
GPU_FIELDS = ("sm_count", "warp_size", "max_threads_per_block", "shared_mem_per_block", "registers_per_thread")


@dataclass(frozen=True)
class HardwareParams:
    """What search and cost models know about the machine. Sizes in bytes, peaks per whole device."""

    cores: int
    simd_bytes: int = 32
    cache_line_bytes: int = 64
    l1_bytes: int = 32 * 1024
    l2_bytes: int = 512 * 1024
    l3_bytes: int = 8 * 1024 * 1024
    peak_gflops: float | None = None  # measured FP32 peak, all cores
    bandwidth_gbs: float | None = None  # measured main-memory bandwidth
    # GPU fields (0 / defaults on CPUs)
    sm_count: int = 0
    warp_size: int = 32
    max_threads_per_block: int = 1024
    shared_mem_per_block: int = 48 * 1024
    registers_per_thread: int = 255
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def is_gpu(self) -> bool:
        """Parameters of a GPU (tensorgen.gpus: its SMs counted), whose programs bind loops to blocks and threads."""
        return self.sm_count > 0

    @property
    def float_lanes(self) -> int:
        """float32 elements in one vector register."""
        return max(self.simd_bytes // 4, 1)

    @property
    def vector_registers(self) -> int:
        """Architectural vector registers of a CPU: 32 with AVX-512, else 16 (AVX2; NEON's 32 are 16 bytes)."""
        return 32 if self.simd_bytes >= 64 else 16

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> HardwareParams:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def replace(self, **changes) -> HardwareParams:
        return type(self).from_dict({**self.to_dict(), **changes})
