"""CompiledModel: load a built model directory (model.so + weights.bin + model.json) and run it.

The weights file is mapped read-only, after its size and digest are checked against model.json
(runtime.model_files); a host model of format 4 reads its weights where they are mapped (the page cache's copy,
shared by every process running the model), older ones and device models copy them in init and the mapping is
dropped then.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

import numpy as np

from tensorgen.errors import RuntimeCallError
from tensorgen.runtime.cuda import cuda_available
from tensorgen.runtime.model_files import CHUNK, LIBRARY, MANIFEST, REBUILD, WEIGHTS, open_checked
from tensorgen.runtime.module import aligned_empty, check_threads

#: each model library path this process has loaded, with the identity (inode, mtime, size) of the file it loaded
_LOADED: dict[str, tuple[int, int, int]] = {}


def load_library(path: Path, opened: BinaryIO) -> ctypes.CDLL:
    """dlopen the library at `path`, whose file `opened` is (checked against its manifest). dlopen hands back the
    library it already loaded from a path even after the file there was rebuilt (running the old kernels with the
    new model's manifest crashed), so a library rebuilt since this process first loaded its path, or replaced since
    `opened` was opened, is loaded through a private copy of `opened`, unlinked once mapped."""
    stat = os.fstat(opened.fileno())
    identity, key = (stat.st_ino, stat.st_mtime_ns, stat.st_size), str(path.resolve())
    now = path.stat()
    if _LOADED.setdefault(key, identity) == identity and (now.st_ino, now.st_mtime_ns, now.st_size) == identity:
        return ctypes.CDLL(key)
    opened.seek(0)
    with tempfile.NamedTemporaryFile(suffix=".so", delete=False) as copy:
        while chunk := opened.read(CHUNK):
            copy.write(chunk)
    try:
        return ctypes.CDLL(copy.name)
    finally:
        os.unlink(copy.name)


def map_weights(opened: BinaryIO) -> np.ndarray:
    """The open weights file mapped read-only, as bytes (a one-byte zero array for an empty file, which mmap
    refuses: a model without weights never reads them)."""
    size = os.fstat(opened.fileno()).st_size
    if size == 0:
        return np.zeros(1, np.uint8)
    return np.frombuffer(mmap.mmap(opened.fileno(), size, access=mmap.ACCESS_READ), dtype=np.uint8)


class CompiledModel:
    """A compiled whole model. `run` takes arrays by position or by input name, returns the outputs."""

    def __init__(self, directory: str | os.PathLike[str], threads: int | None = None):
        self.directory = Path(directory)
        try:
            self.manifest = json.loads((self.directory / MANIFEST).read_text())
            with open_checked(self.directory, WEIGHTS, self.manifest) as weights_file, \
                    open_checked(self.directory, LIBRARY, self.manifest) as library_file:
                weights = map_weights(weights_file)  # the mapping outlives the file
                self._lib = load_library(self.directory / LIBRARY, library_file)
        except RuntimeCallError:
            raise
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise RuntimeCallError(f"{self.directory} is not a built tensorgen model: {err}; {REBUILD}") from err
        self.inputs = [(v["name"], tuple(v["shape"]), np.dtype(v["dtype"])) for v in self.manifest["inputs"]]
        self.outputs = [(v["name"], tuple(v["shape"]), np.dtype(v["dtype"])) for v in self.manifest["outputs"]]
        lib = self._lib
        lib.tensorgen_model_init.argtypes, lib.tensorgen_model_init.restype = [ctypes.c_void_p], ctypes.c_void_p
        lib.tensorgen_model_run.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        lib.tensorgen_model_run.restype = ctypes.c_int
        lib.tensorgen_model_free.argtypes, lib.tensorgen_model_free.restype = [ctypes.c_void_p], None
        self._run_timed = getattr(lib, "tensorgen_model_run_timed", None)  # absent in builds before profiling
        self._error = lib.tensorgen_model_error if self.manifest.get("format", 1) >= 3 else None  # why a run failed
        if self._error is not None:
            self._error.argtypes, self._error.restype = [ctypes.c_void_p], ctypes.c_char_p
        if self._run_timed is not None:
            self._run_timed.argtypes, self._run_timed.restype = [ctypes.c_void_p] * 4, ctypes.c_int
        self._handle = lib.tensorgen_model_init(weights.ctypes.data)
        # formats 2 and 3, and device models, copy the weights in init; 1 and a format 4 host model read ours
        reads_ours = self.manifest.get("format", 1) < 2 or self.manifest.get("weights") == "mapped"
        self._weights = weights if reads_ours else None
        if not self._handle:
            target = self.manifest.get("target", "cpu")
            if target.startswith("cuda") and "-emulate=1" not in target and not cuda_available():
                raise RuntimeCallError(f"{self.directory}: built for {target}, and no CUDA GPU is usable on this "
                                       "machine (a model built with -emulate=1 runs on this CPU)")
            raise RuntimeCallError(f"{self.directory}: out of memory initializing the model")
        if threads is not None:
            self.set_num_threads(threads)

    def __del__(self) -> None:
        if getattr(self, "_handle", None):
            self._lib.tensorgen_model_free(self._handle)
            self._handle = None

    def set_num_threads(self, n: int) -> None:
        """Run the model's kernels on `n` threads (an integer >= 1; RuntimeCallError otherwise)."""
        check_threads(n)
        fn = self._lib.tensorgen_set_num_threads
        fn.argtypes, fn.restype = [ctypes.c_int], None
        fn(int(n))

    def _arrays(self, inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray]) -> list[np.ndarray]:
        if isinstance(inputs, Mapping):
            missing = [n for n, _, _ in self.inputs if n not in inputs]
            extra = sorted(set(inputs) - {n for n, _, _ in self.inputs})
            if missing or extra:
                raise RuntimeCallError(f"model inputs are {[n for n, _, _ in self.inputs]}; "
                                       f"missing {missing}, unknown {extra}")
            inputs = [inputs[n] for n, _, _ in self.inputs]
        if len(inputs) != len(self.inputs):
            raise RuntimeCallError(f"the model takes {len(self.inputs)} inputs, got {len(inputs)}")
        arrays = []
        for (name, shape, dtype), arr in zip(self.inputs, inputs):
            arr = np.asarray(arr)
            if arr.shape != shape or arr.dtype != dtype:
                raise RuntimeCallError(f"input {name!r}: expected {dtype.name}{list(shape)}, "
                                       f"got {arr.dtype.name}{list(arr.shape)}")
            # read in place, aligned or not (kernels load vectors unaligned): the copy that aligned MobileNet-V2's
            # input cost 0.1 ms a run, 3% of the model, more than any kernel lost reading it unaligned
            arrays.append(np.ascontiguousarray(arr))
        return arrays

    def run(self, inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray],
            out: Sequence[np.ndarray] | None = None) -> list[np.ndarray]:
        """The outputs for `inputs`; written into `out` (C-contiguous writable arrays of the outputs' shapes and
        dtypes, returned) when given, else into new arrays."""
        return self._run(inputs, None, out)

    def profile(self, inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray], repeat: int = 20) -> list[dict]:
        """Each kernel's median time (ms) over `repeat` runs of the whole model, next to what its schedule
        measured alone when it was tuned (`tuned_ms`, None if untuned): where a model loses time that
        tuning did not see (cold inputs, thread wake-up, untuned glue)."""
        kernels = self.manifest["kernels"]
        if self._run_timed is None:
            raise RuntimeCallError(f"{self.directory} was built before profiling existed; build it again")
        self._run(inputs, np.zeros(len(kernels)))  # warm-up
        times = np.zeros((repeat, len(kernels)))
        for r in range(repeat):
            self._run(inputs, times[r])
        return [{"kernel": k["name"], "ms": float(np.median(times[:, i])) * 1e3,
                 "tuned_ms": None if k.get("cost") is None else k["cost"] * 1e3}
                for i, k in enumerate(kernels)]

    def _outputs(self, out: Sequence[np.ndarray] | None) -> list[np.ndarray]:
        if out is None:
            return [aligned_empty(shape, dtype) for _, shape, dtype in self.outputs]
        if len(out) != len(self.outputs):
            raise RuntimeCallError(f"the model has {len(self.outputs)} outputs, got {len(out)} arrays to write to")
        for (name, shape, dtype), arr in zip(self.outputs, out):
            if not isinstance(arr, np.ndarray) or arr.shape != shape or arr.dtype != dtype:
                got = f"{arr.dtype.name}{list(arr.shape)}" if isinstance(arr, np.ndarray) else type(arr).__name__
                raise RuntimeCallError(f"output {name!r}: expected {dtype.name}{list(shape)}, got {got}")
            if not arr.flags.c_contiguous or not arr.flags.writeable:
                raise RuntimeCallError(f"output {name!r}: the array must be C-contiguous and writable")
        return list(out)

    def _run(self, inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray], seconds: np.ndarray | None,
             out: Sequence[np.ndarray] | None = None) -> list:
        arrays = self._arrays(inputs)
        outs = self._outputs(out)
        ins = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
        ptrs = (ctypes.c_void_p * len(outs))(*[o.ctypes.data for o in outs])
        if seconds is None:
            status = self._lib.tensorgen_model_run(self._handle, ins, ptrs)
        else:
            status = self._run_timed(self._handle, ins, ptrs, seconds.ctypes.data)
        if status != 0:
            reason = self._error(self._handle).decode(errors="replace") if self._error is not None else ""
            raise RuntimeCallError(f"{self.directory}: {reason or 'the model failed to run'}")
        return outs
