"""What the tuning report shows, read from a tuning database: each task's best speed after every trial and over
tuning time, each model's estimated end-to-end latency over time (the task scheduler's curve), the runs, the error
kinds, the target and the hardware. Nothing here draws; `figures` and `page` turn it into HTML.

Tuning time is the time spent tuning, not the calendar: each run's clock starts at its start and the runs are laid
end to end (a database resumed a week later has no week-long gap). A database made before runs were kept has only
the records' timestamps; their stretches without a record for GAP_S seconds are taken as the breaks between runs.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tensorgen.errors import TensorgenError
from tensorgen.hardware import load_cache
from tensorgen.records.database import SQLiteDatabase
from tensorgen.records.history import Measurement, Run
from tensorgen.records.record import running_best

GAP_S = 600.0  # without runs: a pause this long between two records separates two runs


class ReportError(TensorgenError, ValueError):
    """The report cannot be made as asked (no records for the target, an unknown model, no matplotlib, ...)."""


@dataclass(frozen=True)
class TaskCurve:
    """One task (workload + target): `costs[k]` is the best program's cost (seconds, inf: none succeeded yet) after
    trial k + 1 and `gflops[k]` its speed (0: none), measured `times[k]` seconds of tuning time in (re-timings of a
    best update the trial they follow). A task without FLOPs (a transpose) has speeds of 0: draw its costs."""

    workload_key: str
    desc: str
    flops: float
    costs: tuple[float, ...]
    gflops: tuple[float, ...]
    times: tuple[float, ...]
    measurements: int  # trials and re-timings
    rounds: int  # rounds it was given (0: the database keeps none)
    errors: dict[str, int]  # failed measurements by kind
    best_s: float  # the best program's cost (inf: none)

    @property
    def trials(self) -> int:
        return len(self.gflops)

    @property
    def best_gflops(self) -> float:
        return self.gflops[-1] if self.gflops else 0.0


@dataclass(frozen=True)
class ModelCurve:
    """A model's estimated end-to-end latency (sum of weight x best latency of its tasks) after each measurement
    that changed it: `latency_ms[k]` at `times[k]` seconds of tuning time and `trials[k]` trials of its tasks.
    `complete[k]` is False while some task had no program yet (the estimate leaves it out: a partial sum)."""

    name: str
    weights: dict[str, float]  # workload key -> occurrences in the model
    source: str  # where the weights came from
    times: tuple[float, ...]
    trials: tuple[int, ...]
    latency_ms: tuple[float, ...]
    complete: tuple[bool, ...]
    untuned: tuple[str, ...]  # workload keys of its tasks without any successful measurement

    @property
    def final_ms(self) -> float | None:
        return self.latency_ms[-1] if self.latency_ms and self.complete[-1] else None


@dataclass(frozen=True)
class ReportData:
    """Everything the page shows but the profile (see `profile`)."""

    db_path: str
    target: str
    other_targets: dict[str, int]  # targets of the database not reported, with their record counts
    hw: dict[str, Any]  # the hardware parameters of the latest record
    runs: tuple[Run, ...]
    tasks: tuple[TaskCurve, ...]
    models: tuple[ModelCurve, ...]
    errors: dict[str, int]  # failed measurements by kind, all tasks
    measurements: int
    tuning_s: float
    has_history: bool  # the database keeps runs and rounds
    notes: tuple[str, ...] = ()  # what the page could not show, and why


@dataclass(frozen=True)
class ModelSpec:
    """A model named on the report's command line: its tasks' weights and names (from its graph)."""

    name: str
    weights: dict[str, float]
    descs: dict[str, str] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# tuning time


def tuning_clock(measurements: Sequence[Measurement], runs: Sequence[Run]) -> dict[int, float]:
    """Seconds of tuning time at each measurement (by id): the runs laid end to end, each from its start (see the
    module docstring); measurements without a run are grouped into runs by their gaps."""
    started = {r.id: r.started for r in runs}
    groups: dict[object, list[Measurement]] = {}
    previous: Measurement | None = None
    gap_group = 0
    for m in sorted(measurements, key=lambda m: m.created):
        if m.run is None:
            if previous is None or previous.run is not None or m.created - previous.created > GAP_S:
                gap_group += 1
            key: object = ("gap", gap_group)
        else:
            key = m.run
        groups.setdefault(key, []).append(m)
        previous = m
    clock: dict[int, float] = {}
    offset = 0.0
    for key, members in sorted(groups.items(), key=lambda kv: kv[1][0].created):
        start = min(started.get(key, members[0].created), members[0].created)  # type: ignore[arg-type]
        for m in members:
            clock[m.id] = offset + m.created - start
        offset += members[-1].created - start
    return clock


# ---------------------------------------------------------------------------------------------
# curves


def task_curve(key: str, desc: str, flops: float, rows: Sequence[Measurement], clock: Mapping[int, float]
               ) -> TaskCurve:
    """The curve of one task from its measurements in commit order."""
    costs: list[float] = []
    times: list[float] = []
    best = math.inf
    for m, (first, best) in zip(rows, running_best(rows)):
        if first:
            costs.append(best)
            times.append(clock[m.id])
        else:
            costs[-1] = best
    gflops = [flops / c / 1e9 if 0 < c < math.inf else 0.0 for c in costs]
    errors = Counter(m.error_kind for m in rows if m.error_kind != "none")
    rounds = len({(m.run, m.round) for m in rows if m.round is not None})
    return TaskCurve(key, desc, flops, tuple(costs), tuple(gflops), tuple(times), len(rows), rounds,
                     dict(errors.most_common()), best)


def model_curve(spec: ModelSpec, source: str, by_task: Mapping[str, Sequence[Measurement]],
                clock: Mapping[int, float]) -> ModelCurve:
    """The estimated latency of `spec` after each measurement of its tasks that changed it."""
    events: list[tuple[int, str, bool, float]] = []  # (id, task, first of its program, task's best after it)
    for key in spec.weights:
        rows = by_task.get(key, ())
        events += [(m.id, key, first, best) for m, (first, best) in zip(rows, running_best(rows))]
    events.sort()
    best = dict.fromkeys(spec.weights, math.inf)
    times: list[float] = []
    trials: list[int] = []
    latency: list[float] = []
    complete: list[bool] = []
    done = 0
    for rid, key, first, cost in events:
        done += first
        if cost == best[key]:
            continue
        best[key] = cost
        known = [spec.weights[k] * c for k, c in best.items() if math.isfinite(c)]
        if not known:
            continue
        times.append(clock[rid])
        trials.append(done)
        latency.append(sum(known) * 1e3)
        complete.append(len(known) == len(best))
    if times:  # the curve runs to the last trial
        last_time = max(clock[rid] for rid, *_ in events)
        times.append(last_time)
        trials.append(done)
        latency.append(latency[-1])
        complete.append(complete[-1])
    untuned = tuple(k for k, c in best.items() if not math.isfinite(c))
    return ModelCurve(spec.name, dict(spec.weights), source, tuple(times), tuple(trials), tuple(latency),
                      tuple(complete), untuned)


# ---------------------------------------------------------------------------------------------
# the whole report


def choose_target(db: SQLiteDatabase, target: str | None = None) -> str:
    """`target` if the database has records for it, else ReportError; None: the target with the most records."""
    counts: Counter = Counter()
    for _, name, n in db.workloads():
        counts[name] += n
    return _pick_target(counts, target, db.path)


def _pick_target(counts: Counter, target: str | None, db_path: str) -> str:
    if not counts:
        raise ReportError(f"tuning database {db_path!r} holds no records; tune something first "
                          f"(tensorgen tune ... --db {db_path})")
    if target is None:
        return counts.most_common(1)[0][0]
    if target not in counts:
        raise ReportError(f"tuning database {db_path!r} has no records for target {target!r}; it has "
                          + ", ".join(f"{t!r} ({n} records)" for t, n in counts.most_common()))
    return target


def _stored_models(runs: Sequence[Run]) -> list[ModelSpec]:
    """The models the runs tuned, with the weights the latest run of each stored."""
    found: dict[str, ModelSpec] = {}
    for run in runs:
        models = run.info.get("models")
        if not isinstance(models, dict):
            continue
        for name, pairs in models.items():
            try:
                weights = {str(key): float(weight) for key, weight in pairs}
            except (TypeError, ValueError):
                continue
            found[str(name)] = ModelSpec(str(name), weights)
    return list(found.values())


def _task_names(runs: Sequence[Run], model: ModelSpec | None) -> dict[str, str]:
    names: dict[str, str] = {}
    for run in runs:
        tasks = run.info.get("tasks")
        if isinstance(tasks, dict):
            names.update({str(k): str(v) for k, v in tasks.items() if v})
    if model is not None:
        names.update(model.descs)
    return names


def _dag_name(db: SQLiteDatabase, key: str, target: str) -> tuple[str, float | None]:
    """A name for a task no run named (its DAG's outputs) and its FLOPs (None: its DAG is unreadable)."""
    dag = db.workload_dag(key, target)
    if dag is None:
        return key, None
    outputs = ", ".join(f"{t.name}{list(t.shape)}" for t in dag.outputs)
    return outputs or key, dag.flop_count


def gather(db: SQLiteDatabase, target: str | None = None, model: ModelSpec | None = None) -> ReportData:
    """The report's data from `db` for `target` (default: the target with the most records). `model` (from its
    graph) gives that model's curve; without it, each model a tuning run stored is drawn."""
    everything = db.measurements()
    counts = Counter(m.target for m in everything)
    target = _pick_target(counts, target, db.path)
    rows = [m for m in everything if m.target == target]
    used = {m.run for m in rows}
    runs = tuple(r for r in db.runs() if r.info.get("target") in (None, target) or r.id in used)
    clock = tuning_clock(rows, runs)
    by_task: dict[str, list[Measurement]] = {}
    for m in rows:
        by_task.setdefault(m.workload_key, []).append(m)
    names = _task_names(runs, model)
    notes: list[str] = []
    tasks = []
    for key, measured in by_task.items():
        fallback, flops = _dag_name(db, key, target)
        if flops is None:
            notes.append(f"task {key}: its DAG is missing or unreadable, so its speed is not known (shown as 0)")
        tasks.append(task_curve(key, names.get(key, fallback), flops or 0.0, measured, clock))
    specs = [model] if model is not None else _stored_models(runs)
    source = "the model's graph" if model is not None else "the tuning run"
    models = tuple(model_curve(s, source, by_task, clock) for s in specs)
    if model is None and not models and any(r.info.get("kind") == "model" for r in runs):
        notes.append("the runs name no model weights; pass --model to draw the estimated latency")
    legacy = sum(m.run is None for m in rows)
    if legacy:
        notes.append(f"{legacy} of {len(rows)} records predate tuning runs (or an older tensorgen wrote them): their "
                     f"tuning time is read from their timestamps, with pauses over {GAP_S:.0f} s cut out, and their "
                     "rounds are not known")
    has_history = db.history and legacy < len(rows)
    hw = next((dict(r.info["hw"]) for r in reversed(runs) if isinstance(r.info.get("hw"), dict)), None)
    hw, measured = with_measured_peak(hw if hw is not None else _latest_hw(db, rows))
    notes += [measured] if measured else []
    errors = Counter()
    for t in tasks:
        errors.update(t.errors)
    return ReportData(db.path, target, {t: n for t, n in counts.most_common() if t != target}, hw, runs,
                      tuple(tasks), models, dict(errors.most_common()), len(rows),
                      max(clock.values(), default=0.0), has_history, tuple(notes))


def with_measured_peak(hw: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """`hw` (the hardware parameters a tuning run recorded) with the peak FLOP/s and bandwidth that `tensorgen hw
    --measure` cached for a machine of the same fingerprint, where the run recorded none (it ran before the
    measurement), and a note saying so ("" when nothing was added)."""
    extra = hw.get("extra")
    key = extra.get("fingerprint") if isinstance(extra, dict) else None
    entry = load_cache().get(key, {}) if isinstance(key, str) else {}
    if hw.get("peak_gflops") or not entry.get("peak_gflops"):
        return hw, ""
    return ({**hw, "peak_gflops": entry["peak_gflops"], "bandwidth_gbs": hw.get("bandwidth_gbs")
             or entry.get("bandwidth_gbs")},
            f"% of peak is of the peak `tensorgen hw --measure` measured on this kind of machine ({key}, "
            f"{entry.get('measured_at', 'at an unknown time')}); the tuning runs recorded none")


def _latest_hw(db: SQLiteDatabase, rows: Sequence[Measurement]) -> dict[str, Any]:
    """The hardware parameters of a database without runs: those of the last measured task's best record."""
    for key in dict.fromkeys(m.workload_key for m in reversed(rows)):
        record = db.best(key, rows[0].target)
        if record is not None:
            return dict(record.hw)
    return {}
