"""How busy the machine is: one fixed, tiny kernel timed by the candidates' harness, against its quiet time.

Tuning times candidates with every core. Another process on one of them stretches a call of a small parallel
kernel from microseconds to a scheduler time slice (milliseconds): on 2 cores with other work running, transposes
were stored at 7 ms that take 3 us. The calibration kernel (a 64x64 matmul, its rows split over the threads) is
hit the same way, so its time over its quiet time says how far the candidates' times timed with it can be trusted.

Its quiet time is the QUIET_RANK-th fastest it was ever timed with that many threads on this machine (the fastest
until it has been timed that often), kept in the kernel cache (a tuning run that starts on a busy machine still
knows it), unless one is given ($TENSORGEN_QUIET_SECONDS, or `quiet_s`): on a machine that is never quiet, or to
simulate a busy one.

Why 4th fastest and 5x: on a quiet 2-core AMD EPYC, 563 timings in 25 s had a median of 28.7 us, a 90th percentile
of 31.8 us and a fastest of 13.7 us; against that fastest, a bound of 1.5x marked 98% of them and a tuning run of
BERT-tiny on the quiet machine had every batch marked (up to 2.4x). Beside one CPU-bound process the same kernel
takes 8 ms (a thread waits out a time slice): 280x. 0.7% of the quiet timings were such a time slice too.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from tensorgen.build import compile_state
from tensorgen.codegen.backend import backend_for
from tensorgen.codegen.toolchain import atomic_write, cache_dir, usable_cache_dir
from tensorgen.dag import ComputeDAG
from tensorgen.errors import TensorgenError
from tensorgen.hardware import local_hardware
from tensorgen.measure.harness import HarnessConfig, arg_specs, run_harness
from tensorgen.schedule.state import State
from tensorgen.target import Target
from tensorgen.te.ops.linalg import matmul
from tensorgen.te.tensor import placeholder

BUSY_BOUND = 5.0  # the calibration kernel this many times slower than quiet: the machine is busy
QUIET_RANK = 4  # the quiet time is the 4th fastest timing seen: a fast outlier or three do not set it
BOUND_ENV = "TENSORGEN_BUSY_BOUND"  # another bound; 0 turns the check off
QUIET_ENV = "TENSORGEN_QUIET_SECONDS"  # the calibration kernel's quiet time, instead of the one seen (QUIET_RANK)
#: the calibration matmul's n: tens of microseconds on 2 cores (steadier than a few), so that a time slice lost
#: (milliseconds) shows at once
SIZE = 64
KERNEL = "calibration"
#: one call per repeat: a repeat of many calls averages a lost time slice away. A timing is the SLOW_RANK-th slowest
#: of the repeats: with a competing process a call loses a time slice about every other time, so the median of 5
#: missed the load half the time (BERT-tiny tuned beside one: 2 of 19 batches passed as quiet and a layer norm's
#: best stayed at 8.4 ms, 700x its quiet time); a third of 9 calls slowed by chance on a quiet machine is rare
HARNESS = HarnessConfig(number=1, repeat=9)
SLOW_RANK = 3


def _env_float(name: str, default: float) -> float:
    text = os.environ.get(name, "")
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise TensorgenError(f"{name}={text!r} is not a number >= 0")
    return value


def busy_bound() -> float:
    """The slowdown of the calibration kernel past which measurements are marked: $TENSORGEN_BUSY_BOUND, else
    BUSY_BOUND (0: never)."""
    return _env_float(BOUND_ENV, BUSY_BOUND)


def given_quiet_s() -> float:
    """$TENSORGEN_QUIET_SECONDS (0 where unset: the fastest time seen is the quiet one)."""
    return _env_float(QUIET_ENV, 0.0)


def calibration_dag() -> ComputeDAG:
    a = placeholder((SIZE, SIZE), name="A")
    b = placeholder((SIZE, SIZE), name="B")
    return ComputeDAG([a, b, matmul(a, b)])


def calibration_state(dag: ComputeDAG) -> State:
    """The naive program with its rows split over the threads, as a tuned candidate's outer loop is."""
    state = State(dag)
    last = len(state.stages) - 1
    state.parallel(last, state.stages[last].iters[0].name)
    return state


@dataclass
class Calibration:
    """The calibration kernel timed with `threads` threads by the harness `exe`."""

    exe: Path
    threads: int
    _so: str = field(default="", init=False, repr=False)
    _specs: list[str] = field(default_factory=list, init=False, repr=False)

    def seconds(self) -> float:
        """One timing of the kernel: the SLOW_RANK-th slowest of its repeats (inf if the harness failed)."""
        if not self._so:
            dag = calibration_dag()
            hw = local_hardware()
            self._so = str(compile_state(calibration_state(dag), backend_for(Target("cpu"), hw), KERNEL).path)
            self._specs = arg_specs(dag)
        config = HarnessConfig(number=HARNESS.number, repeat=HARNESS.repeat, threads=self.threads)
        run = run_harness(self.exe, self._so, KERNEL, self._specs, config, timeout=10.0)
        ok = run.returncode == 0 and len(run.costs) == HARNESS.repeat
        return sorted(run.costs)[-SLOW_RANK] if ok else math.inf

    def slowdown(self, quiet_s: float = 0.0) -> float:
        """How many times slower than `quiet_s` (0: the quiet time seen, stored in the kernel cache per thread
        count and kernel, see the module docstring) the kernel runs now, at least 1.0; 1.0 also when it could not be
        timed (the harness failing says nothing of the load, and the candidates' own errors say the rest)."""
        now = self.seconds()
        if not math.isfinite(now):
            return 1.0
        return max(1.0, now / (quiet_s or self._quiet(now)))

    def _path(self) -> Path:
        key = hashlib.sha256(f"{self._so}|{self.threads}".encode()).hexdigest()[:16]
        return cache_dir() / f"quiet-{key}.json"

    def _quiet(self, now: float) -> float:
        """The quiet time: the QUIET_RANK-th fastest time seen (stored), `now` included; the fastest while fewer
        are known."""
        path = self._path()
        try:
            stored = sorted(float(t) for t in json.loads(path.read_text())["fastest"])
        except (OSError, ValueError, KeyError, TypeError):
            stored = []
        fastest = sorted([*stored, now])[:QUIET_RANK]
        if fastest != stored:
            usable_cache_dir()
            atomic_write(path, json.dumps({"fastest": fastest, "threads": self.threads}))
        return fastest[-1] if len(fastest) == QUIET_RANK else fastest[0]
