"""Measurement: build and time candidates in isolation; every failure classified."""

from tensorgen.measure.builder import Builder, LocalBuilder
from tensorgen.measure.guard import ErrorGuard
from tensorgen.measure.runner import LocalRunner, Runner
from tensorgen.measure.types import BuildResult, ErrorKind, MeasureInput, MeasureResult

__all__ = [
    "BuildResult", "Builder", "ErrorGuard", "ErrorKind", "LocalBuilder", "LocalRunner", "MeasureInput",
    "MeasureResult", "Runner",
]
