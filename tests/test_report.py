"""The tuning report: the history the database keeps (runs, rounds; old databases migrated), the curves drawn from
it, the ETA of tuning's progress, and `tensorgen report` rendered in a real headless browser (Chromium): the page's
figures are present and drawn, checked from the DOM, and a screenshot is taken."""

from __future__ import annotations

import math
import re
import shutil
import sqlite3
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from tensorgen import te
from tensorgen.cli import main as cli
from tensorgen.cli.report import report_hint
from tensorgen.dag import ComputeDAG
from tensorgen.measure.types import ErrorKind, MeasureResult
from tensorgen.records import Record, SQLiteDatabase
from tensorgen.records.history import Measurement, Run, command_line
from tensorgen.records.record import best_cost_curve
from tensorgen.report import ReportError, write_report
from tensorgen.report.data import ModelSpec, gather, model_curve, tuning_clock
from tensorgen.schedule import State
from tensorgen.target import HardwareParams, Target
from tensorgen.task import SearchTask
from tensorgen.te.ops.suite import make_gmm
from tensorgen.tuning.progress import ProgressLine, eta
from tensorgen.tuning.tune import TuneProgress

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FIGURES = ("model-latency", "task-trials", "task-time", "trials-per-task", "profile")


def gmm_task(n: int) -> SearchTask:
    inputs, outputs = make_gmm(n, n, n)
    return SearchTask(ComputeDAG(inputs + outputs), Target.parse("cpu"), HardwareParams(cores=2), f"GMM({n})")


def tiled(task: SearchTask, factor: int) -> State:
    """A program of `task` (its output stage is C with axes i, j) of its own per factor."""
    s = State(task.dag)
    s.split("C", "i", [factor])
    return s


def measurement(i: int, key: str, cost: float, created: float, run: int | None = None,
                program: str = "") -> Measurement:
    kind = "none" if math.isfinite(cost) else "runtime_error"
    return Measurement(i, key, "cpu", cost, kind, program or f"p{i}", created, run, None)


# ---------------------------------------------------------------------------------------------
# the history and the curves, without compiling


def test_tuning_clock_lays_runs_end_to_end_and_cuts_long_pauses():
    runs = [Run(1, 100.0, 130.0), Run(2, 10_000.0, 10_020.0)]
    rows = [measurement(1, "a", 1.0, 110.0, 1), measurement(2, "a", 1.0, 130.0, 1),
            measurement(3, "a", 1.0, 10_005.0, 2), measurement(4, "a", 1.0, 10_020.0, 2),
            # an older tensorgen's records (no run): a pause of over GAP_S seconds separates two of its runs
            measurement(5, "a", 1.0, 50_000.0), measurement(6, "a", 1.0, 50_010.0), measurement(7, "a", 1.0, 90_000.0)]
    clock = tuning_clock(rows, runs)
    assert [clock[i] for i in range(1, 8)] == [10.0, 30.0, 35.0, 50.0, 50.0, 60.0, 60.0]


def test_model_curve_is_partial_until_every_task_has_a_program():
    rows = {"a": [measurement(1, "a", 2e-3, 1.0), measurement(3, "a", 1e-3, 3.0)],
            "b": [measurement(2, "b", math.inf, 2.0), measurement(4, "b", 4e-3, 4.0), measurement(5, "b", 5e-3, 5.0)]}
    clock = {i: float(i) for i in range(1, 6)}
    curve = model_curve(ModelSpec("m", {"a": 2.0, "b": 1.0}), "test", rows, clock)
    assert curve.latency_ms == pytest.approx((4.0, 2.0, 6.0, 6.0))  # b failed, then 4 ms: 2 x 1 + 4
    assert curve.complete == (False, False, True, True) and curve.trials == (1, 3, 4, 5)
    assert curve.times == (1.0, 3.0, 4.0, 5.0) and curve.final_ms == pytest.approx(6.0) and curve.untuned == ()


def test_best_curve_follows_retimings():
    a, b = "p-a", "p-b"
    rows = [measurement(1, "t", 3.0, 1, program=a), measurement(2, "t", 2.0, 2, program=b),
            measurement(3, "t", 5.0, 3, program=b), measurement(4, "t", 6.0, 4, program=b)]  # b re-timed slower
    assert best_cost_curve(rows) == [3.0, 3.0]  # b's upper median is 5: a stays the best


def test_eta_and_the_progress_line():
    assert eta(0, 10, 5.0) == "" and eta(10, 10, 5.0) == ""
    assert eta(5, 10, 10.0) == "ETA 10s" and eta(1, 100, 60.0) == "ETA 1h39m" and eta(2, 10, 30.0) == "ETA 2m00s"

    class Log:
        text = ""

        def write(self, s):
            self.text += s

        def flush(self):
            pass

    line = ProgressLine(Log(), tty=False)
    task = gmm_task(8)
    line(TuneProgress(task, "resume", 0, 8, 0, math.inf, 0.0, 0, 3.0))  # resuming took 3 s: not in the rate
    line(TuneProgress(task, "batch", 4, 8, 4, 1e-3, 1.0, 0, 5.0))
    assert line.stream.text.splitlines()[1].endswith("ETA 2s")


def test_report_hint():
    assert report_hint("t.db") == "report: tensorgen report --db t.db -o report.html"
    assert report_hint("my db.db", "m.onnx", 2, "x=1x8") == ("report: tensorgen report --db 'my db.db' --model m.onnx "
                                                            "--batch 2 --shape x=1x8 -o report.html")


def matmul_task(n: int = 8) -> SearchTask:
    a, b = te.placeholder((n, n), name="A"), te.placeholder((n, n), name="B")
    k = te.reduce_axis(n, "k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    return SearchTask(ComputeDAG([a, b, c]), Target.parse("cpu"), HardwareParams(cores=2), "matmul")


def _old_database(path: Path) -> float:
    """A database as the tensorgen before runs wrote it (no runs table, no run or round column); its task's FLOPs."""
    task = matmul_task()
    with SQLiteDatabase(path) as db:
        for factor, cost in ((2, 3e-4), (4, 2e-4), (8, math.inf)):
            result = MeasureResult((cost,)) if math.isfinite(cost) else MeasureResult((), ErrorKind.RUNTIME_ERROR)
            db.commit_record(Record.from_measure(task, tiled(task, factor), result))
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TABLE runs")
        conn.execute("ALTER TABLE records DROP COLUMN run")
        conn.execute("ALTER TABLE records DROP COLUMN round")
    return task.dag.flop_count


def test_an_old_database_reads_as_it_is_and_is_migrated_when_written(tmp_path):
    path = tmp_path / "old.db"
    flops = _old_database(path)
    with SQLiteDatabase(path, readonly=True) as db:
        assert not db.history and db.runs() == []
        assert [m.run for m in db.measurements()] == [None] * 3
        data = gather(db)
        assert not data.has_history and any("predate tuning runs" in n for n in data.notes)
        (task,) = data.tasks
        assert task.trials == 3 and task.errors == {"runtime_error": 1} and task.rounds == 0
        assert task.flops == flops > 0 and task.best_gflops == pytest.approx(flops / 2e-4 / 1e9)
        pytest.importorskip("matplotlib")
        write_report(db, tmp_path / "old.html", "tensorgen report --db old.db")
        page = (tmp_path / "old.html").read_text()
        assert "predate tuning runs" in page and "This database keeps no runs" in page and 'id="fig-task-time"' in page
    with SQLiteDatabase(path) as db:  # opened for writing: the history columns are added, old rows NULL
        assert db.history and len(db.records(db.workloads()[0][0])) == 3
        run = db.begin_run({"kind": "operator", "name": "x"})
        db.begin_round(1)
        record = db.records(db.workloads()[0][0])[0]
        db.commit_record(record)
        db.end_run({"trials": 1, "stopped": "budget"})
        assert [(m.run, m.round) for m in db.measurements()] == [(None, None)] * 3 + [(run, 1)]
        (stored,) = db.runs()
        assert stored.info["name"] == "x" and stored.outcome["stopped"] == "budget" and stored.finished


# ---------------------------------------------------------------------------------------------
# tuning into a database, then the page in a browser


def tiny_onnx(path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((32, 48)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((48, 16)).astype(np.float32), "w2")
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 16])], [w1, w2])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """A model (2 tasks) and an operator, each tuned for 8 random trials by the command line."""
    pytest.importorskip("matplotlib")
    tmp = tmp_path_factory.mktemp("report")
    db, model = tmp / "tuning.db", tmp / "tiny.onnx"
    tiny_onnx(model)
    out = {}
    for name, argv in (("model", ["tune", str(model)]), ("op", ["tune", "gmm", "--shape", "16,16,16"])):
        out[name] = _run_cli([*argv, "--trials", "8", "--policy", "random", "--batch-size", "4", "--db", str(db)])
    return tmp, db, model, out


def _run_cli(argv: list[str]) -> str:
    import contextlib
    import io

    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = cli(argv)
    assert code == 0, stdout.getvalue() + stderr.getvalue()
    return stdout.getvalue() + stderr.getvalue()


def test_tune_says_how_to_make_the_report(tuned):
    tmp, db, model, out = tuned
    assert f"report: tensorgen report --db {db} --model {model} -o report.html" in out["model"]
    assert f"report: tensorgen report --db {db} -o report.html" in out["op"]
    assert "ETA" in out["model"] and "ETA" in out["op"]  # plain lines: the progress is not on a terminal


def test_runs_and_rounds_are_recorded(tuned):
    _, db, _, _ = tuned
    with SQLiteDatabase(db, readonly=True) as conn:
        runs = conn.runs()
        rows = conn.measurements()
    assert [r.info["kind"] for r in runs] == ["model", "operator"]
    assert all(r.finished and r.outcome["trials"] == 8 for r in runs)
    assert runs[0].info["command"] == command_line() and runs[0].info["trials"] == 8
    assert sorted(runs[0].info["models"]) == ["tiny"] and len(runs[0].info["tasks"]) == 2
    assert {m.run for m in rows} == {r.id for r in runs}
    assert {m.round for m in rows if m.run == runs[1].id} == {1, 2}  # 8 trials in batches of 4


class _Figures(HTMLParser):
    """The figures of a page: id -> its attributes, and how many <path>s each holds."""

    def __init__(self) -> None:
        super().__init__()
        self.found: dict[str, dict] = {}
        self._open: str | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "figure" and "plot" in (attrs.get("class") or ""):
            self._open = attrs["id"].removeprefix("fig-")
            self.found[self._open] = {**attrs, "path_tags": 0}
        elif tag == "path" and self._open:
            self.found[self._open]["path_tags"] += 1

    def handle_endtag(self, tag):
        if tag == "figure":
            self._open = None


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium (.ci/run installs Debian's)")
def test_the_report_renders_in_a_browser(tuned):
    tmp, db, model, _ = tuned
    page = tmp / "report.html"
    printed = _run_cli(["report", "--db", str(db), "--model", str(model), "--profile", "-o", str(page)])
    assert "wrote" in printed and "3 tasks" in printed
    text = page.read_text()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", text)  # self-contained: nothing is fetched
    assert f"tensorgen report --db {db} --model {model} --profile -o {page}" in text
    browser = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               f"--user-data-dir={tmp / 'chromium'}"]
    dom = subprocess.run([*browser, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    assert 'data-measured="yes"' in dom  # the page's script ran
    figures = _Figures()
    figures.feed(dom)
    assert set(FIGURES) <= set(figures.found), sorted(figures.found)
    for name in FIGURES:
        fig = figures.found[name]
        assert int(fig["data-width"]) > 200 and int(fig["data-height"]) > 100, (name, fig)
        assert int(fig["data-paths"]) >= 5 and fig["path_tags"] >= 5, (name, fig)  # drawn: lines, bars, ticks
    shot = tmp / "report.png"
    subprocess.run([*browser, f"--screenshot={shot}", "--window-size=1200,2000", page.as_uri()], capture_output=True,
                   timeout=120, check=True)
    from matplotlib.image import imread

    pixels = imread(shot)
    assert pixels.shape[:2] == (2000, 1200) and pixels[..., :3].std() > 0.05  # not a blank page


def test_report_errors_are_one_line(tmp_path, capsys):
    assert cli(["report", "--db", str(tmp_path / "none.db")]) == 2
    assert cli(["report", "--db", str(tmp_path / "none.db"), "--profile"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("tensorgen: error: ") for line in err)
    assert "does not exist" in err[0] and "--model" in err[1]


def test_without_matplotlib_the_report_says_how_to_install_it(monkeypatch):
    from tensorgen.report import figures

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    with pytest.raises(ReportError, match=r"pip install 'tensorgen\[report\]'"):
        figures.error_kinds({"run_timeout": 1})


def test_the_page_says_what_its_numbers_mean(tmp_path, monkeypatch):
    """Regression (issue 53): a CPU's hardware table listed GPU fields (sm_count 0, warp_size 32, ...), "% of
    peak" stayed blank after `tensorgen hw --measure` (the peak was read from the tuning run only), and the page
    did not say why it counted more measurements than trials, nor why a best curve steps down."""
    pytest.importorskip("matplotlib")
    monkeypatch.setenv("TENSORGEN_HOME", str(tmp_path / "home"))  # no cached hardware measurement yet
    task = matmul_task()
    hw = HardwareParams(cores=2, extra={"fingerprint": "Test CPU|2 cores|32B simd"})
    path = tmp_path / "t.db"
    with SQLiteDatabase(path) as db:
        db.begin_run({"kind": "operator", "name": "matmul", "target": "cpu", "hw": hw.to_dict()})
        db.begin_round(1)
        for factor, cost in ((2, 3e-4), (4, 2e-4), (4, 2.4e-4), (4, 2.2e-4)):  # the new best re-timed twice
            db.commit_record(Record.from_measure(task, tiled(task, factor), MeasureResult((cost,))))
        db.end_run({"trials": 2, "stopped": "budget"})
    page = tmp_path / "report.html"

    def text() -> str:
        with SQLiteDatabase(path, readonly=True) as db:
            write_report(db, page, "tensorgen report")
        return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page.read_text()))

    before = text()
    assert "4 measurements of 2 trials: 2 measured a program again. A program that becomes its task's best is " \
           "timed 2 more times" in before
    assert "A curve can step down: a new best is timed 2 more times" in before
    hardware = before[before.index("Target and hardware"):]
    assert "sm_count" not in hardware and "warp_size" not in hardware and "cores 2" in hardware
    assert "peak_gflops not measured (tensorgen hw --measure)" in hardware
    assert "% of peak: no peak FLOP/s is known for this machine (Test CPU|2 cores|32B simd)" in before
    home = tmp_path / "home"
    home.mkdir()
    (home / "hardware.json").write_text('{"version": 1, "machines": {"Test CPU|2 cores|32B simd": '
                                        '{"peak_gflops": 10.0, "bandwidth_gbs": 5.0, "measured_at": "then"}}}')
    after = text()  # what `tensorgen hw --measure` cached on a machine of the same fingerprint
    gflops = task.dag.flop_count / 2.2e-4 / 1e9  # the best's cost: the upper median of its three timings
    assert f" {gflops:.3g} {100 * gflops / 10.0:.1f} " in after
    assert "% of peak is of the peak `tensorgen hw --measure` measured on this kind of machine" in after
    assert "peak_gflops 10.0" in after[after.index("Target and hardware"):]
