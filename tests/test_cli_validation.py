"""Every number and target option of every `tensorgen` command is checked where it is read: through the real
entry point, a bad value is exit code 2 and one line `tensorgen: error: ...`, never a traceback or a silent
acceptance."""

from __future__ import annotations

import os

import pytest

from tensorgen.cli import main
from tensorgen.cli.args import local_target, target_name, write_json
from tensorgen.errors import TensorgenError
from tensorgen.target import Target, TargetError

USABLE = len(os.sched_getaffinity(0))
OP = ["gmm", "--shape", "8,8,8"]


def cli(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code)


BAD = {  # argv -> what the one line must say
    "bench --threads -1": (["bench", "mlp", "--threads", "-1"], "--threads: must be a positive integer, got -1"),
    "bench --threads 0": (["bench", "mlp", "--threads", "0"], "--threads: must be a positive integer, got 0"),
    "bench --threads x": (["bench", "mlp", "--threads", "two"], "--threads: must be a positive integer, got 'two'"),
    "bench --threads > CPUs": (["bench", "mlp", "--threads", str(USABLE + 1)],
                               f"{USABLE + 1} threads, but this process may run on {USABLE} CPU(s)"),
    "bench --blocks 0": (["bench", "mlp", "--blocks", "0"], "--blocks: must be a positive integer"),
    "bench --batch 0": (["bench", "mlp", "--batch", "0"], "--batch: must be a positive integer"),
    "build --candidates 0": (["build", "mlp", "-o", "x", "--candidates", "0"], "--candidates: must be a positive"),
    "build --batch -2": (["build", "mlp", "-o", "x", "--batch", "-2"], "--batch: must be a positive integer"),
    "tune --trials -5": (["tune", *OP, "--trials", "-5"], "--trials: must be a non-negative integer, got -5"),
    "tune --batch-size 0": (["tune", *OP, "--batch-size", "0"], "--batch-size: must be a positive integer"),
    "tune --batch 0": (["tune", *OP, "--batch", "0"], "--batch: must be a positive integer"),
    "tune --seed -1": (["tune", *OP, "--seed", "-1"], "--seed: must be a non-negative integer"),
    "tune --early-stopping 0": (["tune", "mlp", "--early-stopping", "0"], "--early-stopping: must be a positive"),
    "tune --warmup-trials 0": (["tune", "mlp", "--warmup-trials", "0"], "--warmup-trials: must be a positive"),
    "show --batch 0": (["show", *OP, "--batch", "0"], "--batch: must be a positive integer"),
    "bogus -mcpu": (["tune", *OP, "--target", "cpu -mcpu=bogus"], "bad value ‘bogus’ for ‘-march=’"),
    "too many cores": (["tune", *OP, "--target", f"cpu -cores={USABLE + 1}"],
                       f"-cores={USABLE + 1}, but this process may run on {USABLE} CPU(s)"),
    "zero cores": (["tune", *OP, "--target", "cpu -cores=0"], "-cores must be a positive integer"),
    "unknown option": (["tune", *OP, "--target", "cpu -mcpus=x86-64"], "unknown option -mcpus"),
    "not -key=value": (["tune", *OP, "--target", "cpu cores=2"], "must look like -key=value"),
    "empty value": (["tune", *OP, "--target", "cpu -mcpu="], "must look like -key=value"),
    "twice": (["tune", *OP, "--target", "cpu -cores=1 -cores=2"], "option -cores is given twice"),
    "unknown kind": (["tune", *OP, "--target", "gpu"], "must start with one of cpu, cuda"),
    "empty target": (["tune", *OP, "--target", ""], "must start with one of cpu, cuda"),
    "open quote": (["show", *OP, "--target", "cpu -mcpu='x86-64"], "No closing quotation"),
    "cuda here": (["tune", *OP, "--target", "cuda -arch=sm_90"], "no CUDA GPU is usable on this"),
    "cuda emulate=2": (["tune", *OP, "--target", "cuda -emulate=2"], "-emulate takes 0 or 1"),
    "unknown gpu": (["tune", *OP, "--target", "cuda -device=k80"], "unknown -device 'k80'"),
    "db best --target": (["db", "best", "abc", "--target", "cpu -cores=two"], "-cores must be a positive integer"),
    "hw --set cores=0": (["hw", "--set", "cores=0"], "hardware parameter cores: bad value '0'"),
    "hw --set bogus": (["hw", "--set", "bogus"], "expected KEY=VALUE"),
    "unknown argument": (["tune", *OP, "--trails", "5"], "unrecognized arguments: --trails 5"),
    "no command": ([], "the following arguments are required"),
}
MISSING = "no_such_folder/out"  # an output file whose folder does not exist: refused before any work, not after
for name, argv in {"tune --json": ["tune", *OP, "--json"], "tune model --json": ["tune", "mlp", "--json"],
                   "bench --json": ["bench", "mlp", "--json"], "run -o": ["run", "mlp", "--inputs", "x.npz", "-o"],
                   "costmodel train -o": ["costmodel", "train", "--db", "x.db", "-o"],
                   "costmodel train --json": ["costmodel", "train", "--db", "x.db", "-o", "m.pt", "--json"],
                   "costmodel eval --json": ["costmodel", "eval", "auto", "--db", "x.db", "--json"],
                   "db stats --json": ["db", "stats", "--json"], "db best --json": ["db", "best", "k", "--json"],
                   "db export": ["db", "export"], "report -o": ["report", "-o"], "hw --json": ["hw", "--json"]}.items():
    BAD[f"{name} in a missing folder"] = ([*argv, MISSING], "the folder 'no_such_folder' does not exist")
BAD["tune --json a folder"] = (["tune", *OP, "--json", "."], "'.' is a folder; give a file name")


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_value_is_one_line_and_exit_2(case, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing a command might create lands in the repository
    argv, message = BAD[case]
    assert cli(argv) == 2
    captured = capsys.readouterr()
    (line,) = captured.err.splitlines()
    assert line.startswith("tensorgen: error:") and message in line, line
    assert "Traceback" not in captured.err + captured.out
    assert not os.listdir(tmp_path)  # refused before anything was created or measured


def test_good_targets_pass_and_are_canonical():
    assert target_name("cpu -mcpu=x86-64 -cores=64") == "cpu -cores=64 -mcpu=x86-64"  # another machine's records
    assert local_target("cpu -cores=1 -mcpu=x86-64") == "cpu -cores=1 -mcpu=x86-64"
    assert local_target("cpu") == "cpu"
    assert str(Target.parse("cuda -arch=sm_90")) == "cuda -arch=sm_90"
    with pytest.raises(TargetError, match="unknown option -cores"):
        Target.parse("cuda -cores=2")


def test_a_failed_write_at_the_end_is_one_line(tmp_path):
    """The folder checked when the command started may be gone when it writes (or the disk full)."""
    write_json(str(tmp_path / "ok.json"), {"a": 1})
    assert (tmp_path / "ok.json").read_text() == '{\n  "a": 1\n}\n'
    with pytest.raises(TensorgenError, match="cannot write .*gone/x.json: No such file or directory"):
        write_json(str(tmp_path / "gone" / "x.json"), {})


def test_a_reader_that_goes_away_ends_a_listing_quietly():
    """`tensorgen models | head -1`: the listing stops with a shell's SIGPIPE status, not a BrokenPipeError
    traceback."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "import sys; from tensorgen.cli import main; sys.exit(main())",
                             "models"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # gone before the first line is written
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141 and "Traceback" not in err, err
