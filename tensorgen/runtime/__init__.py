"""Runtime: load compiled kernel libraries and call them on numpy arrays."""

from .module import ALIGNMENT, DTYPES, ArgSpec, Kernel, Module, aligned, aligned_empty, set_num_threads

__all__ = ["ALIGNMENT", "DTYPES", "ArgSpec", "Kernel", "Module", "aligned", "aligned_empty", "set_num_threads"]
