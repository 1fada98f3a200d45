"""Faults around measuring and its records, injected through the real CLI with real sockets, files and compilers:
a --ray address where no Ray head answers, a damaged database file, a compiler that breaks mid-run, Ctrl-C."""

from __future__ import annotations

import json
import random
import shlex
import socket
import sqlite3
import sys
import threading
from collections.abc import Iterator
from contextlib import closing
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from test_faults_env import assert_one_line_error, cli
from test_faults_records import A, tiled
from test_faults_records import cli as cli_main

from tensorgen.errors import ClusterError
from tensorgen.measure.ray import check_head
from tensorgen.measure.ray_probe import probe
from tensorgen.measure.types import ErrorKind, MeasureResult
from tensorgen.records import DatabaseDamagedError, Record, RecordsError, SQLiteDatabase
from tensorgen.tuning.tune import tune

TUNE = ["tune", "gmm", "--shape", "32,32,32", "--policy", "random"]


# ---- fault 4: --ray ADDRESS where no Ray head answers ----------------------------------------------------------


@pytest.fixture
def web_server() -> Iterator[str]:
    """HOST:PORT of a real HTTP server (it takes the TCP connection, then answers HTTP/1)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def silent_server() -> Iterator[str]:
    """HOST:PORT of a socket that takes connections (the kernel's backlog) and never says a word."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield f"127.0.0.1:{sock.getsockname()[1]}"


def test_an_address_where_no_ray_head_answers_is_refused_in_bounded_time(web_server, silent_server):
    assert not probe(web_server).head and "not gRPC" in probe(web_server).why
    with pytest.raises(ClusterError, match=r"is not a Ray head \(no answer in 1 s\): start one with `ray start"):
        check_head(silent_server, timeout=1.0)
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]  # bound, not listening: refused
        assert probe(f"127.0.0.1:{port}").why == "Connection refused"


@pytest.mark.parametrize("command", [[*TUNE, "--trials", "8"], ["worker"]], ids=["tune", "worker"])
def test_cli_ray_at_a_web_server_is_one_line(command, web_server, tmp_path):
    # before: `tune` kept running past 300 s (ray.init retries a port that takes TCP connections for ever)
    proc = cli([*command, "--ray", web_server], {}, tmp_path, timeout=120)
    assert_one_line_error(proc, f"{web_server} is not a Ray head (it answers ")
    assert "ray start --head" in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


# ---- fault 5: bytes written over the middle of a database file -------------------------------------------------

ROWS = 160
PAGE = 4096  # SQLite's default page size


def marker(i: int) -> bytes:
    return f"marker-{i:04d}".encode()


@pytest.fixture
def damaged_db(tmp_path) -> tuple[Path, set[int]]:
    """A real database of ROWS records (each failure message a marker), and one page in its middle that holds
    records overwritten with random bytes: (its path, the numbers of the records that were on that page)."""
    path = tmp_path / "tuning.db"
    with SQLiteDatabase(path) as db:
        for i in range(ROWS):
            db.commit_record(Record.from_measure(A, tiled(A, 2), MeasureResult((), ErrorKind.RUNTIME_ERROR,
                                                                              marker(i).decode())))
    with closing(sqlite3.connect(path)) as conn:  # closed: its write-ahead log goes into the file
        conn.execute("VACUUM")  # each row in one place: no stale copy of a page split while it was written
    data = bytearray(path.read_bytes())
    page = data.index(marker(ROWS // 2)) // PAGE
    lost = {i for i in range(ROWS) if data.index(marker(i)) // PAGE == page}
    data[page * PAGE:(page + 1) * PAGE] = random.Random(5).randbytes(PAGE)
    path.write_bytes(data)
    return path, lost


@pytest.mark.parametrize("command", [["db", "stats"], ["report", "-o", "report.html"]], ids=["stats", "report"])
def test_a_damaged_database_is_one_line_naming_the_file_and_the_way_out(command, damaged_db, capsys,
                                                                        monkeypatch):
    # before: a sqlite3.DatabaseError traceback (database disk image is malformed)
    path, _ = damaged_db
    monkeypatch.chdir(path.parent)
    assert cli_main([*command, "--db", str(path)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"tensorgen: error: tuning database {str(path)!r} is damaged (database disk image is "
                           f"malformed; PRAGMA integrity_check: ") and "Traceback" not in line
    assert f"`tensorgen db export SAVED.jsonl --db {path}` saves the records that can still be read" in line


def test_tuning_into_a_damaged_database_raises_one_error(damaged_db):
    with pytest.raises(DatabaseDamagedError, match="is damaged .*PRAGMA integrity_check"):
        tune(A, trials=2, db=damaged_db[0], policy="random", batch_size=2)


def test_export_saves_every_record_sqlite_can_still_read(damaged_db, tmp_path, capsys):
    path, lost = damaged_db
    assert 0 < len(lost) < ROWS // 2
    out = tmp_path / "saved.jsonl"
    assert cli_main(["db", "export", str(out), "--db", str(path)]) == 0
    printed = capsys.readouterr().out
    saved = {json.loads(line)["result"]["error_msg"] for line in out.read_text().splitlines()}
    assert saved == {marker(i).decode() for i in range(ROWS) if i not in lost}
    assert f"{len(lost)} unreadable record(s) skipped (damaged page: {len(lost)})" in printed
    assert f"exported {ROWS - len(lost)} record(s)" in printed
    assert cli_main(["db", "import", str(out), "--db", str(tmp_path / "new.db")]) == 0


def test_a_database_whose_table_of_tables_is_damaged_says_nothing_can_be_read(damaged_db, tmp_path, capsys):
    path, _ = damaged_db
    with open(path, "r+b") as f:
        f.seek(100)  # past the file's header: the rest of page 1, where SQLite lists the tables
        f.write(random.Random(7).randbytes(PAGE - 100))
    for command in (["db", "stats"], ["db", "export", str(tmp_path / "saved.jsonl")]):
        assert cli_main([*command, "--db", str(path)]) == 2
        (line,) = capsys.readouterr().err.splitlines()
        assert "is damaged" in line and "no record can be read from it" in line, line


def test_a_directory_given_as_the_database_says_so(tmp_path, capsys):
    # before: "tuning database 'DIR' does not exist (pass --db FILE)"
    assert cli_main(["db", "stats", "--db", str(tmp_path)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (f"tensorgen: error: tuning database {str(tmp_path)!r} is a directory; give a database file, "
                    f"e.g. {str(tmp_path / 'tuning.db')!r}")
    with pytest.raises(RecordsError, match="is a directory"):
        SQLiteDatabase(tmp_path)


# ---- fault 6: a compiler that breaks in the middle of a run ----------------------------------------------------

BREAKING_CC = """#!/bin/sh
# gcc, until the second candidate program (they call tensorgen_produce) it is given once the tuning database
# holds a batch of records: from then on it fails every call, as if its install were removed under it
here=$(dirname "$0")
exec 9>> "$here/lock"
flock 9  # builds run in parallel: one counts, and is told whether it works, at a time
count='import sqlite3, sys; print(sqlite3.connect(sys.argv[1]).execute("SELECT COUNT(*) FROM records").fetchone()[0])'
if [ ! -e "$here/broken" ]; then
  committed=$({python} -c "$count" "{db}" 2>/dev/null || echo 0)
  for arg; do case "$arg" in *.c) if [ "$committed" -ge {batch} ] && grep -q tensorgen_produce "$arg"; then
    echo >> "$here/candidates"; fi;; esac; done
  if [ -e "$here/candidates" ] && [ "$(wc -l < "$here/candidates")" -ge 2 ]; then touch "$here/broken"; fi
fi
if [ -e "$here/broken" ]; then echo "cc: fatal error: cannot execute 'cc1': No such file or directory" >&2; exit 1; fi
flock -u 9
exec gcc "$@"
"""


def test_programs_failed_by_a_compiler_that_broke_are_measured_again_on_resume(tmp_path):
    # before: the batch the compiler broke in stored its compile errors as the programs' own (compile_error, never
    # measured again); the run stopped one batch later; a resume re-measured none of them
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    cc = bin_dir / "cc.sh"
    cc.write_text(BREAKING_CC.format(python=shlex.quote(sys.executable), db=tmp_path / "tuning.db", batch=4))
    cc.chmod(0o755)
    # rounds of 4 new programs each (no busy machine's re-measurements between them): the break lands inside one
    env = {"CC": str(cc), "TENSORGEN_CACHE_DIR": str(tmp_path / "cache"), "TENSORGEN_BUSY_BOUND": "0"}
    tune_args = [*TUNE, "--batch-size", "4", "--db", "tuning.db"]
    proc = cli([*tune_args, "--trials", "16"], env, tmp_path)  # batches left after the second: the run stops
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert any(line.startswith("the C toolchain broke during this batch (") for line in lines), proc.stderr
    assert lines[-1].startswith("tensorgen: error: the C compiler (") and "cannot build a trivial kernel" in lines[-1]
    assert "cannot execute 'cc1'" in lines[-1]
    with closing(sqlite3.connect(tmp_path / "tuning.db")) as conn:
        kinds = dict(conn.execute("SELECT error_kind, COUNT(*) FROM records GROUP BY error_kind").fetchall())
        failed = {h for (h,) in conn.execute("SELECT steps_hash FROM records WHERE error_kind = 'unknown'")}
    assert "compile_error" not in kinds and kinds.get("unknown", 0) >= 1, kinds

    proc = cli([*tune_args, "--trials", "4"], {**env, "CC": "gcc"}, tmp_path)  # the compiler is fixed
    assert proc.returncode == 0, proc.stderr
    with closing(sqlite3.connect(tmp_path / "tuning.db")) as conn:
        again = {h for (h,) in conn.execute("SELECT steps_hash FROM records WHERE run = 2")}
    assert failed <= again, (failed, again)
