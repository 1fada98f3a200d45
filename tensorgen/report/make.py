"""`write_report`: a tuning database (and optionally a model) to one HTML file."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tensorgen.graph.backend.tasks import extract_tasks
from tensorgen.graph.ir import Graph
from tensorgen.records.database import SQLiteDatabase
from tensorgen.report.data import ModelSpec, ReportData, ReportError, choose_target, gather
from tensorgen.report.page import Page, render
from tensorgen.report.profile import profile_model


@dataclass(frozen=True)
class ModelRequest:
    """The model a report is about: its ONNX form and graph, and the inputs to profile it on (None: no profile)."""

    onnx_model: Any
    graph: Graph
    feed: Mapping[str, np.ndarray] | None = None
    threads: int = 1


def model_spec(graph: Graph, target: str) -> tuple[ModelSpec, dict[str, float]]:
    """The model's tasks as the report needs them (weights and names by workload key) and their FLOPs."""
    tasks = extract_tasks(graph, target)
    spec = ModelSpec(graph.name, {t.task.workload_key: float(t.weight) for t in tasks},
                     {t.task.workload_key: t.task.desc for t in tasks})
    return spec, {t.task.workload_key: t.task.dag.flop_count for t in tasks}


def write_report(db: SQLiteDatabase, out: str | Path, command: str, target: str | None = None,
                 model: ModelRequest | None = None) -> ReportData:
    """Write the report of `db` (for `target`, default: the one with the most records) to `out`; `command` is shown
    as what made it. With `model`, its estimated latency comes from its own graph, and with `model.feed` the page
    shows where its time goes (it is built and run)."""
    target = choose_target(db, target)
    spec = flops = None
    if model is not None:
        spec, flops = model_spec(model.graph, target)
    data = gather(db, target, spec)
    page = Page(command, profile_note="Pass --model MODEL --profile to build and run the model and see each "
                                      "kernel's share of its time here, next to ONNX Runtime's per-node profile.")
    if model is not None and model.feed is not None and flops is not None:
        peak = data.hw.get("peak_gflops")
        page = Page(command, profile_model(model.onnx_model, model.graph, model.feed, db, flops, model.threads,
                                           float(peak) if peak else None))
    text = render(data, page)
    try:
        Path(out).write_text(text, encoding="utf-8")
    except OSError as err:
        raise ReportError(f"cannot write the report to {str(out)!r}: {err.strerror or err}") from None
    return data
