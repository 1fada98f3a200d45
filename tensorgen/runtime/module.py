"""Load compiled kernel libraries and call them on numpy arrays, checking every argument first."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import RuntimeCallError

#: Element types generated code may use (float16 is stored as uint16 on the C side).
DTYPES: frozenset[str] = frozenset({"float32", "float64", "int32", "int64", "float16", "bool"})


#: Alignment of the buffers kernels are tuned with (the measurement harness allocates them so, as
#: TVM's NDArray does): a zmm load from a buffer 16 bytes off splits across two cache lines, and a GMM
#: program that streams its input in 64-float vectors ran at 263 GFLOP/s aligned, 190 off by 16 bytes.
ALIGNMENT = 64


def aligned_empty(shape: Sequence[int], dtype: Any) -> np.ndarray:
    """An uninitialized C-contiguous array whose data starts on an ALIGNMENT-byte boundary."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(n + ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    return raw[start:start + n].view(dtype).reshape(shape)


def aligned(array: np.ndarray) -> np.ndarray:
    """`array` itself when C-contiguous and ALIGNMENT-aligned, else an aligned copy."""
    array = np.asarray(array)
    if array.flags.c_contiguous and array.ctypes.data % ALIGNMENT == 0:
        return array
    out = aligned_empty(array.shape, array.dtype)
    out[...] = array
    return out


def check_threads(n: object) -> None:
    """RuntimeCallError unless `n` is an integer >= 1 (a thread count: 0 or -1 would reach the C side as a count)."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise RuntimeCallError(f"number of threads must be an integer >= 1, got {n!r}")


def _describe(dtype: Any, shape: Sequence[int]) -> str:
    return f"{np.dtype(dtype).name}[{', '.join(str(d) for d in shape)}]"


@dataclass(frozen=True)
class ArgSpec:
    """One tensor argument of a kernel: the C function takes a pointer to its row-major buffer."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        if self.dtype not in DTYPES:
            raise ValueError(
                f"argument {self.name}: unsupported dtype {self.dtype!r}; use one of {sorted(DTYPES)}"
            )

    def __str__(self) -> str:
        return _describe(self.dtype, self.shape)


class Kernel:
    """A callable C kernel; the raw pointer call is unchecked, so shape/dtype/layout are validated here."""

    def __init__(self, fn: Any, name: str, args: Sequence[ArgSpec]):
        self.name = name
        self.args = tuple(args)
        self._fn = fn
        self._dtypes = tuple(np.dtype(a.dtype) for a in self.args)

    def __repr__(self) -> str:
        return f"Kernel({self.name}({', '.join(f'{a.name}: {a}' for a in self.args)}))"

    def __call__(self, *arrays: np.ndarray) -> None:
        """Run the kernel; outputs are among `arrays` and are written in place. Arrays from
        `aligned_empty`/`aligned` run at the speed tuning measured; others are accepted, maybe slower."""
        if len(arrays) != len(self.args):
            names = ", ".join(a.name for a in self.args)
            raise RuntimeCallError(
                f"kernel {self.name} takes {len(self.args)} arrays ({names}), got {len(arrays)}"
            )
        ptrs = []
        for spec, dtype, arr in zip(self.args, self._dtypes, arrays):
            if not isinstance(arr, np.ndarray):
                raise RuntimeCallError(
                    f"kernel {self.name}, argument {spec.name}: expected a numpy array {spec}, "
                    f"got {type(arr).__name__}"
                )
            if arr.dtype != dtype or arr.shape != spec.shape:
                raise RuntimeCallError(
                    f"kernel {self.name}, argument {spec.name}: expected {spec}, "
                    f"got {_describe(arr.dtype, arr.shape)}"
                )
            if not arr.flags.c_contiguous:
                raise RuntimeCallError(
                    f"kernel {self.name}, argument {spec.name}: array is not C-contiguous; "
                    "pass np.ascontiguousarray(x)"
                )
            ptrs.append(arr.ctypes.data)
        self._fn(*ptrs)


class Module:
    """A loaded kernel library exporting kernels plus tensorgen_set_num_threads/get_max_threads."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        try:
            self._lib = ctypes.CDLL(str(self.path))
        except OSError as exc:
            raise RuntimeCallError(f"cannot load compiled module {self.path}: {exc}") from exc

    def __repr__(self) -> str:
        return f"Module({str(self.path)!r})"

    def _function(self, name: str) -> Any:
        try:
            return self._lib[name]  # indexing yields a fresh function object, so argtypes never clash
        except AttributeError as exc:
            raise RuntimeCallError(f"module {self.path} exports no function {name!r}") from exc

    def kernel(self, name: str, args: Sequence[ArgSpec]) -> Kernel:
        """Bind exported function `name`, taking one pointer per entry of `args`, in order."""
        fn = self._function(name)
        fn.argtypes = [ctypes.c_void_p] * len(args)
        fn.restype = None
        return Kernel(fn, name, args)

    def set_num_threads(self, n: int) -> None:
        """Set the OpenMP thread count used by this module's kernels."""
        check_threads(n)
        fn = self._function("tensorgen_set_num_threads")
        fn.argtypes, fn.restype = [ctypes.c_int], None
        fn(int(n))

    def get_max_threads(self) -> int:
        """The OpenMP thread count the next parallel region will use."""
        fn = self._function("tensorgen_get_max_threads")
        fn.argtypes, fn.restype = [], ctypes.c_int
        return int(fn())


def set_num_threads(module: Module, n: int) -> None:
    """Functional form of Module.set_num_threads."""
    module.set_num_threads(n)
