"""Runtime: load compiled kernel libraries and call them on numpy arrays."""

from .module import DTYPES, ArgSpec, Kernel, Module, set_num_threads

__all__ = ["DTYPES", "ArgSpec", "Kernel", "Module", "set_num_threads"]
