"""bench/ops.py (Figure 6/8 single-operator benchmark) and bench/ablation.py (Figure 7) on tiny budgets,
the PyTorch references they time, and the tune() options behind the ablation."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from tensorgen.build import build
from tensorgen.cli.tune import parse_workload
from tensorgen.dag import ComputeDAG
from tensorgen.te.ops.suite import SUITE
from tensorgen.tuning.tune import ABLATIONS, TuneError, ablation_policy, make_policy, make_task, tune

BENCH = Path(__file__).resolve().parent.parent / "bench"
torch = pytest.importorskip("torch")


def load_bench(name: str):
    """Import bench/<name>.py as a module (bench/ is not a package; its scripts import tensorgen/timing.py)."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    mod_name = f"_bench_{name}"
    if mod_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(mod_name, BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        spec.loader.exec_module(module)
    return sys.modules[mod_name]


# Small configs in each operator's shape format (the suite's real ones are too big for a unit test).
SMALL = {
    "C1D": (16, 8, 16, 3, 2, 1), "C2D": (9, 9, 4, 8, 3, 2, 1), "C3D": (4, 6, 6, 4, 8, 3, 1, 1),
    "GMM": (8, 12, 16), "GRP": (8, 8, 8, 16, 3, 2, 1, 4), "DIL": (9, 9, 4, 8, 3, 1, 1, 2),
    "DEP": (8, 8, 8, 3, 2, 1), "T2D": (4, 4, 8, 6, 4, 2, 1), "CAP": (6, 6, 4, 4, 3, 2, 1, 2),
    "NRM": (8, 12), "ConvLayer": (8, 8, 4, 8, 3, 2, 1), "TBS": (8, 2, 4),
}


def test_small_configs_cover_the_suite():
    assert set(SMALL) == set(SUITE)


@pytest.mark.parametrize("op", sorted(SMALL))
def test_torch_reference_is_the_same_math(op):
    """The PyTorch computation timed next to tensorgen equals the naive tensorgen program (batch 2)."""
    ops = load_bench("ops")
    make, _ = SUITE[op]
    inputs, outputs = make(*SMALL[op], batch=2)
    dag = ComputeDAG(list(inputs) + list(outputs))
    arrays = ops.make_inputs(dag, seed=3)
    (naive,) = build(dag).run(*[arrays[t.name] for t in dag.inputs])
    ref = ops.torch_reference(op, SMALL[op])
    with torch.inference_mode():
        ref64 = ref.back(ref.fn(*ref.prepare({k: v.astype(np.float64) for k, v in arrays.items()})))
        ref32 = ref.back(ref.fn(*ref.prepare(arrays)))
        tensors = ref.prepare(arrays)
        buf = torch.empty_like(ref.fn(*tensors)) if ref.writes_out else None
        timed32 = ref.back(ref.fn(*tensors, out=buf))  # the timed call, into its preallocated output
    assert ops.check(timed32, ref64, "torch out=") is None
    assert ops.check(naive, ref64, "naive") is None
    assert ops.check(ref32, ref64, "torch") is None
    # and the check catches a wrong answer
    assert ops.check(naive * 1.01 + 0.1, ref64, "wrong") is not None


@pytest.mark.serial  # times candidates and checks what the timing says: alone, not beside other tests
def test_ops_bench_smoke(tmp_path, capsys):
    ops = load_bench("ops")
    out = tmp_path / "ops.json"
    rc = ops.main(["--ops", "GMM", "--config", "16,16,16", "--batch", "1", "--trials", "4", "--batch-size", "4",
                   "--population", "64", "--rounds", "2", "--repeat", "3", "--pause", "0", "--bound", "1000",
                   "--quiet", "--json", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    data = json.loads(out.read_text())
    (case,) = data["cases"]
    for key in ("op", "shape", "batch", "trials", "tuning_wall_s", "search_overhead_s", "tensorgen_gflops",
                "torch_gflops", "numpy_gflops", "ratio"):
        assert key in case, key
    assert case["status"] == "ok" and case["error"] is None
    assert case["op"] == "GMM" and case["shape"] == [16, 16, 16] and case["batch"] == 1 and case["trials"] == 4
    assert case["correctness"]["checked"] and case["correctness"]["max_rel_error"] < ops.RTOL
    assert case["tensorgen_gflops"] > 0 and case["torch_gflops"] > 0 and case["numpy_gflops"] > 0
    # one statistic: every column and the ratio follow from the medians over rounds
    assert case["ratio"] == pytest.approx(case["tensorgen_gflops"] / case["torch_gflops"])
    assert case["numpy_ratio"] == pytest.approx(case["tensorgen_gflops"] / case["numpy_gflops"])
    timing = case["timing"]
    assert case["reliable"] is True and timing["rounds"] == 2 and timing["calls"] >= 1
    assert case["torch_gflops"] == pytest.approx(case["flops"] / timing["seconds"]["torch"] / 1e9)
    assert set(timing["spreads"]) == {"tensorgen", "torch", "numpy"} and case["load"]["competing_process"] is False
    assert data["config"]["timing"]["bound"] == 1000 and data["config"]["load"] is False
    assert 0 <= case["search_overhead_s"] <= case["tuning_wall_s"]
    assert max(case["normalized"].values()) == pytest.approx(1.0)
    assert set(data["summary"]) == {"GMM", "GMM/b1"}
    assert "GMM(16,16,16) batch=1" in printed and "geometric mean" in printed


@pytest.mark.serial  # times candidates and checks what the timing says: alone, not beside other tests
def test_ops_bench_resumes_from_db_and_reports_mismatch(tmp_path, monkeypatch, capsys):
    """With --db the budget is a total (a second run measures nothing new); a wrong answer is an
    error, never a speed."""
    ops = load_bench("ops")
    db, out = tmp_path / "t.db", tmp_path / "ops.json"
    argv = ["--ops", "NRM", "--config", "8,64", "--batch", "2", "--trials", "2", "--batch-size", "2",
            "--population", "32", "--rounds", "2", "--repeat", "2", "--pause", "0", "--quiet",
            "--db", str(db), "--json", str(out)]
    assert ops.main(argv) == 0
    assert json.loads(out.read_text())["cases"][0]["trials"] == 2
    real = ops.torch_reference
    monkeypatch.setattr(ops, "torch_reference", lambda op, cfg: _scaled(real(op, cfg)))
    assert ops.main(argv) == 1
    (case,) = json.loads(out.read_text())["cases"]
    assert case["trials"] == 0 and case["total_trials"] == 2
    assert case["status"] == "error" and "differs" in case["error"] and case["tensorgen_gflops"] is None
    assert "ERROR" in capsys.readouterr().out


def _scaled(ref):
    """A reference whose float64 result is off by 1% (and whose float32 one is too)."""
    return type(ref)(ref.prepare, lambda *t, out=None: ref.fn(*t) * 1.01, ref.back)


def test_select_cases():
    ops = load_bench("ops")
    args = ops.parse_args(["--ops", "c2d,GMM", "--shapes", "0,3", "--batch", "1,16"])
    cases = ops.select_cases(args)
    assert [(op, i, b) for op, i, _, b in cases] == [
        ("C2D", 0, 1), ("C2D", 3, 1), ("C2D", 0, 16), ("C2D", 3, 16),
        ("GMM", 0, 1), ("GMM", 3, 1), ("GMM", 0, 16), ("GMM", 3, 16)]
    assert cases[-1][2] == (1024, 1024, 1024)
    with pytest.raises(SystemExit):
        ops.select_cases(ops.parse_args(["--ops", "XYZ"]))
    with pytest.raises(SystemExit):
        ops.select_cases(ops.parse_args(["--ops", "GMM", "--shapes", "4"]))
    with pytest.raises(SystemExit):
        ops.select_cases(ops.parse_args(["--ops", "GMM", "--config", "1,2"]))


@pytest.mark.slow  # a whole benchmark run, end to end (about 30 s on two busy cores)
def test_ablation_smoke(tmp_path, capsys):
    ablation = load_bench("ablation")
    out = tmp_path / "ablation.json"
    rc = ablation.main(["--shape", "8,8,8,8,3,1,1", "--trials", "4", "--batch-size", "2", "--population", "32",
                        "--points", "2", "--quiet", "--json", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0
    data = json.loads(out.read_text())
    assert list(data["variants"]) == list(ABLATIONS)
    assert data["best_gflops"] == pytest.approx(max(v["best_gflops"] for v in data["variants"].values()))
    for name, v in data["variants"].items():
        (run,) = v["runs"]
        assert run["trials"] == 4 and len(run["curve"]) == 4, name
        # best so far; it drops only where a best program, re-timed, turned out slower (at most by re-timing)
        assert all(g >= 0 for g in run["curve"]) and run["curve"][-1] > 0
        assert run["curve"][-1] == pytest.approx(run["best_gflops"])
        assert [e[0] for e in run["progress"]] == [0, 2, 4]
        assert v["relative_curve"][-1] <= 1.0 + 1e-9
        assert name in printed
    assert data["variants"]["no-fine-tuning"]["runs"][0]["options"]["generations"] == 0
    assert data["variants"]["limited-space"]["runs"][0]["sketches"] == 1
    assert data["variants"]["random"]["runs"][0]["policy"] == "random"
    assert "register_tile_share=0.0" in data["variants"]["uniform-tiles"]["runs"][0]["options"]["annotation"]


# ---------------------------------------------------------------------------------------------
# tune(policy_options=...) and the ablation variants


@pytest.fixture(scope="module")
def c2d_task():
    _, _, dag = parse_workload("c2d", "8,8,8,8,3,1,1")
    return make_task(dag)


def test_ablation_policies(c2d_task):
    from tensorgen.search.sketch import generate_sketches

    full = generate_sketches(c2d_task)
    policy, options = ablation_policy("limited-space", c2d_task)
    assert policy == "ansor" and len(options["sketches"]) == 1 < len(full)
    assert "cache_write" not in options["sketches"][0].to_json()
    assert ablation_policy("no-fine-tuning", c2d_task) == ("ansor", {"generations": 0})
    assert ablation_policy("random", c2d_task) == ("random", {})
    assert ablation_policy("ansor", c2d_task) == ("ansor", {})
    with pytest.raises(TuneError, match="unknown ablation"):
        ablation_policy("beam", c2d_task)
    search = make_policy(c2d_task, "ansor", "random", 0, {"sketches": options["sketches"], "population": 16})
    assert len(search.sketches) == 1


def test_policy_options_errors(c2d_task):
    with pytest.raises(TuneError, match="no option 'nonsense'"):
        tune(c2d_task, trials=1, policy="random", policy_options={"nonsense": 1})
    with pytest.raises(TuneError, match="cost_model"):
        make_policy(c2d_task, "ansor", policy_options={"cost_model": "random"})
    instance = make_policy(c2d_task, "random")
    with pytest.raises(TuneError, match="SearchPolicy instance"):
        make_policy(c2d_task, instance, policy_options={"seed": 1})


def test_parse_workload_accepts_zero_padding():
    name, config, dag = parse_workload("c2d", "56,56,64,64,1,1,0")
    assert name == "C2D" and config[-1] == 0 and dag.flop_count > 0


@pytest.mark.serial  # times candidates and checks what the timing says: alone, not beside other tests
def test_unreliable_cases_are_marked_and_left_out_of_the_means(tmp_path, capsys):
    """A bound no timing can meet: the case is re-measured up to --max-rounds, then published as
    UNRELIABLE with its spreads, and the geometric means leave it out."""
    ops = load_bench("ops")
    out = tmp_path / "ops.json"
    rc = ops.main(["--ops", "GMM", "--config", "8,8,8", "--batch", "1", "--trials", "2", "--batch-size", "2",
                   "--population", "16", "--rounds", "2", "--max-rounds", "3", "--bound", "1e-12", "--repeat", "2",
                   "--pause", "0", "--quiet", "--json", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0
    data = json.loads(out.read_text())
    (case,) = data["cases"]
    assert case["status"] == "ok" and case["reliable"] is False and case["timing"]["rounds"] == 3
    assert case["timing"]["reliable"] is False and max(case["timing"]["spreads"].values()) > 1e-12
    assert "UNRELIABLE" in printed and "1 unreliable" in printed and "1 re-measured" in printed
    assert data["summary"] == {}


@pytest.mark.serial  # times candidates and checks what the timing says: alone, not beside other tests
def test_load_option_runs_a_competing_process(tmp_path):
    ops = load_bench("ops")
    out = tmp_path / "ops.json"
    assert ops.main(["--ops", "NRM", "--config", "8,16", "--batch", "1", "--trials", "2", "--batch-size", "2",
                     "--population", "16", "--rounds", "2", "--repeat", "2", "--pause", "0", "--bound", "1000",
                     "--load", "--quiet", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["config"]["load"] is True and data["cases"][0]["load"]["competing_process"] is True


def test_bad_timing_options_are_refused(capsys):
    ops = load_bench("ops")
    with pytest.raises(SystemExit):
        ops.parse_args(["--rounds", "1"])
    assert "rounds" in capsys.readouterr().err


def test_geomean():
    ops = load_bench("ops")
    assert ops.geomean([1.0, 0.25]) == pytest.approx(0.5) and ops.geomean([]) is None
