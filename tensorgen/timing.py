"""The one timing protocol of every comparison of engines (tensorgen and its peers): `tensorgen bench`, bench/.

    comparison = compare({"tensorgen": run_ours, "torch": run_torch}, bound=0.10)
    comparison.seconds["torch"] / comparison.seconds["tensorgen"]   # == comparison.ratios["torch"]

- Alternating blocks: a round times every engine once, one block each, with a `pause` sleep before
  each block (thread pools spin after a call and would steal the cores from the engine timed next) and
  an untimed warm-up (cores and caches settle after the pause); the order of the engines rotates from
  round to round, so that no engine always runs right after another's spinning pool. A load that comes
  and goes between rounds thus hits every engine alike.
- Same calls per sample: a block takes `samples` samples of `calls` back-to-back calls each, `calls`
  the same for every engine of a comparison and large enough that the fastest engine's sample lasts
  `min_sample_s` (so the timer and the loop are a few percent at most of any sample); a block's time
  per call is the median of its samples.
- One statistic: an engine's time is the median over rounds of its blocks, and a ratio is the ratio of
  those medians, so every column of a row derives from the same numbers and cannot contradict another.
- Rounds must agree: the spread (interquartile range over the median) of each engine's rounds and of
  the per-round time ratios to the reference engine must lie within `bound`. While they do not, one
  more round is measured, up to `max_rounds`; a comparison that never agrees is `reliable = False`,
  and benchmarks mark such rows as unreliable instead of publishing them as results.

`competing_load` starts one CPU-bound process for the duration of a timing, so that the comparison
under load can be reproduced anywhere.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

DEFAULT_BOUND = 0.10


@dataclass(frozen=True)
class Protocol:
    """How a comparison is timed (see the module docstring); the defaults suit kernels and whole models."""

    rounds: int = 3  # rounds measured before agreement is first checked
    max_rounds: int = 9  # rounds after which a comparison that still disagrees is unreliable
    bound: float = DEFAULT_BOUND  # largest spread (IQR / median) of rounds and of per-round ratios
    samples: int = 5  # samples per block
    calls: int | None = None  # calls per sample, the same for every engine (None: from min_sample_s)
    min_sample_s: float = 1e-3  # the fastest engine's sample lasts at least this long
    pause_s: float = 0.5  # sleep before each block
    warm_s: float = 0.2  # untimed calls after the pause
    max_block_s: float = 2.0  # a block stops after this long once it has 3 samples
    clock: Callable[[], float] = time.perf_counter  # what a second is (the tests count CPU time)

    def __post_init__(self) -> None:
        if self.rounds < 2 or self.max_rounds < self.rounds:
            raise ValueError(f"need 2 <= rounds <= max_rounds, got rounds={self.rounds}, max_rounds={self.max_rounds}")
        if not self.bound > 0 or self.samples < 1 or (self.calls is not None and self.calls < 1):
            raise ValueError(f"need bound > 0, samples >= 1 and calls >= 1 (bound={self.bound}, "
                             f"samples={self.samples}, calls={self.calls})")

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "clock"}


def add_arguments(parser: argparse.ArgumentParser, pause_s: float = 0.5) -> None:
    """The protocol's command-line options, the same in every benchmark; `protocol_from` reads them."""
    default = Protocol()
    group = parser.add_argument_group("timing (tensorgen/timing.py)")
    group.add_argument("--rounds", type=int, default=default.rounds,
                       help=f"timing rounds before their agreement is checked (default {default.rounds})")
    group.add_argument("--max-rounds", type=int, default=default.max_rounds,
                       help=f"rounds after which a comparison whose rounds still disagree is marked unreliable "
                            f"(default {default.max_rounds})")
    group.add_argument("--bound", type=float, default=default.bound,
                       help=f"largest spread (interquartile range / median) of an engine's rounds and of the "
                            f"per-round ratios (default {default.bound})")
    group.add_argument("--repeat", type=int, default=default.samples,
                       help=f"timed samples per block (default {default.samples})")
    group.add_argument("--pause", type=float, default=pause_s, help=f"sleep before each block, s (default {pause_s})")
    group.add_argument("--load", action="store_true",
                       help="run one competing CPU-bound process while timing (the comparison under load)")


def protocol_from(args: argparse.Namespace) -> Protocol:
    """The Protocol of `add_arguments`' options (ValueError when they make no protocol)."""
    return Protocol(rounds=args.rounds, max_rounds=args.max_rounds, bound=args.bound, samples=args.repeat,
                    pause_s=args.pause, warm_s=min(Protocol.warm_s, args.pause))


def spread(values: list[float]) -> float:
    """Interquartile range over the median: 0 when the values agree; one outlier among five is ignored,
    one among three or half of the values disturbed is not."""
    q25, q50, q75 = np.percentile(values, [25, 50, 75])
    return float((q75 - q25) / q50) if q50 > 0 else math.inf


@dataclass
class Comparison:
    """Seconds per call of every engine in every round, and what follows from them."""

    rounds_s: dict[str, list[float]]  # engine -> seconds per call in each round, in round order
    reference: str  # the engine the ratios are taken against
    calls: int  # calls per sample, every engine
    protocol: Protocol

    @property
    def rounds(self) -> int:
        return len(self.rounds_s[self.reference])

    @property
    def seconds(self) -> dict[str, float]:
        """Each engine's seconds per call: the median over rounds."""
        return {name: float(np.median(v)) for name, v in self.rounds_s.items()}

    @property
    def ratios(self) -> dict[str, float]:
        """How many times the reference engine is as fast as each other engine: the ratio of the medians."""
        s = self.seconds
        return {name: s[name] / s[self.reference] for name in s if name != self.reference}

    def gflops(self, flops: float) -> dict[str, float]:
        """Each engine's GFLOP/s for `flops` per call, from the same medians as `seconds` and `ratios`."""
        return {name: flops / s / 1e9 for name, s in self.seconds.items()}

    @property
    def round_ratios(self) -> dict[str, list[float]]:
        ours = self.rounds_s[self.reference]
        return {name: [t / o for t, o in zip(v, ours)] for name, v in self.rounds_s.items() if name != self.reference}

    @property
    def spreads(self) -> dict[str, float]:
        return {name: spread(v) for name, v in self.rounds_s.items()}

    @property
    def ratio_spreads(self) -> dict[str, float]:
        return {name: spread(v) for name, v in self.round_ratios.items()}

    @property
    def reliable(self) -> bool:
        """Every engine's rounds and every per-round ratio agree within the protocol's bound."""
        return max([*self.spreads.values(), *self.ratio_spreads.values()]) <= self.protocol.bound

    def disagreement(self) -> str:
        """What exceeds the bound, e.g. "torch rounds 35%, torch/tensorgen ratio 41%" ("" when reliable)."""
        bound = self.protocol.bound
        parts = [f"{n} rounds {s:.0%}" for n, s in self.spreads.items() if s > bound]
        parts += [f"{n}/{self.reference} ratio {s:.0%}" for n, s in self.ratio_spreads.items() if s > bound]
        return ", ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "ratios": self.ratios, "reference": self.reference,
                "reliable": self.reliable, "rounds": self.rounds, "calls": self.calls,
                "spreads": self.spreads, "ratio_spreads": self.ratio_spreads, "bound": self.protocol.bound,
                "rounds_s": self.rounds_s, "round_ratios": self.round_ratios}


def calls_per_sample(engines: dict[str, Callable[[], Any]], min_sample_s: float,
                     clock: Callable[[], float] = time.perf_counter) -> int:
    """Calls that make the fastest engine's sample last `min_sample_s` (each engine run 3 times first)."""
    fastest = math.inf
    for fn in engines.values():
        for _ in range(3):
            start = clock()
            fn()
            fastest = min(fastest, clock() - start)
    return max(1, math.ceil(min_sample_s / max(fastest, 1e-9)))


def time_block(fn: Callable[[], Any], calls: int, protocol: Protocol) -> float:
    """Seconds per call of one block: pause, warm up, median of the samples."""
    clock = protocol.clock
    time.sleep(protocol.pause_s)
    start = clock()
    fn()  # at least one warm-up call
    while clock() - start < protocol.warm_s:
        fn()
    samples: list[float] = []
    start = clock()
    while len(samples) < protocol.samples:
        t0 = clock()
        for _ in range(calls):
            fn()
        samples.append((clock() - t0) / calls)
        if len(samples) >= 3 and clock() - start > protocol.max_block_s:
            break
    return float(np.median(samples))


def compare(engines: dict[str, Callable[[], Any]], protocol: Protocol = Protocol(),
            reference: str | None = None) -> Comparison:
    """Time `engines` (name -> a call of one run) under `protocol`; ratios against `reference` (default
    the first engine). Rounds are added until they agree or `protocol.max_rounds` are measured."""
    if not engines:
        raise ValueError("compare: no engines")
    names = list(engines)
    reference = reference or names[0]
    if reference not in engines:
        raise ValueError(f"compare: reference {reference!r} is not among the engines {names}")
    calls = protocol.calls or calls_per_sample(engines, protocol.min_sample_s, protocol.clock)
    result = Comparison({name: [] for name in names}, reference, calls, protocol)
    while result.rounds < protocol.rounds or (not result.reliable and result.rounds < protocol.max_rounds):
        first = result.rounds % len(names)
        for name in names[first:] + names[:first]:
            result.rounds_s[name].append(time_block(engines[name], calls, protocol))
    return result


@contextmanager
def competing_load(enabled: bool = True) -> Iterator[int | None]:
    """One CPU-bound process running for the duration of the block (its pid; None when not enabled)."""
    if not enabled:
        yield None
        return
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def describe_load(pid: int | None) -> dict[str, Any]:
    """What the JSON records about the competing load and the machine's load average."""
    return {"competing_process": pid is not None, "loadavg_1m": os.getloadavg()[0], "cpus": os.cpu_count()}


CALIBRATION_LOOP = 200_000  # iterations of calibrate()'s pure-Python loop
CALIBRATION_QUIET_S = 0.02  # the loop's time on a quiet 2-core x86 machine of 2026 (the CI runner's kind)


def calibrate(samples: int = 5) -> float:
    """How many times slower than quiet this machine runs a fixed single-threaded workload right now (>= 1): the
    median of `samples` timings of a pure-Python loop over CALIBRATION_QUIET_S.

    Tests multiply their wall-clock limits by it (the `slowdown` fixture of tests/conftest.py), so that a limit
    chosen on a quiet machine holds on a slower or busy one: on 2 cores beside other work the loop takes 2-3x.

    Args:
        samples: timings of the loop (~20 ms each when quiet); their median is taken, so that one lost time
            slice does not count.
    """
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        x = 0
        for i in range(CALIBRATION_LOOP):
            x += i * i % 7
        times.append(time.perf_counter() - start)
    return max(1.0, float(np.median(times)) / CALIBRATION_QUIET_S)
