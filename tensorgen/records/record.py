"""One measured program: the workload (embedded), the target, the steps and what measuring them gave."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol, TypeVar

from tensorgen.dag import ComputeDAG
from tensorgen.dag_json import (
    DagFormatError,
    DagVersionError,
    dag_from_json,
    dag_to_json,
    decode_float,
    encode_float,
)
from tensorgen.errors import TensorgenError
from tensorgen.measure.types import ErrorKind, MeasureResult
from tensorgen.schedule.state import State
from tensorgen.schedule.steps import Step
from tensorgen.target import HardwareParams, Target
from tensorgen.task import SearchTask
from tensorgen.version import __version__

RECORD_FORMAT = 1


class RecordsError(TensorgenError, ValueError):
    """A record or record store is unusable: malformed data, a missing database file, ..."""


class RecordFormatError(RecordsError):
    """Records written by a newer tensorgen (a higher format version) that this one cannot read."""


class DatabaseWriteError(RecordsError):
    """The tuning database cannot be written (read-only file or directory, full disk): measuring would be lost."""


def steps_hash(steps: list | str) -> str:
    """Identity of a step list, independent of JSON spacing (the database dedupes measured states on it)."""
    data = json.loads(steps) if isinstance(steps, str) else steps
    return hashlib.sha256(json.dumps(data, separators=(",", ":")).encode()).hexdigest()[:32]


def program_cost(costs: Sequence[float]) -> float:
    """A program's cost from its valid measurements (seconds; inf: none): their upper median. A program is
    re-timed when it becomes a task's best, and with two measurements the slower one counts, so one lucky
    (or one disturbed) measurement never decides a best on its own."""
    return sorted(costs)[len(costs) // 2] if costs else math.inf


class Measured(Protocol):
    """What the curves read of a measurement: a Record, or a row of the database's history (`history.Measurement`)."""

    @property
    def steps_hash(self) -> str: ...

    @property
    def ok(self) -> bool: ...

    @property
    def cost(self) -> float: ...


M = TypeVar("M", bound=Measured)


def first_records(records: Iterable[M]) -> list[M]:
    """Each program's first record, in commit order: one per trial, its re-timings (see `program_cost`) left out."""
    seen: set[str] = set()
    out = []
    for r in records:
        if r.steps_hash not in seen:
            seen.add(r.steps_hash)
            out.append(r)
    return out


def running_best(records: Iterable[Measured]) -> Iterator[tuple[bool, float]]:
    """For each of `records` (one workload, in commit order): whether it is its program's first measurement (a
    trial; later ones are re-timings) and the best program cost after it (seconds, inf: none yet), every program
    at `program_cost` of its measurements so far."""
    runs: dict[str, list[float]] = {}
    program: dict[str, float] = {}  # each program's cost so far
    best_key, best = None, math.inf
    for r in records:
        first = r.steps_hash not in runs
        costs = runs.setdefault(r.steps_hash, [])
        if r.ok and math.isfinite(r.cost):
            costs.append(r.cost)
            program[r.steps_hash] = program_cost(costs)
            if r.steps_hash == best_key and program[r.steps_hash] > best:  # a re-timing made the best slower
                best_key = min(program, key=program.__getitem__)
                best = program[best_key]
            elif program[r.steps_hash] < best:
                best_key, best = r.steps_hash, program[r.steps_hash]
        yield first, best


def best_cost_curve(records: Iterable[Measured]) -> list[float]:
    """The best program cost (seconds, inf: none yet) after each trial of `records` (in commit order), every
    program at `program_cost` of its measurements so far: a re-timing updates the point of the trial it follows."""
    curve: list[float] = []
    for first, best in running_best(records):
        if first:
            curve.append(best)
        else:
            curve[-1] = best
    return curve


def result_to_json(result: MeasureResult) -> dict:
    return {
        "costs": [encode_float(c) for c in result.costs],
        "error_kind": ErrorKind(result.error_kind).value,
        "error_msg": result.error_msg,
        "all_cost": encode_float(result.all_cost),
        "timestamp": result.timestamp,
    }


def result_from_json(data: dict) -> MeasureResult:
    if not isinstance(data, dict):
        raise TypeError(f"a measure result is a JSON object, got {type(data).__name__}")
    try:
        kind = ErrorKind(data.get("error_kind", "none"))
    except ValueError:
        kind = ErrorKind.UNKNOWN  # a kind added later still reads as a failure
    return MeasureResult(
        tuple(decode_float(c) for c in data["costs"]),
        kind,
        str(data.get("error_msg", "")),
        decode_float(data.get("all_cost", 0.0)),
        float(data.get("timestamp", 0.0)),
    )


@dataclass(frozen=True)
class Record:
    """A measured State with everything needed to replay it elsewhere.

    `dag` is `dag_to_json` data, `steps` is `json.loads(state.to_json())`, `target` is the canonical
    target string and `hw` the HardwareParams dict the measurement ran under.
    """

    workload_key: str
    target: str
    dag: dict = field(repr=False)
    hw: dict = field(repr=False)
    steps: list = field(repr=False)
    result: MeasureResult
    version: str = __version__
    format: int = RECORD_FORMAT

    @classmethod
    def from_measure(cls, task: SearchTask, state: State, result: MeasureResult) -> Record:
        if state.source.workload_key != task.workload_key:
            raise RecordsError(
                f"state is for workload {state.source.workload_key}, but the task is workload {task.workload_key}"
            )
        return cls(task.workload_key, str(task.target), dag_to_json(task.dag), task.hw.to_dict(),
                   json.loads(state.to_json()), result)

    # ---- derived ----------------------------------------------------------------------------

    @property
    def ok(self) -> bool:
        return self.result.ok

    @property
    def cost(self) -> float:
        """Median seconds per run; inf for a failed measurement."""
        return self.result.median_cost

    @property
    def error_kind(self) -> str:
        return ErrorKind(self.result.error_kind).value

    @property
    def sets_layouts(self) -> bool:
        """Whether the program stores tensors in layouts of its own (ALT's layout steps): its arguments then
        differ from the task's, and a model build cannot use it until the model's layouts follow it."""
        return any(step and step[0] == "TL" for step in self.steps)

    @property
    def steps_json(self) -> str:
        return json.dumps(self.steps, separators=(",", ":"))

    @property
    def steps_hash(self) -> str:
        return steps_hash(self.steps)

    @cached_property
    def compute_dag(self) -> ComputeDAG:
        """The embedded DAG, rebuilt once per record."""
        return dag_from_json(self.dag)

    @cached_property
    def parsed_steps(self) -> tuple[Step, ...]:
        """The steps as Step objects; RecordsError when stored data does not describe steps."""
        try:
            return tuple(Step.from_json(s) for s in self.steps)
        except (TensorgenError, TypeError, ValueError) as err:
            raise RecordsError(f"malformed steps ({type(err).__name__}: {err})") from None

    def state(self, dag: ComputeDAG | None = None) -> State:
        """The measured program, replayed on `dag` (default: the embedded one).

        Steps come from storage, so a step that does not fit the DAG is a RecordsError, not a crash."""
        dag = dag if dag is not None else self.compute_dag
        if dag.workload_key != self.workload_key:
            raise RecordsError(f"record is for workload {self.workload_key}, not {dag.workload_key}")
        try:
            return State.replay(dag, self.parsed_steps)
        except TensorgenError:
            raise
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as err:
            raise RecordsError(f"steps do not replay ({type(err).__name__}: {err})") from None

    def task(self) -> SearchTask:
        return SearchTask(self.compute_dag, Target.parse(self.target), HardwareParams.from_dict(self.hw))

    # ---- JSON lines ---------------------------------------------------------------------------

    def to_dict(self, include_dag: bool = True) -> dict:
        out: dict[str, Any] = {
            "format": self.format, "version": self.version, "workload_key": self.workload_key,
            "target": self.target, "hw": self.hw, "steps": self.steps, "result": result_to_json(self.result),
        }
        if include_dag:
            out["dag"] = self.dag
        return out

    def to_json_line(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_dict(cls, data: Any, dag: dict | None = None) -> Record:
        """Raises RecordFormatError for a newer format, RecordsError for anything malformed."""
        if not isinstance(data, dict):
            raise RecordsError(f"a record is a JSON object, got {type(data).__name__}")
        fmt = data.get("format")
        if not isinstance(fmt, int) or isinstance(fmt, bool):
            raise RecordsError(f"record has no integer 'format' field (got {fmt!r})")
        if fmt > RECORD_FORMAT:
            raise RecordFormatError(
                f"record format version {fmt} is newer than this tensorgen {__version__} reads "
                f"(format {RECORD_FORMAT}); upgrade tensorgen to read it"
            )
        try:
            record = cls(
                str(data["workload_key"]), str(data["target"]), data["dag"] if dag is None else dag,
                dict(data["hw"]), list(data["steps"]), result_from_json(data["result"]),
                str(data.get("version", "")), fmt,
            )
        except (KeyError, TypeError, ValueError) as err:
            what = f"missing field {err}" if isinstance(err, KeyError) else f"{type(err).__name__}: {err}"
            raise RecordsError(f"malformed record ({what})") from None
        if not isinstance(record.dag, dict) or not all(isinstance(s, list) for s in record.steps):
            raise RecordsError("malformed record ('dag' must be an object and 'steps' a list of steps)")
        _ = record.parsed_steps  # fail on reading rather than when the program is needed
        return record

    @classmethod
    def from_json_line(cls, line: str) -> Record:
        try:
            data = json.loads(line)
        except json.JSONDecodeError as err:
            raise RecordsError(f"not valid JSON ({err})") from None
        return cls.from_dict(data)


def check_dag(dag: dict, workload_key: str) -> ComputeDAG:
    """The embedded DAG, rebuilt: it must deserialize and hash to `workload_key` (else its records are corrupt).

    Raises RecordFormatError for a DAG from a newer tensorgen, RecordsError for anything else."""
    try:
        compute_dag = dag_from_json(dag)
    except DagVersionError as err:
        raise RecordFormatError(str(err)) from None
    except DagFormatError as err:
        raise RecordsError(f"bad embedded DAG: {err}") from None
    except (TensorgenError, TypeError, ValueError, KeyError, IndexError) as err:
        raise RecordsError(f"bad embedded DAG: {type(err).__name__}: {err}") from None
    if compute_dag.workload_key != workload_key:
        raise RecordsError(f"embedded DAG has workload key {compute_dag.workload_key}, but the record says "
                           f"{workload_key}")
    return compute_dag
