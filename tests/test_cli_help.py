"""What a newcomer reads first: every command's `--help` (its examples parse, no option is taken by a prefix of its
name), `tensorgen info` (what a model takes, and an inputs file that `run` accepts), and the line `build` prints
about where its kernels' programs come from."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tensorgen.cli import main
from tensorgen.cli.args import ArgumentParser
from tensorgen.cli.main import build_parser
from tensorgen.graph import build_model, extract_tasks, load_graph
from tensorgen.graph.backend.model_target import model_target
from tensorgen.graph.backend.select import select_in_model
from tensorgen.graph.frontend.onnx_inputs import check_feed, load_npz
from tensorgen.measure.types import MeasureResult
from tensorgen.records import Record, SQLiteDatabase


def cli(argv: list[str]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `tensorgen ARGV` through the real entry point."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def commands(parser: ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], ArgumentParser]]:
    """Every command of the parser (`db stats`, ...) with its own parser, groups included."""
    for name, sub in parser.commands.items():
        yield (*path, name), sub
        yield from commands(sub, (*path, name))


def example_lines(epilog: str) -> Iterator[list[str]]:
    """The `tensorgen ...` commands of an epilog's examples, as argv lists (comments and `&&` split off)."""
    for line in epilog.split("examples:", 1)[1].splitlines():
        for command in line.split("  #")[0].split(" && "):
            argv = shlex.split(command)
            if argv and argv[0] == "tensorgen":
                yield argv[1:]


def test_every_command_has_examples_that_parse(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("model.onnx", "model.pt", "records.jsonl", "in.npz", "inputs.npz"):
        (tmp_path / name).write_bytes(b"")
    parser = build_parser()
    found = list(commands(parser))
    assert len(found) >= 19 and parser.allow_abbrev is False
    parsed = 0
    for path, sub in found:
        assert sub.allow_abbrev is False, path
        assert sub.epilog and "examples:" in sub.epilog, f"`tensorgen {' '.join(path)} --help` has no examples"
        for argv in example_lines(sub.epilog):
            build_parser().parse_args(argv)  # exits 2 on a bad example
            parsed += 1
    assert parsed >= 30


@pytest.mark.parametrize("argv, meant", [
    (["bench", "bert_tiny", "--thread", "1"], "--threads"),
    (["tune", "gmm", "--shape", "8,8,8", "--trial", "4"], "--trials"),
    (["tune", "bert_tiny", "--batch-s", "4"], "--batch-size"),
    (["db", "stats", "--jso", "x.json"], "--json"),
])
def test_a_prefix_of_an_option_is_refused_with_the_option_meant(argv, meant):
    """Regression: `--thread 2` was taken as `--threads 2` (argparse's prefix matching), and an unknown option
    pointed at the top-level help instead of the command's."""
    code, out, err = cli(argv)
    command = " ".join(a for a in argv[:2] if a in ("bench", "tune", "db", "stats"))
    assert code == 2 and out == ""
    assert err == (f"tensorgen: error: unrecognized arguments: {' '.join(argv[-2:])}; did you mean {meant}? "
                   f"(see `tensorgen {command} --help`)\n")


def test_tune_help_names_models_and_tells_the_batches_apart():
    code, out, _ = cli(["tune", "--help"])
    assert code == 0 and "MODEL|OP" in out and "tensorgen tune bert_tiny --trials 256" in out
    text = " ".join(out.split())
    assert "--batch N the batch size of the workload's input" in text and "Not --batch-size" in text
    assert "--batch-size N candidate programs measured per round" in text and "Not --batch," in text
    assert "Ansor's objective f4, early stopping" in text
    for ablation in ("ansor", "no-crossover", "no-fine-tuning", "limited-space", "uniform-tiles", "random"):
        assert f"{ablation} = " in text  # each variant said in words


def test_an_ablation_for_a_model_is_refused(tmp_path):
    """Regression: `tensorgen tune bert_tiny --ablation random` tuned with the default policy, the flag ignored."""
    code, out, err = cli(["tune", "bert_tiny", "--ablation", "random", "--trials", "1", "--db", str(tmp_path / "t.db")])
    assert code == 2 and out == "" and not (tmp_path / "t.db").exists()
    assert err == ("tensorgen: error: --ablation is a variant of one operator's search (Ansor's Figure 7), not for a "
                   "model such as 'bert_tiny'; a model's search is chosen with --policy\n")


# ---------------------------------------------------------------------------------------------
# tensorgen info


def test_info_of_a_zoo_model_gives_an_inputs_file_it_takes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = cli(["info", "bert_tiny"])
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("bert_tiny: ONNX opset 17, 1 input, 1 output, 4.34 M weights")
    assert "  input_ids  int64[1, 128]         ids in [0, 30522)" in lines
    assert "  output     float32[1, 128, 128]" in lines
    exec(lines[lines.index("an inputs file, in Python (your own values in place of these):") + 1].strip())
    feed = check_feed(load_graph_proto("bert_tiny"), load_npz(tmp_path / "inputs.npz"))
    assert feed["input_ids"].shape == (1, 128) and feed["input_ids"].max() < 30522
    assert lines[-1].startswith("then: tensorgen run bert_tiny --inputs inputs.npz -o outputs.npz")


def load_graph_proto(name: str) -> onnx.ModelProto:
    from tensorgen.graph.load import onnx_model_of

    return onnx_model_of(name)


def symbolic_onnx(path: Path) -> None:
    """A model whose two inputs share the symbolic dimensions batch and seq; `ids` index a table of 50 rows."""
    table = numpy_helper.from_array(np.random.default_rng(0).random((50, 8), dtype=np.float32), "table")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["rows"]), helper.make_node("Add", ["rows", "bias"], ["out"])],
        "symbolic", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"]),
                     helper.make_tensor_value_info("bias", TensorProto.FLOAT, ["batch", "seq", 8])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", "seq", 8])], [table])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)


def test_info_of_a_file_with_symbolic_dimensions_says_how_to_fix_them(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    symbolic_onnx(tmp_path / "sym.onnx")
    code, out, err = cli(["info", "sym.onnx"])
    assert code == 0, err
    assert "  ids   int64[batch, seq]       ids in [0, 50)\n  bias  float32[batch, seq, 8]\n" in out
    assert "outputs, as the file declares them:\n  out   float32[batch, seq, 8]\n" in out
    assert "fix them for tune, build, bench and run with --shape ids=1x1 --shape bias=1x1x8" in out
    code, out, err = cli(["info", "sym.onnx", "--shape", "ids=2x5"])  # bias takes batch and seq from ids
    assert code == 0 and "with --shape bias=2x5x8 " in out
    code, out, err = cli(["info", "sym.onnx", "--shape", "ids=2x5", "--shape", "bias=2x5x8"])
    assert code == 0, err
    assert "  ids   int64[2, 5]       ids in [0, 50)\n" in out
    assert "outputs (what `tensorgen run` writes, by name):\n  out   float32[2, 5, 8]\n" in out
    lines = out.splitlines()
    exec(lines[lines.index("an inputs file, in Python (your own values in place of these):") + 1].strip())
    code, out, err = cli(["run", "sym.onnx", "--inputs", "inputs.npz", "-o", "outputs.npz"])
    assert code == 0, err
    assert np.load(tmp_path / "outputs.npz")["out"].shape == (2, 5, 8)
    code, _, err = cli(["info", "sym.onnx", "--shape", "ids=2x5x3"])
    assert code == 2 and err.startswith("tensorgen: error: --shape ids gives input 'ids' the shape 2x5x3")


def test_info_of_a_model_tensorgen_cannot_import_lists_it_and_says_why(tmp_path):
    graph = helper.make_graph([helper.make_node("Det", ["x"], ["y"])], "det",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), tmp_path / "d.onnx")
    code, out, err = cli(["info", str(tmp_path / "d.onnx")])
    assert code == 2 and "  x  float32[3, 3]\noutputs, as the file declares them:\n  y  float32[]\n" in out
    assert "then: tensorgen run" not in out and err.count("\n") == 1
    assert err.startswith("tensorgen: error: model 'det' has unsupported ops: node 'det_0' (Det): unsupported op")


# ---------------------------------------------------------------------------------------------
# build's kernel counts


def three_kernels(path: Path) -> None:
    """Two MatMul+Relu kernels of different shapes (one's program adapts to the other) and a ReduceSum."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
               for n, s in (("w1", (32, 48)), ("w2", (48, 16)))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["h2"]), helper.make_node("Relu", ["h2"], ["r2"]),
             helper.make_node("ReduceSum", ["r2"], ["y"], keepdims=1)]
    graph = helper.make_graph(nodes, "three", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)


def test_build_says_where_every_kernels_program_comes_from(tmp_path):
    """Regression: "7 kernels (5 tuned, 1 adapted from tuned ones)" left the seventh (a default schedule) unsaid."""
    three_kernels(tmp_path / "three.onnx")
    graph = load_graph(str(tmp_path / "three.onnx"))
    first = extract_tasks(graph, "cpu")[0].task
    with SQLiteDatabase(tmp_path / "t.db") as db:  # a record for the first MatMul only
        db.commit_record(Record.from_measure(first, model_target("cpu").schedule(first.dag, 2), MeasureResult((1e-5,))))
        lines: list[str] = []
        build_model(graph, tmp_path / "out", db=db, progress=lines.append)
    assert lines == ["three: 3 kernels: 1 tuned, 1 adapted from the tuned program of a similar kernel, 1 with the "
                     "default schedule (no record); compiling"]


def test_bench_without_onnxruntime_says_it_compared_with_nothing(tmp_path, monkeypatch):
    """`pip install -e .` has no ONNX Runtime: bench printed tensorgen's time alone, and no word why."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime raises ImportError
    three_kernels(tmp_path / "three.onnx")
    code, out, err = cli(["bench", "three.onnx", "--blocks", "2", "--candidates", "1", "--threads", "1"])
    assert code == 0, err
    assert "  onnxruntime  not installed: no time to compare with, no outputs to check against (pip install " \
           "onnxruntime, or tensorgen's [bench] extra)" in out


def test_in_model_selection_says_what_it_timed_in_words(tmp_path):
    """Regression: "every kernel with its rank-r record, r = 0..1: ..." and "faster with a lower-ranked record;
    their mix ... vs ... with every kernel at rank 0: rank 0 kept" read as jargon."""
    three_kernels(tmp_path / "three.onnx")
    built = build_model(str(tmp_path / "three.onnx"), tmp_path / "built")

    def build(ranks, directory: Path) -> Path:  # every rank the same build: what is tested is the wording
        shutil.copytree(built, directory)
        return directory

    lines: list[str] = []
    select_in_model(build, 3, 2, runs=2, rounds=1, threads=1, progress=lines.append)
    assert re.fullmatch(r"in-model selection: the model timed with each kernel's 2 fastest records \(fastest when "
                        r"timed alone\): every kernel with its fastest [\d.]+ ms, 2nd fastest [\d.]+ ms", lines[0])
    assert re.fullmatch(r"in-model selection: [0-3] of 3 kernels ran faster inside the model with a record other "
                        r"than their fastest alone; each kernel with the record that ran fastest inside the model "
                        r"[\d.]+ ms, every kernel with its (2nd )?fastest [\d.]+ ms: built with (each kernel's record "
                        r"that ran fastest inside the model|every kernel's (2nd )?fastest record)", lines[1]), lines[1]
