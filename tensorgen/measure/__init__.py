"""Measurement: build and time candidates in isolation; every failure classified."""

from tensorgen.measure.types import BuildResult, ErrorKind, MeasureInput, MeasureResult

__all__ = ["BuildResult", "ErrorKind", "MeasureInput", "MeasureResult"]
