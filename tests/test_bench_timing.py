"""tensorgen/timing.py, the timing protocol of every benchmark comparison, on engines whose time is known:
each spins until its thread has computed for its duration, and the protocol counts the thread's CPU
time, so the other processes of a shared machine do not change what is measured; a "disturbance" is a
block that spins longer."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from tensorgen import timing  # noqa: E402

pytestmark = pytest.mark.serial  # measures with real timeouts: run alone, not beside other tests

# 1 warm-up call (warm_s=0) + 3 samples of 1 call: an engine's k-th block is its calls 4k..4k+3
FAST = timing.Protocol(rounds=3, max_rounds=7, bound=0.1, samples=3, calls=1, pause_s=0.0, warm_s=0.0,
                      clock=time.thread_time)
CALLS_PER_BLOCK = 4


class Spin:
    """Takes `seconds` per call, `slow` times as long in the blocks `disturbed(block)` selects."""

    def __init__(self, seconds: float, disturbed=lambda block: False, slow: float = 5.0):
        self.seconds, self.disturbed, self.slow, self.calls = seconds, disturbed, slow, 0

    def __call__(self) -> None:
        block = self.calls // CALLS_PER_BLOCK
        self.calls += 1
        end = time.thread_time() + self.seconds * (self.slow if self.disturbed(block) else 1.0)
        while time.thread_time() < end:
            pass


def test_steady_engines_agree_at_the_first_check():
    c = timing.compare({"a": Spin(1e-3), "b": Spin(2e-3)}, FAST)
    assert c.rounds == FAST.rounds and c.reliable and c.disagreement() == ""
    assert c.seconds["a"] == pytest.approx(1e-3, rel=0.3) and c.seconds["b"] == pytest.approx(2e-3, rel=0.3)
    # one statistic: the ratio is the ratio of the reported times, never a separate median
    assert c.ratios["b"] == pytest.approx(c.seconds["b"] / c.seconds["a"])
    assert c.ratios["b"] == pytest.approx(2.0, rel=0.3)
    data = c.to_json()
    assert data["reliable"] is True and len(data["rounds_s"]["b"]) == data["rounds"] == 3


def test_a_disturbed_round_is_measured_again_and_outvoted():
    """Engine b is 5x slow in its second block only: the first check fails, more rounds are measured,
    and the median ignores the disturbed round."""
    b = Spin(2e-3, disturbed=lambda block: block == 1)
    c = timing.compare({"a": Spin(1e-3), "b": b}, FAST)
    assert c.rounds > FAST.rounds and c.reliable
    assert c.rounds_s["b"][1] > 3 * c.seconds["b"]  # the disturbed round is kept in the record
    assert c.ratios["b"] == pytest.approx(2.0, rel=0.3)


def test_an_engine_disturbed_in_every_other_round_is_unreliable():
    b = Spin(2e-3, disturbed=lambda block: block % 2 == 1)
    c = timing.compare({"a": Spin(1e-3), "b": b}, FAST)
    assert c.rounds == FAST.max_rounds and not c.reliable
    assert c.spreads["b"] > FAST.bound and c.ratio_spreads["b"] > FAST.bound
    assert "b rounds" in c.disagreement() and "b/a ratio" in c.disagreement()
    data = c.to_json()
    assert data["reliable"] is False and data["spreads"]["b"] > data["bound"]


def test_the_reference_can_be_any_engine():
    c = timing.compare({"a": Spin(1e-3), "b": Spin(2e-3)}, FAST, reference="b")
    assert c.ratios["a"] == pytest.approx(0.5, rel=0.3) and set(c.ratios) == {"a"}
    with pytest.raises(ValueError, match="reference"):
        timing.compare({"a": Spin(1e-3)}, FAST, reference="x")


def test_every_engine_gets_the_same_calls_per_sample():
    """Calls are sized for the fastest engine, so a 0.1 ms engine's 1 ms sample holds ~10 calls, and the
    10x slower engine makes as many."""
    fast, slow = Spin(1e-4), Spin(1e-3)
    calls = timing.calls_per_sample({"fast": fast, "slow": slow}, min_sample_s=1e-3, clock=time.thread_time)
    assert 5 <= calls <= 10
    protocol = timing.Protocol(rounds=2, max_rounds=2, samples=2, pause_s=0.0, warm_s=0.0, min_sample_s=1e-3,
                               clock=time.thread_time)
    before = fast.calls, slow.calls
    c = timing.compare({"fast": fast, "slow": slow}, protocol)
    assert fast.calls - before[0] == slow.calls - before[1]  # calibration, warm-ups and samples alike
    assert c.calls >= 5


def test_spread():
    assert timing.spread([1.0, 1.0, 1.0]) == 0.0
    assert timing.spread([1.0, 1.0, 10.0]) > 1.0  # one outlier of three is not outvoted
    assert timing.spread([1.0, 1.0, 10.0, 1.0, 1.0]) == 0.0  # one of five is


@pytest.mark.parametrize("kwargs", [{"rounds": 1}, {"rounds": 4, "max_rounds": 3}, {"bound": 0.0},
                                    {"samples": 0}, {"calls": 0}])
def test_bad_protocols_are_refused(kwargs):
    with pytest.raises(ValueError):
        timing.Protocol(**kwargs)


def test_competing_load_runs_one_busy_process_for_the_block():
    with timing.competing_load() as pid:
        assert pid is not None
        time.sleep(0.3)
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        assert int(fields[11]) > 0  # utime: it has been computing
        assert timing.describe_load(pid)["competing_process"] is True
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # ended and reaped
    with timing.competing_load(False) as none:
        assert none is None
