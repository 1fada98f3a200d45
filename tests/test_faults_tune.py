"""`tensorgen tune` under faults, end to end with real processes and a real database: kill -9 then resume, two
tuners on one database, Ctrl-C and SIGTERM. No worker may outlive its tuner, no committed record may be lost,
no program measured twice."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tensorgen.timing import calibrate
from tensorgen.tuning.tune import RETIMES

pytestmark = pytest.mark.serial  # measures with real timeouts: run alone, not beside other tests

REPO = Path(__file__).resolve().parents[1]
TUNE = [sys.executable, "-m", "tensorgen.cli", "tune", "gmm", "--shape", "64,64,64", "--batch-size", "4",
        "--target", "cpu -cores=2"]


def _start(db: Path, *args: str, stderr=subprocess.PIPE) -> subprocess.Popen:
    """A tuner in its own process group (as a shell runs a command: Ctrl-C goes to the whole group), with Ctrl-C
    enabled: a test session started in the background (`pytest &`) ignores SIGINT, and its children inherit that."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([*TUNE, "--db", str(db), *args], stdout=subprocess.PIPE, stderr=stderr, text=True,
                            env=env, cwd=db.parent, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _records(db: Path) -> list[tuple[str, str]]:
    if not db.exists():
        return []
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
            return conn.execute("SELECT workload_key, steps_hash FROM records ORDER BY id").fetchall()
    except sqlite3.OperationalError:  # the tuner has not created the table yet
        return []


def _children() -> dict[int, int]:
    """pid -> parent pid of every process."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            if fields[0] != "Z":
                out[int(entry)] = int(fields[1])
    return out


def _descendants(pid: int) -> set[int]:
    parents = _children()
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        kids = {c for c, pp in parents.items() if pp == p}
        todo += list(kids - found)
        found |= kids
    return found


def _alive(pids: set[int]) -> set[int]:
    return pids & set(_children())


def _wait_until(predicate, timeout: float, proc: subprocess.Popen | None = None) -> None:
    """Wait until `predicate()` holds, `timeout` seconds on a quiet machine (scaled by how busy it is now)."""
    deadline = time.monotonic() + timeout * calibrate()
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the tuner ended early (exit {proc.returncode}): {proc.communicate()}")
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.1)


@pytest.fixture
def reap():
    """Kill, after the test, whatever a failed check left running of the processes the test registered."""
    pids: set[int] = set()
    yield pids
    for pid in _alive(pids):
        os.kill(pid, signal.SIGKILL)


def _running_tuner(db: Path, records: int = 4, **kw) -> tuple[subprocess.Popen, set[int]]:
    """A tuner measuring (`records` committed) with its search and measurement workers up; its descendants."""
    proc = _start(db, "--trials", "400", **kw)
    _wait_until(lambda: len(_records(db)) >= records and len(_descendants(proc.pid)) >= 3, 60, proc)
    return proc, _descendants(proc.pid)


def test_kill_9_leaves_no_worker_and_the_resume_loses_and_repeats_nothing(tmp_path, reap, slowdown):
    db = tmp_path / "t.db"
    proc, workers = _running_tuner(db)
    reap |= workers
    proc.kill()
    proc.wait()
    _wait_until(lambda: not _alive(workers), 5)  # prctl(PR_SET_PDEATHSIG) / end of the parent's pipe
    before = _records(db)
    resumed = _start(db, "--trials", "4", "--json", "resumed.json")
    out, err = resumed.communicate(timeout=120 * slowdown)
    assert resumed.returncode == 0, err
    after = _records(db)
    retimed = json.loads((tmp_path / "resumed.json").read_text())["retimed"]  # a new best is measured again
    assert after[:len(before)] == before and len(after) == len(before) + 4 + retimed
    assert len(set(after)) == len(set(before)) + 4  # no program measured twice, but for re-timing a best
    assert all(after.count(r) <= 1 + RETIMES for r in after)
    resumed_programs = len(set(before))  # the killed tuner may have re-timed its best: a repeated record
    assert f"+{resumed_programs} resumed from the database" in err


def test_two_tuners_on_one_database_both_finish_with_all_their_records(tmp_path, slowdown):
    db = tmp_path / "t.db"
    procs = [_start(db, "--trials", "8", "--seed", str(seed), "--policy", "random", "--json", f"r{seed}.json")
             for seed in (1, 2)]
    for p in procs:
        out, err = p.communicate(timeout=120 * slowdown)
        assert p.returncode == 0 and "Traceback" not in err, err
    results = [json.loads((tmp_path / f"r{seed}.json").read_text()) for seed in (1, 2)]
    assert [r["trials"] for r in results] == [8, 8]
    assert len(_records(db)) == 16 + sum(r["retimed"] for r in results)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupt_prints_one_line_keeps_the_records_and_stops_every_worker(tmp_path, sig, reap, slowdown):
    db, log = tmp_path / "t.db", tmp_path / "stderr.txt"
    with open(log, "w") as err:
        proc, workers = _running_tuner(db, stderr=err)
        reap |= workers | {proc.pid}
        seen = log.read_text().count("\n")
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)  # Ctrl-C: the whole foreground group
        else:
            os.kill(proc.pid, sig)
        out, _ = proc.communicate(timeout=30 * slowdown)
    text = log.read_text()
    new = [line for line in text.splitlines()[seen:] if not line.startswith(("[tune", "measure error", "1 consec"))]
    assert "Traceback" not in text
    assert len(new) == 1 and new[0].startswith("tensorgen: interrupted after "), new
    assert proc.returncode == 130 and "(interrupted)" in out
    assert len(_records(db)) >= 4
    # the line counts what the database holds (before: the trials of whole rounds, without the interrupted batch's
    # measurements and re-timings: 52 said, 64 committed)
    assert f"; this run's {len(_records(db))} measurement(s) are in {db}" in new[0], new[0]
    _wait_until(lambda: not _alive(workers), 5)
