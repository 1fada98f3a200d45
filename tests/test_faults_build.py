"""What `tensorgen build` writes and `tensorgen run` reads, damaged, mixed, interrupted and large (issue 53, faults 1-3
and 9): a build directory is checked against its manifest before it is loaded, a build killed at any point leaves
the old build, the new one or a directory refused in one line, and a model's build and run hold its weights about
once."""

from __future__ import annotations

import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tensorgen.cli.main import main
from tensorgen.errors import RuntimeCallError
from tensorgen.runtime.model import CompiledModel
from tensorgen.runtime.model_files import LIBRARY, MANIFEST, WEIGHTS

ROOT = Path(__file__).resolve().parents[1]
N = 256  # a layer's width: two 256x256 float32 weights, 512 KB


def mlp(path: Path, n: int, seed: int, layers: int = 2) -> Path:
    """An ONNX model of `layers` MatMuls of n x n float32 weights (from `seed`) at `path`, and its input at
    path.npz."""
    rng = np.random.default_rng(seed)
    x, nodes, weights = "x", [], []
    for i in range(layers):
        weights.append(numpy_helper.from_array((rng.standard_normal((n, n)) / np.sqrt(n)).astype(np.float32), f"w{i}"))
        nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"h{i}"]))
        x = f"h{i}"
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, n])], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    np.savez(path.with_suffix(".npz"), x=np.random.default_rng(0).standard_normal((1, n), dtype=np.float32))
    return path


def env(tmp: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}  # the session's kernel cache (conftest): compiled once


def cli(args: list[str], tmp: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tensorgen.cli", *args], env=env(tmp), cwd=tmp,
                          capture_output=True, text=True, timeout=timeout)


def one_line(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, proc.stderr)
    assert lines[0].startswith("tensorgen: error: ") and all(f in lines[0] for f in fragments), lines[0]


@pytest.fixture(scope="module")
def builds(tmp_path_factory) -> dict[str, Path]:
    """Two builds of one model with different weights ("a", "b": same file sizes) and their inputs ("input")."""
    tmp = tmp_path_factory.mktemp("builds")
    out = {}
    for name, seed in (("a", 1), ("b", 2)):
        model = mlp(tmp / f"{name}.onnx", N, seed)
        assert main(["build", str(model), "-o", str(tmp / name), "--db", str(empty_db(tmp))]) == 0
        out[name] = tmp / name
    out["input"] = tmp / "a.npz"
    return out


def empty_db(tmp: Path) -> Path:
    from tensorgen.records.database import SQLiteDatabase

    path = tmp / "empty.db"
    SQLiteDatabase(path).close()
    return path


def outputs(directory: Path, feed: Path) -> np.ndarray:
    return CompiledModel(directory).run(dict(np.load(feed)))[0]


def damage(directory: Path, how: str, other: Path) -> str:
    """Damage the build in `directory` as `how` says; the file the refusal must name."""
    weights, library = directory / WEIGHTS, directory / LIBRARY
    size = weights.stat().st_size
    if how == "weights short by 4 KB":
        os.truncate(weights, size - 4096)
    elif how == "weights cut in half":
        os.truncate(weights, size // 2)
    elif how == "weights empty":
        os.truncate(weights, 0)
    elif how == "weights byte flipped":
        with weights.open("r+b") as f:
            f.seek(size // 3)
            byte = f.read(1)
            f.seek(size // 3)
            f.write(bytes([byte[0] ^ 1]))
    elif how == "library cut":
        os.truncate(library, library.stat().st_size // 2)
    elif how == "weights of another build":
        shutil.copyfile(other / WEIGHTS, weights)
    return str(weights if how.startswith("weights") else library)


DAMAGES = ["weights short by 4 KB", "weights cut in half", "weights empty", "weights byte flipped", "library cut",
           "weights of another build"]


@pytest.mark.parametrize("how", DAMAGES)
def test_a_damaged_build_is_refused_naming_its_file(builds, how: str, tmp_path: Path) -> None:
    directory = Path(shutil.copytree(builds["a"], tmp_path / "model"))
    named = damage(directory, how, builds["b"])
    with pytest.raises(RuntimeCallError) as err:
        CompiledModel(directory)
    assert named in str(err.value) and "rebuild it with tensorgen build" in str(err.value)
    assert "\n" not in str(err.value)


def test_run_of_a_truncated_build_is_one_line(builds, tmp_path: Path) -> None:
    """Through the CLI, in its own process: an empty weights.bin was a segmentation fault."""
    directory = Path(shutil.copytree(builds["a"], tmp_path / "model"))
    os.truncate(directory / WEIGHTS, 0)
    proc = cli(["run", str(directory), "--inputs", str(builds["input"]), "-o", str(tmp_path / "out.npz")], tmp_path)
    one_line(proc, str(directory / WEIGHTS), "rebuild it with tensorgen build")


def test_a_build_before_digests_still_loads(builds, tmp_path: Path) -> None:
    """A manifest without `files` (format 3 and older) is loaded unchecked, as it was."""
    directory = Path(shutil.copytree(builds["a"], tmp_path / "model"))
    manifest = json.loads((directory / MANIFEST).read_text())
    del manifest["files"]
    (directory / MANIFEST).write_text(json.dumps(manifest))
    np.testing.assert_array_equal(outputs(directory, builds["input"]), outputs(builds["a"], builds["input"]))


def test_a_rebuild_replaces_every_file_and_leaves_no_partial_one(builds, tmp_path: Path) -> None:
    directory = Path(shutil.copytree(builds["a"], tmp_path / "model"))
    (directory / f".{WEIGHTS}.{dead_pid()}.partial").write_bytes(b"left by a killed build")
    db = str(empty_db(tmp_path))
    assert main(["build", str(builds["b"].parent / "b.onnx"), "-o", str(directory), "--db", db]) == 0
    assert sorted(p.name for p in directory.iterdir()) == ["model.c", MANIFEST, LIBRARY, WEIGHTS]
    np.testing.assert_array_equal(outputs(directory, builds["input"]), outputs(builds["b"], builds["input"]))


def dead_pid() -> int:
    """The pid of a process that has exited (and been waited for)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# a build directory run in a process of its own (a mix of two builds segfaulted): the output to argv[3], else the
# loader's one line and exit status 2
LOAD = """import sys, numpy as np
from tensorgen.errors import RuntimeCallError
from tensorgen.runtime.model import CompiledModel
try:
    np.save(sys.argv[3], CompiledModel(sys.argv[1]).run(dict(np.load(sys.argv[2])))[0])
except RuntimeCallError as err:
    sys.exit(print(err, file=sys.stderr) or 2)
"""


def test_a_build_killed_while_writing_leaves_the_old_or_the_new_build_or_a_refusal(tmp_path: Path) -> None:
    """SIGKILL of `tensorgen build` writing over an earlier build of the same model with other weights (8 MB), at
    random points of its writing (from when its first file appears under a temporary name): the directory then
    runs as the old build or the new one, or is refused in one line. It never runs a mix: a new model.so, a
    partial weights.bin and the old model.json segfaulted or ran into garbage."""
    n, db = 1024, str(empty_db(tmp_path))
    feed = str(mlp(tmp_path / "old.onnx", n, 1).with_suffix(".npz"))
    model = tmp_path / "model"
    build = ["build", str(mlp(tmp_path / "new.onnx", n, 3)), "-o", str(model), "--db", db]
    assert main(["build", str(tmp_path / "old.onnx"), "-o", str(tmp_path / "old"), "--db", db]) == 0
    assert main([*build[:3], str(tmp_path / "new"), *build[4:]]) == 0  # compiles what the killed builds load
    old, new = (outputs(tmp_path / name, Path(feed)) for name in ("old", "new"))
    rng = random.Random(53)
    seen = []
    for _ in range(3):
        shutil.rmtree(model, ignore_errors=True)
        shutil.copytree(tmp_path / "old", model)
        proc = subprocess.Popen([sys.executable, "-m", "tensorgen.cli", *build], env=env(tmp_path), cwd=tmp_path,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while proc.poll() is None and not any(p.name.endswith(".partial") for p in model.iterdir()):
            time.sleep(0.0005)
        time.sleep(rng.uniform(0, 0.05))  # writing 8 MB and hashing it takes tens of ms
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        run = subprocess.run([sys.executable, "-c", LOAD, str(model), feed, str(tmp_path / "o.npy")], env=env(tmp_path),
                             capture_output=True, text=True, timeout=300)
        if run.returncode == 0:
            got = np.load(tmp_path / "o.npy")
            assert np.array_equal(got, old) or np.array_equal(got, new)
            seen.append("old" if np.array_equal(got, old) else "new")
        else:
            assert run.returncode == 2 and run.stderr.count("\n") == 1 and str(model) in run.stderr, run.stderr
            seen.append("refused")
    assert len(seen) == 3, seen  # which ones depends on the machine's speed


def peak_rss(args: list[str], tmp: Path) -> int:
    """Peak resident bytes of `tensorgen ARGS` in a process of its own (measured by a parent that runs only it)."""
    probe = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL);"
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", probe, sys.executable, "-m", "tensorgen.cli", *args], env=env(tmp),
                         cwd=tmp, capture_output=True, text=True, timeout=600, check=True).stdout
    return int(out.split()[-1]) * 1024


def test_build_and_run_hold_the_weights_about_once(tmp_path: Path) -> None:
    """Peak RSS of `run` of a build, and of `run` of the .onnx (which builds it first, in the same process), for a
    model of 33.5 MB of weights less the same command's for the same model at 1/64 of the weights (the interpreter,
    tensorgen, the compiler): `run` of a build maps its weights once (2.0x before: a copy in init); `run` of the
    .onnx peaks while the ONNX file is imported, which holds the parsed ONNX model and its arrays at once (2x; 4.0x
    before, and `build` 3.0x, when packing held the weights three times and `run` loaded the built model before
    freeing the graph). One candidate per kernel: in-model selection loads its candidate builds at once."""
    db = empty_db(tmp_path)
    big, small = 2048, 256  # two n x n float32 weights: 33.5 MB, 0.5 MB
    weights = 2 * big * big * 4

    def peaks(n: int) -> dict[str, int]:
        model = mlp(tmp_path / f"m{n}.onnx", n, 0)
        feed, one = str(model.with_suffix(".npz")), ["--db", str(db), "--candidates", "1"]
        assert main(["build", str(model), "-o", str(tmp_path / f"b{n}"), *one]) == 0
        return {"run built": peak_rss(["run", str(tmp_path / f"b{n}"), "--inputs", feed, "-o", "o.npz"], tmp_path),
                "run onnx": peak_rss(["run", str(model), "--inputs", feed, "-o", "o.npz", *one], tmp_path)}

    base, got = peaks(small), peaks(big)
    ratio = {k: (got[k] - base[k]) / weights for k in got}
    assert ratio["run built"] <= 1.3 and ratio["run onnx"] <= 2.3, ratio


def test_an_onnx_file_is_checked_against_the_memory_budget_before_it_is_read(tmp_path: Path, capsys,
                                                                            monkeypatch) -> None:
    """Reading holds the file twice (its bytes, the model parsed from them), then the model and its arrays: the
    budget counts that, not the weights once (a model of 2.7 GB passed the check and died at 5.3 GB)."""
    model = mlp(tmp_path / "m.onnx", N, 0)
    monkeypatch.setenv("TENSORGEN_MEMORY_LIMIT", str(int(1.5 * model.stat().st_size)))
    assert main(["build", str(model), "-o", str(tmp_path / "out")]) == 2
    assert "takes 1.0 MB to import (twice its size); the limit is" in capsys.readouterr().err


@pytest.mark.parametrize("threads", [0, -1])
def test_a_model_refuses_a_thread_count_below_one(builds, threads: int) -> None:
    with pytest.raises(RuntimeCallError, match=f"number of threads must be an integer >= 1, got {threads}"):
        CompiledModel(builds["a"]).set_num_threads(threads)


@pytest.mark.parametrize("command", ["build", "run"])
def test_build_and_run_refuse_more_cores_than_the_process_may_use_as_tune_does(builds, command: str, tmp_path: Path,
                                                                              capsys) -> None:
    cores = len(os.sched_getaffinity(0)) + 1
    args = {"build": ["-o", str(tmp_path / "out")], "run": ["--inputs", str(builds["input"]), "-o", "o.npz"]}
    for cmd in (["tune", "bert_tiny", "--trials", "1"], [command, str(builds["a"].parent / "a.onnx"), *args[command]]):
        with pytest.raises(SystemExit) as exit_:
            main([*cmd, "--target", f"cpu -cores={cores}"])
        assert exit_.value.code == 2
        assert f"-cores={cores}, but this process may run on {cores - 1} CPU(s)" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_run_killed_leaves_a_build_directory_that_the_next_run_removes(builds, tmp_path: Path) -> None:
    """`tensorgen run MODEL.onnx` builds into the temp dir; SIGKILL runs no clean-up, so each kill left a
    tensorgen-run-* directory there for good."""
    temp = tmp_path / "temp"
    temp.mkdir()
    environ = {**env(tmp_path), "TMPDIR": str(temp)}
    run = [sys.executable, "-m", "tensorgen.cli", "run", str(builds["a"].parent / "a.onnx"), "--inputs",
           str(builds["input"]), "-o", str(tmp_path / "o.npz"), "--db", str(empty_db(tmp_path))]
    proc = subprocess.Popen(run, env=environ, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while proc.poll() is None and not list(temp.glob("tensorgen-run-*")):
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    left = list(temp.glob("tensorgen-run-*"))
    assert left
    subprocess.run(run, env=environ, cwd=tmp_path, check=True, capture_output=True, timeout=300)
    assert not list(temp.glob("tensorgen-run-*"))


def _small_files() -> None:
    """A process that may write no file past 100 KB: a full disk, as a build sees it."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing the process


def test_a_build_that_cannot_write_is_one_line_and_leaves_the_old_build(builds, tmp_path: Path) -> None:
    directory = Path(shutil.copytree(builds["a"], tmp_path / "model"))
    proc = subprocess.run([sys.executable, "-m", "tensorgen.cli", "build", str(builds["b"].parent / "b.onnx"), "-o",
                           str(directory), "--db", str(empty_db(tmp_path)), "--candidates", "1"], env=env(tmp_path),
                          cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, preexec_fn=_small_files)
    one_line(proc, f"cannot write the build into {directory}: File too large")
    assert sorted(p.name for p in directory.iterdir()) == ["model.c", MANIFEST, LIBRARY, WEIGHTS]
    np.testing.assert_array_equal(outputs(directory, builds["input"]), outputs(builds["a"], builds["input"]))


def test_a_build_into_a_file_is_one_line(builds, tmp_path: Path, capsys) -> None:
    (tmp_path / "file").write_text("mine")
    assert main(["build", str(builds["a"].parent / "a.onnx"), "-o", str(tmp_path / "file")]) == 2
    assert f"cannot build into {tmp_path / 'file'}: it is a file, not a directory" in capsys.readouterr().err
    assert (tmp_path / "file").read_text() == "mine"
