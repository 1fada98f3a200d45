"""Run CUDA libraries on NumPy arrays: device arrays, host entry points that take device pointers, event timing.

A library built by nvcc (codegen.cuda_toolchain.compile_cuda) launches on a GPU through libcudart; one built for
the emulation (compile_emulated) exports the same runtime functions itself, over host memory. `CudaLibrary` binds
the runtime through the library's own handle, so the same calls serve both: an emulated library's device pointers
are host pointers, an nvcc-built one's are the GPU's (and its libcudart is the one its kernels launch with).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DeviceError, RuntimeCallError

_HOST_TO_DEVICE, _DEVICE_TO_HOST = 1, 2  # cudaMemcpyKind
#: The exported function by which an emulated library is told from one built by nvcc.
EMULATION_MARKER = "tensorgen_cuda_emulation"

_PTR, _INT = ctypes.c_void_p, ctypes.c_int
#: name -> (argtypes, restype) of every runtime function bound; all but one return a cudaError_t.
_SIGNATURES: dict[str, tuple[list[Any], Any]] = {
    "cudaGetDeviceCount": ([ctypes.POINTER(_INT)], _INT),
    "cudaGetErrorString": ([_INT], ctypes.c_char_p),
    "cudaMalloc": ([ctypes.POINTER(_PTR), ctypes.c_size_t], _INT),
    "cudaFree": ([_PTR], _INT),
    "cudaMemcpy": ([_PTR, _PTR, ctypes.c_size_t, _INT], _INT),
    "cudaDeviceSynchronize": ([], _INT),
    "cudaEventCreate": ([ctypes.POINTER(_PTR)], _INT),
    "cudaEventDestroy": ([_PTR], _INT),
    "cudaEventRecord": ([_PTR, _PTR], _INT),
    "cudaEventSynchronize": ([_PTR], _INT),
    "cudaEventElapsedTime": ([ctypes.POINTER(ctypes.c_float), _PTR, _PTR], _INT),
}


class CudaRuntime:
    """The CUDA runtime functions tensorgen calls, bound from `lib` (libcudart, a library linked against it, or
    an emulated library); every failing call raises DeviceError naming it."""

    def __init__(self, lib: ctypes.CDLL, name: str):
        self.name = name
        self._lib = lib  # kept alive as long as the functions bound from it
        self._fn: dict[str, Any] = {}
        for fname, (argtypes, restype) in _SIGNATURES.items():
            try:
                fn = lib[fname]
            except AttributeError:
                raise DeviceError(f"{name} exports no CUDA runtime function {fname}") from None
            fn.argtypes, fn.restype = argtypes, restype
            self._fn[fname] = fn

    def __repr__(self) -> str:
        return f"CudaRuntime({self.name!r})"

    def error_string(self, code: int) -> str:
        text = self._fn["cudaGetErrorString"](code)
        return text.decode(errors="replace") if text else f"unknown error {code}"

    def _call(self, fname: str, *args: Any) -> None:
        code = self._fn[fname](*args)
        if code:
            raise DeviceError(f"{fname} failed: CUDA error {code} ({self.error_string(code)})")

    def device_count(self) -> int:
        """The number of GPUs; DeviceError (CUDA's reason) where there is no driver or no GPU."""
        n = ctypes.c_int(0)
        code = self._fn["cudaGetDeviceCount"](ctypes.byref(n))
        if code or n.value == 0:
            reason = self.error_string(code) if code else "no CUDA-capable device is detected"
            raise DeviceError(f"no CUDA GPU is usable: {reason} ({self.name})")
        return n.value

    def attribute(self, attr: int, device: int = 0) -> int:
        """cudaDeviceGetAttribute(attr) of `device` (attr: a cudaDeviceAttr value, e.g. 16 for the SM count)."""
        fn = self._lib["cudaDeviceGetAttribute"]
        fn.argtypes, fn.restype = [ctypes.POINTER(_INT), _INT, _INT], _INT
        value = ctypes.c_int(0)
        code = fn(ctypes.byref(value), attr, device)
        if code:
            raise DeviceError(f"cudaDeviceGetAttribute({attr}) failed: CUDA error {code} ({self.error_string(code)})")
        return value.value

    def memory_bytes(self) -> int:
        """The current device's memory (cudaMemGetInfo's total)."""
        fn = self._lib["cudaMemGetInfo"]
        fn.argtypes, fn.restype = [ctypes.POINTER(ctypes.c_size_t)] * 2, _INT
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        code = fn(ctypes.byref(free), ctypes.byref(total))
        if code:
            raise DeviceError(f"cudaMemGetInfo failed: CUDA error {code} ({self.error_string(code)})")
        return total.value

    def synchronize(self) -> None:
        """Wait for all work on the device; DeviceError if a kernel failed."""
        self._call("cudaDeviceSynchronize")

    def empty(self, shape: Sequence[int], dtype: Any) -> DeviceArray:
        """An uninitialized device array."""
        dtype = np.dtype(dtype)
        shape = tuple(int(d) for d in shape)
        ptr = ctypes.c_void_p()
        self._call("cudaMalloc", ctypes.byref(ptr), int(np.prod(shape, dtype=np.int64)) * dtype.itemsize)
        return DeviceArray(self, ptr.value or 0, shape, dtype)

    def to_device(self, array: np.ndarray) -> DeviceArray:
        """A device array holding a copy of `array`."""
        array = np.asarray(array)
        out = self.empty(array.shape, array.dtype)
        out.copy_from(array)
        return out

    def free(self, ptr: int) -> None:
        self._call("cudaFree", ptr)

    def copy(self, dst: int, src: int, nbytes: int, to_device: bool) -> None:
        """cudaMemcpy of `nbytes` from `src` to `dst`, host to device or device to host."""
        self._call("cudaMemcpy", dst, src, nbytes, _HOST_TO_DEVICE if to_device else _DEVICE_TO_HOST)

    def elapsed(self, call: Callable[[], None], runs: int) -> list[float]:
        """Seconds each of `runs` calls of `call` takes on the device, timed between two events."""
        start, end = ctypes.c_void_p(), ctypes.c_void_p()
        self._call("cudaEventCreate", ctypes.byref(start))
        try:
            self._call("cudaEventCreate", ctypes.byref(end))
            try:
                times = []
                for _ in range(runs):
                    self._call("cudaEventRecord", start, None)
                    call()
                    self._call("cudaEventRecord", end, None)
                    self._call("cudaEventSynchronize", end)
                    ms = ctypes.c_float()
                    self._call("cudaEventElapsedTime", ctypes.byref(ms), start, end)
                    times.append(ms.value / 1e3)
                return times
            finally:
                self._fn["cudaEventDestroy"](end)
        finally:
            self._fn["cudaEventDestroy"](start)


@dataclass
class DeviceArray:
    """A row-major array in device memory (host memory under emulation); `free` it, or use it as a context."""

    runtime: CudaRuntime
    ptr: int
    shape: tuple[int, ...]
    dtype: np.dtype
    freed: bool = field(default=False, repr=False)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    @property
    def address(self) -> int:
        """The device pointer; RuntimeCallError once freed."""
        if self.freed:
            raise RuntimeCallError(f"device array {self.dtype.name}{list(self.shape)} was freed")
        return self.ptr

    def copy_from(self, array: np.ndarray) -> None:
        """Overwrite the device array with `array` (same shape and dtype)."""
        array = np.ascontiguousarray(array)
        if array.shape != self.shape or array.dtype != self.dtype:
            raise RuntimeCallError(f"cannot copy {array.dtype.name}{list(array.shape)} into device array "
                                   f"{self.dtype.name}{list(self.shape)}")
        self.runtime.copy(self.address, array.ctypes.data, self.nbytes, to_device=True)

    def to_numpy(self) -> np.ndarray:
        """A host copy."""
        out = np.empty(self.shape, self.dtype)
        self.runtime.copy(out.ctypes.data, self.address, self.nbytes, to_device=False)
        return out

    def free(self) -> None:
        if not self.freed:
            self.freed = True
            self.runtime.free(self.ptr)

    def __enter__(self) -> DeviceArray:
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()


@dataclass(frozen=True)
class HostEntry:
    """A host entry point of a CUDA library: takes device pointers, launches its kernels, returns a CUDA error
    code (0 when every launch succeeded)."""

    name: str
    runtime: CudaRuntime
    fn: Any

    def launch(self, *arrays: DeviceArray) -> None:
        """Call the entry point; DeviceError with CUDA's words if it returns an error. Does not wait."""
        for i, a in enumerate(arrays):
            if not isinstance(a, DeviceArray):
                raise RuntimeCallError(f"{self.name}: argument {i} is a {type(a).__name__}, not a DeviceArray; "
                                       "copy arrays with to_device first")
        code = self.fn(*(ctypes.c_void_p(a.address) for a in arrays))
        if code:
            raise DeviceError(f"{self.name} failed: CUDA error {code} ({self.runtime.error_string(code)})")

    def __call__(self, *arrays: DeviceArray) -> None:
        """Call the entry point and wait for its kernels; DeviceError if a launch or a kernel failed."""
        self.launch(*arrays)
        self.runtime.synchronize()

    def time(self, *arrays: DeviceArray, runs: int = 10) -> float:
        """The median seconds of `runs` calls, each timed with CUDA events, after one untimed call (which
        allocates the library's workspaces)."""
        if runs < 1:
            raise ValueError(f"runs must be >= 1, got {runs}")
        self(*arrays)
        times = self.runtime.elapsed(lambda: self.launch(*arrays), runs)
        self.runtime.synchronize()
        return statistics.median(times)


class CudaLibrary:
    """A library built by compile_cuda or compile_emulated, with the runtime its entry points launch on.
    Loading an nvcc-built library where no GPU is usable raises DeviceError."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        try:
            self._lib = ctypes.CDLL(str(self.path))
        except OSError as exc:
            raise RuntimeCallError(f"cannot load CUDA library {self.path}: {exc}") from exc
        self.emulated = hasattr(self._lib, EMULATION_MARKER)
        self.runtime = CudaRuntime(self._lib, f"emulated {self.path.name}" if self.emulated else "libcudart")
        if not self.emulated:
            self.runtime.device_count()

    def __repr__(self) -> str:
        return f"CudaLibrary({str(self.path)!r}{', emulated' if self.emulated else ''})"

    def entry(self, name: str) -> HostEntry:
        """The host entry point `name` (an `extern "C" int name(T* ...)` of the source)."""
        try:
            fn = self._lib[name]
        except AttributeError:
            raise RuntimeCallError(f"CUDA library {self.path} exports no function {name!r}") from None
        fn.restype = ctypes.c_int
        return HostEntry(name, self.runtime, fn)


def find_cudart() -> str | None:
    """The CUDA runtime library: under $CUDA_HOME, $CUDA_PATH, the toolkit of nvcc on PATH or /usr/local/cuda,
    else what the dynamic linker knows (ldconfig); None if there is none."""
    roots = [Path(os.environ[v]) for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.append(Path(nvcc).resolve().parent.parent)
    roots.append(Path("/usr/local/cuda"))
    for root in roots:
        for lib in ("lib64", "lib", "targets/*/lib"):
            found = sorted(root.glob(f"{lib}/libcudart.so*"))
            if found:
                return str(found[0])
    return ctypes.util.find_library("cudart")


@cache
def cudart() -> CudaRuntime:
    """The process's libcudart, once a GPU is known to be usable; DeviceError (one line: why) otherwise."""
    path = find_cudart()
    if path is None:
        raise DeviceError("no CUDA runtime library (libcudart) found; set CUDA_HOME to the CUDA toolkit")
    try:
        lib = ctypes.CDLL(path)
    except OSError as exc:
        raise DeviceError(f"cannot load the CUDA runtime {path}: {exc}") from None
    runtime = CudaRuntime(lib, path)
    runtime.device_count()
    return runtime


@cache
def cuda_available() -> bool:
    """Whether a CUDA GPU is usable here (a driver, a device and the runtime library); never raises. Asked once
    per process (`cudart` keeps no failure, and a GPU does not come or go while a process runs)."""
    try:
        cudart()
    except DeviceError:
        return False
    return True
