"""The hand schedules of tensorgen.examples (used by bench/hand_schedules.py) on small shapes, and the scripts
bench/hand_schedules.py and bench/tune_gmm.py on tiny budgets."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tensorgen.build import build
from tensorgen.examples import conv2d_nhwc_im2col, conv2d_nhwc_reference, conv2d_state, gmm_state, max_rel_error

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))  # the bench scripts import tensorgen/timing.py
from tensorgen import timing  # noqa: E402


@pytest.mark.parametrize("m,n,k,kw", [
    (64, 64, 64, {}),  # the bench's schedule: 8x8 register tile, k_block=min(256, k)
    (32, 64, 48, {"n_blocks": 2, "k_block": 16, "j_outer": True}),  # column blocks, a real k_0 loop
    (16, 16, 24, {"n_blocks": 1, "k_block": 8}),
])
def test_gmm_schedule(m, n, k, kw):
    state = gmm_state(m, n, k, **kw)
    func = build(state)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    (c,) = func.run(a, b)
    assert max_rel_error(c, a @ b) < 1e-4
    assert "C_local" in func.source and "#pragma omp parallel" in func.source


@pytest.mark.parametrize("kw", [
    {},  # packed weights, 8 w x 8 co register tile
    {"pack_weight": False},  # ops.conv2d as is
    {"tile_w": 4, "tile_co": 16},  # two vectors of output channels
    {"tile_w": 2, "padding": 0},  # no pad stage
    {"stride": 2, "tile_w": 4},
    {"tile_h": 2, "tile_w": 4, "co_outer": True},
])
def test_conv2d_schedule(kw):
    n, h, w, ci, co = 1, 8, 8, 16, 16
    padding, stride = kw.get("padding", 1), kw.get("stride", 1)
    state = conv2d_state(n, h, w, ci, co, kernel=3, **kw)
    func = build(state)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((n, h, w, ci), dtype=np.float32)
    wt = rng.standard_normal((3, 3, ci, co), dtype=np.float32)
    (y,) = func.run(x, wt)
    ref = conv2d_nhwc_reference(x, wt, padding=padding, stride=stride)
    assert y.shape == ref.shape
    assert max_rel_error(y, ref) < 1e-4
    assert max_rel_error(conv2d_nhwc_im2col(x, wt, padding, stride), ref) < 1e-4


def test_bad_tiles_are_rejected():
    with pytest.raises(ValueError):
        gmm_state(60, 64, 64)
    with pytest.raises(ValueError):
        conv2d_state(1, 8, 8, 16, 12)



def _bench_module(name: str):
    """bench/<name>.py as a module (bench/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_hand_schedules_bench_uses_the_timing_protocol():
    """One statistic per row: the ratio is the ratio of the reported GFLOP/s; NumPy writes into its own
    preallocated output."""
    hand = _bench_module("hand_schedules")
    protocol = timing.Protocol(rounds=2, max_rounds=2, bound=1000.0, samples=2, pause_s=0.0, warm_s=0.0)
    res = hand.bench_gmm(protocol, False, 1, size=64)
    assert res["max_rel_error"] < hand.RTOL and res["reliable"] is True
    assert res["ratio"] == pytest.approx(res["tensorgen_gflops"] / res["numpy_gflops"])
    assert res["timing"]["rounds"] == 2 and set(res["timing"]["seconds"]) == {"tensorgen", "numpy"}


def test_tune_gmm_bench_smoke(tmp_path, capsys):
    tune_gmm = _bench_module("tune_gmm")
    out = tmp_path / "g.json"
    assert tune_gmm.main(["--size", "32", "--trials", "2", "--batch-size", "2", "--rounds", "2", "--max-rounds", "2",
                          "--repeat", "2", "--pause", "0", "--bound", "1000", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["ratio"] == pytest.approx(data["tuned_gflops"] / data["numpy_gflops"]) and data["reliable"]
    assert "rounds" in capsys.readouterr().out


def test_dataset_bench_measures_random_then_searched_programs_and_resumes(tmp_path, capsys):
    from tensorgen.tuning.training import load_training_set

    dataset = _bench_module("dataset")
    db = tmp_path / "d.db"
    argv = ["--models", "dcgan", "--programs", "2", "--db", str(db), "--minutes", "0"]
    assert dataset.main(argv) == 0  # one task, then the time is up
    out = capsys.readouterr().out
    data = load_training_set([db], min_programs=1)
    assert len(data.tasks) == 1 and data.tasks[0].target == "cpu" and 1 <= data.programs <= 2  # a small space
    assert f"[1/7] dcgan: transpose (0.0 MFLOP): {data.programs} programs" in out
    assert "stopped after 0.0 minutes, 1 of 7" in out
    assert dataset.main(argv) == 0 and load_training_set([db], min_programs=1).programs == data.programs  # resumed


def test_pruner_quality_bench_tables(tmp_path):
    """Both tables from two small databases of random programs: the cost models on a task they were not trained on,
    and PSA's pruned space (whose Best-1 can only be at most 1: the space's best over a subset's best)."""
    from search_tasks import gmm, nrm

    from tensorgen.tuning.tune import tune

    train, test = tmp_path / "train.db", tmp_path / "test.db"
    tune(gmm(16), trials=12, policy="random", batch_size=12, db=train)
    tune(nrm(), trials=16, policy="random", batch_size=16, db=test)
    quality = _bench_module("pruner_quality")
    out = tmp_path / "models.json"
    assert quality.main(["models", "--train-db", str(train), "--test-db", str(test), "--online", "8", "--steps", "10",
                         "--workdir", str(tmp_path), "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["test_tasks"] == 1 and report["train_tasks"] == 1 and len(report["models"]) == 6
    assert all(0 <= m["pairwise"] <= 1 and 0 < m["top-5"] <= 1 for m in report["models"].values())
    pacm = report["pretrained"]["pacm"]  # a PaCM file instead of training databases: the models that need none
    assert quality.main(["models", "--pretrained", pacm, "--test-db", str(test), "--online", "8", "--json",
                         str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["train_tasks"] is None and report["pretrained"] == {"pacm": pacm}
    assert set(report["models"]) == {"xgb (online)", "pacm (online)", "pacm (pretrained, no update)", "pacm + mtl"}
    with pytest.raises(SystemExit):
        quality.main(["models", "--test-db", str(test)])  # neither training databases nor a pretrained file
    with pytest.raises(SystemExit, match="cannot read the model"):
        quality.main(["models", "--pretrained", str(tmp_path / "missing.pt"), "--test-db", str(test)])
    with pytest.raises(SystemExit, match="no held-out task"):
        quality.main(["models", "--pretrained", pacm, "--test-db", str(test), "--online", "100"])
    out = tmp_path / "psa.json"
    assert quality.main(["psa", "--db", str(test), "--db", str(train), "--sizes", "3,6", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["tasks"] == 2 and set(report["best_k"]) == {"size 3", "size 6"}
    assert all(0 < v <= 1 for size in report["best_k"].values() for v in size.values())
    assert -1 <= report["spearman"] <= 1
    ansor = tmp_path / "ansor.db"  # a tuning database has no random runs: --programs all takes what it measured
    tune(gmm(16), trials=12, policy="ansor", batch_size=12, db=ansor)
    with pytest.raises(SystemExit, match="measured random programs"):
        quality.main(["psa", "--db", str(ansor), "--sizes", "3"])
    assert quality.main(["psa", "--db", str(ansor), "--sizes", "3", "--programs", "all", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["tasks"] == 1
    x = np.array([3.0, 1.0, 3.0, 2.0])
    assert list(quality.ranks(x)) == [2.5, 0.0, 2.5, 1.0]


class _ScriptedVariant:
    """A variant's process as the coordinator sees it: one round of 1 s per "go", with the estimates given."""

    def __init__(self, estimates):
        self.estimates, self.rounds, self.moves = list(estimates), 0, []

    def send(self, move):
        self.moves.append(move)

    def recv(self):
        if self.moves[-1] == "stop" or self.rounds == len(self.estimates):
            final = next((e for e in reversed(self.estimates[:self.rounds]) if e is not None), None)
            return ("done", {"final_ms": final, "wall_s": float(self.rounds), "trials": self.rounds,
                             "search_s": 0.25 * self.rounds, "build_s": 0.25 * self.rounds, "run_s": 0.5 * self.rounds,
                             "curve": [(i + 1.0, i + 1, e) for i, e in enumerate(self.estimates[:self.rounds])
                                       if e is not None]})
        self.rounds += 1
        return ("round", float(self.rounds), self.rounds, self.estimates[self.rounds - 1])


def test_pruner_networks_interleaves_the_variants():
    """The reference runs its whole budget; a variant sits out while ahead of it, ends once it reaches its final or
    has used the reference's whole time; --full runs everyone to the end."""
    networks = _bench_module("pruner_networks")
    curve = [(1.0, 16, 9.0), (2.0, 32, 5.0), (3.5, 48, 4.0)]
    assert networks.time_to_reach(curve, 5.0) == (2.0, 32) and networks.time_to_reach(curve, 3.9) is None
    scripts = {"ansor": [None, 10.0, 8.0, 6.0, 5.0],  # the reference: final 5.0 in 5 s
               "fast": [7.0, 4.0, 3.0],  # ahead of the reference from its first round (7 <= 10 after round 2)
               "slow": [20.0, 15.0, 12.0, 11.0, 10.0, 9.0, 8.0]}  # never reaches 5.0: ends at the reference's 5 s
    fakes = {name: _ScriptedVariant(e) for name, e in scripts.items()}
    runs = networks.coordinate({n: networks.Player(f) for n, f in fakes.items()}, "ansor", full=False)
    assert fakes["ansor"].moves == ["go"] * 6 and fakes["slow"].moves == ["go"] * 5 + ["stop"]
    # fast: its round 1 (7.0) while ansor has no estimate; sits out while ahead of ansor's 10 and 8; goes when ansor
    # is at 6 (4.0); sits out again; stops once ansor ends with 5.0
    assert fakes["fast"].moves == ["go", "go", "stop"] and runs["fast"]["final_ms"] == 4.0
    rows = networks.summarize(runs, "ansor")
    assert rows["fast"]["reaches_reference_final_at_s"] == 2.0 and rows["fast"]["time_ratio"] == pytest.approx(0.4)
    assert rows["slow"]["time_ratio"] is None and rows["ansor"]["time_ratio"] == 1.0
    assert rows["fast"]["first_estimate"] == (1.0, 1, 7.0) and rows["fast"]["run_s"] == 1.0
    fakes = {name: _ScriptedVariant(e) for name, e in scripts.items()}
    networks.coordinate({n: networks.Player(f) for n, f in fakes.items()}, "ansor", full=True)
    assert [len(f.moves) for f in fakes.values()] == [6, 4, 8]  # every round, then the "go" that ends the run


def test_pruner_networks_variants():
    networks = _bench_module("pruner_networks")
    assert networks.parse_variant("pruner@8", None) == networks.Variant("pruner@8", "pruner", "pacm", 8)
    assert networks.parse_variant("pruner-mtl", "m.pt").cost_model == "pacm:m.pt"
    knobbed = networks.parse_variant("pruner@8:draft_population=512:verify_population=None:space=sketch", None)
    assert knobbed.warmup_trials == 8 and knobbed.options == (("draft_population", 512), ("verify_population", None),
                                                               ("space", "sketch"))
    tuned = networks.parse_variant("pruner-mtl@8:pacm.transfer_lr=1e-4:draft_population=64", "m.pt")
    assert tuned.pacm == (("transfer_lr", 1e-4),) and tuned.options == (("draft_population", 64),)
    assert networks.parse_variant("pruner:pacm.steps=8", None).make_cost_model(0).config.steps == 8
    own = networks.parse_variant("pruner-mtl:pretrained=other.pt:draft_population=64", "m.pt")
    assert own.cost_model == "pacm:other.pt" and own.options == (("draft_population", 64),)
    assert networks.variant_db("/tmp/x", "nets/m.onnx", "pruner-mtl:pretrained=/a/b.pt", 2) == \
        "/tmp/x_m_pruner-mtl:pretrained=_a_b.pt_s2.db"
    assert networks.parse_variant("ansor@8:sched.backward_window=1", None).sched == (("backward_window", 1),)
    for bad, match in [("pruner@0", "unknown variant"), ("tvm", "unknown variant"), ("pruner-mtl", "--pretrained"),
                       ("pruner:draft_population", "KNOB=VALUE"), ("pruner:=3", "KNOB=VALUE"),
                       ("pruner:x.y=1", "KNOB=VALUE"), ("pruner:pacm.sched.lr=1", "KNOB=VALUE"),
                       ("ansor:pacm.lr=1", "cost model is PaCM"), ("pruner:pacm.speed=2", "PaCMConfig has no knob"),
                       ("ansor:sched.alpah=1", "SchedulerConfig has no knob 'alpah'"),
                       ("pruner:pretrained=m.pt", "needs a pretrained variant")]:
        with pytest.raises(SystemExit, match=match):
            networks.parse_variant(bad, None)
    with pytest.raises(SystemExit, match="at least one other"):
        networks.main(["--variants", "ansor"])
    with pytest.raises(SystemExit, match="--seeds: expected"):
        networks.main(["--variants", "ansor,pruner", "--seeds", "0,x"])
    with pytest.raises(SystemExit, match="--target: "):
        networks.main(["--variants", "ansor,pruner", "--target", "tpu -v=2"])


def test_pruner_networks_median_ratio_over_seeds_counts_never_as_slowest():
    networks = _bench_module("pruner_networks")

    def summary(ratio):
        return {"ansor": {"time_ratio": 1.0}, "pruner": {"time_ratio": ratio}}

    assert networks.median_ratios([summary(0.4), summary(None), summary(0.6)]) == {"ansor": 1.0, "pruner": 0.6}
    assert networks.median_ratios([summary(0.4), summary(None), summary(None)])["pruner"] is None
    assert networks.median_ratios([summary(0.3)]) == {"ansor": 1.0, "pruner": 0.3}


def test_pruner_networks_task_gaps_rank_the_tasks_a_variant_lags_on_by_weighted_time():
    networks = _bench_module("pruner_networks")

    def task(index, weight, ms, trials):
        return {"index": index, "desc": "conv2d", "weight": weight, "ms": ms, "trials": trials}

    runs = {"ansor": {"tasks": [task(0, 1, 2.0, 64), task(1, 4, 1.0, 96), task(2, 1, 3.0, 32), task(3, 2, 1.0, 32)]},
            "pruner": {"tasks": [task(0, 1, 2.5, 40), task(1, 4, 1.2, 80), task(2, 1, 2.0, 8), task(3, 2, None, 0)]}}
    gaps = networks.task_gaps(runs, "ansor", top=2)["pruner"]
    assert [g["index"] for g in gaps] == [1, 0]  # 4 x 0.2 ms, then 1 x 0.5 ms; task 2 is ahead, task 3 unmeasured
    assert gaps[0]["gap_ms"] == pytest.approx(0.8) and gaps[0]["trials"] == 80 and gaps[0]["reference_trials"] == 96
    assert networks.task_gaps(runs, "ansor")["pruner"][-1]["gap_ms"] == pytest.approx(-1.0)


def _tiny_model(path: Path) -> Path:
    """A one-layer ONNX model (MatMul, Relu): one task."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((32, 16)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Relu", ["y"], ["z"])],
                              "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 32])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [8, 16])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.mark.slow  # a whole benchmark run, end to end (about 30 s on two busy cores)
def test_pruner_networks_end_to_end(tmp_path):
    """The script on a one-layer model: two variants in their own processes, in turns, each with its database."""
    _tiny_model(tmp_path / "tiny.onnx")
    out = tmp_path / "report.json"
    subprocess.run([sys.executable, str(BENCH / "pruner_networks.py"), "--models", str(tmp_path / "tiny.onnx"),
                    "--trials", "6", "--round-trials", "2", "--variants", "ansor,pruner@1:draft_population=64",
                    "--dbs", str(tmp_path / "pn"), "--seeds", "3", "--json", str(out)], check=True, timeout=600)
    report = json.loads(out.read_text())["models"][str(tmp_path / "tiny.onnx")]
    pruner = "pruner@1:draft_population=64"
    runs = report["seeds"]["3"]["runs"]
    assert set(runs) == {"ansor", pruner} and runs["ansor"]["trials"] == 6
    assert (tmp_path / "pn_tiny_ansor_s3.db").exists() and (tmp_path / f"pn_tiny_{pruner}_s3.db").exists()
    assert runs[pruner]["curve"][0][1] == 1  # its warm-up round: one program
    summary = report["seeds"]["3"]["summary"][pruner]
    assert summary["first_estimate"][1] == 1
    assert 0 < summary["search_s"] and 0 < summary["build_s"] < runs[pruner]["wall_s"]
    assert runs[pruner]["options"] == [["draft_population", 64]]
    assert 0 < report["median_time_ratio"]["ansor"] <= 1  # the reference reaches its own final
    assert [t["index"] for t in runs["ansor"]["tasks"]] == [0] and runs["ansor"]["tasks"][0]["trials"] == 6
    assert [g["index"] for g in report["seeds"]["3"]["task_gaps"][pruner]] == [0]
    bad = subprocess.run([sys.executable, str(BENCH / "pruner_networks.py"), "--models", str(tmp_path / "tiny.onnx"),
                          "--trials", "2", "--variants", "ansor,pruner:drafts=3", "--dbs", str(tmp_path / "bad")],
                         capture_output=True, text=True, timeout=600)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert "variant pruner:drafts=3 failed: SketchPolicy has no knob 'drafts'" in bad.stderr.strip().splitlines()[-1]


def test_kernel_profiles_ratios_and_the_kernels_that_differ_most():
    profiles = _bench_module("kernel_profiles")

    def profile(a, b):
        return [{"kernel": "k0_conv", "ms": a, "tuned_ms": 1.0}, {"kernel": "k1_relu", "ms": b, "tuned_ms": None}]

    report = profiles.summarize({"ref": [profile(2.0, 1.0), profile(3.0, 1.0), profile(2.0, 2.0)],
                                 "new": [profile(4.0, 1.0), profile(3.0, 1.5), profile(2.0, 1.0)]}, "ref")
    new = report["builds"]["new"]
    assert report["builds"]["ref"]["ratio"] == 1.0 and report["builds"]["ref"]["tuned_ms"] == 1.0
    assert new["rounds_ms"] == [5.0, 4.5, 3.0] and new["median_ms"] == 4.5
    assert new["ratio"] == pytest.approx(9 / 8) and new["ratio_min"] == pytest.approx(0.75)
    assert new["ratio_max"] == pytest.approx(5 / 3)
    assert [(k["kernel"], k["ms"], k["reference_ms"]) for k in report["kernels"]["new"]] == [("k0_conv", 3.0, 2.0),
                                                                                            ("k1_relu", 1.0, 1.0)]

    class Build:  # records when it was profiled
        def __init__(self, name, log):
            self.name, self.log = name, log

        def profile(self, inputs, repeat):
            self.log.append(self.name)
            return profile(1.0, 1.0)

    log: list[str] = []
    out = profiles.profile_builds({n: Build(n, log) for n in "ab"}, [], rounds=3, repeat=1)
    assert log == ["a", "b", "b", "a", "a", "b"] and [len(v) for v in out.values()] == [3, 3]


def test_kernel_profiles_end_to_end(tmp_path):
    from tensorgen.graph.backend.tasks import extract_tasks
    from tensorgen.graph.load import load_graph
    from tensorgen.tuning.scheduler import TaskScheduler

    model = _tiny_model(tmp_path / "tiny.onnx")
    for seed in (0, 1):
        sched = TaskScheduler.from_models({"tiny": extract_tasks(load_graph(model))}, seed=seed)
        sched.tune(3, db=tmp_path / f"{seed}.db", policy="random")
    out = tmp_path / "report.json"
    run = subprocess.run([sys.executable, str(BENCH / "kernel_profiles.py"), "--model", str(model), "--db",
                          str(tmp_path / "0.db"), "--db", str(tmp_path / "1.db"), "--rounds", "2", "--repeat", "3",
                          "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    report = json.loads(out.read_text())
    assert set(report["builds"]) == {str(tmp_path / "0.db"), str(tmp_path / "1.db")}
    assert all(len(b["rounds_ms"]) == 2 and b["median_ms"] > 0 and b["tuned_ms"] > 0 for b in report["builds"].values())
    assert "x the reference (rounds" in run.stdout
    # bad input: one line (a SystemExit with its message, which Python prints without a traceback), checked in this
    # process: a second and third interpreter importing tensorgen cost ~5 s of CPU
    profiles = _bench_module("kernel_profiles")
    with pytest.raises(SystemExit, match="no database at"):
        profiles.main(["--model", str(model), "--db", str(tmp_path / "0.db"), "--db", str(tmp_path / "missing.db")])
    with pytest.raises(SystemExit, match="'resnet51' is neither"):
        profiles.main(["--model", "resnet51", "--db", str(tmp_path / "0.db"), "--db", str(tmp_path / "1.db")])
