"""Explicit SIMD for `vectorize` loops (GCC vector extensions)."""

from __future__ import annotations


class VectorEmitter:
    def __init__(self, writer, simd_bytes: int):
        self.writer = writer
        self.simd_bytes = simd_bytes

    def typedefs(self) -> str:
        return ""

    def try_emit(self, loop, depth: int) -> bool:
        return False
