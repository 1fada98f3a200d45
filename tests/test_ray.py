"""Measuring on a Ray cluster (tensorgen.measure.ray) against a real local cluster of three nodes (ray.cluster_utils):
the head measures another target, two nodes measure the tasks' target.

Checked against the local runner (same candidates, same error kinds, same records) and against Ray's own view of
where each candidate ran.
"""

import json
import shlex
import subprocess
import sys

import pytest

ray = pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402
from test_measure import KERNEL_NAME, inject, task, tiled, unfilled  # noqa: E402

from tensorgen.cli import main  # noqa: E402
from tensorgen.errors import ClusterError  # noqa: E402
from tensorgen.measure.builder import LocalBuilder  # noqa: E402
from tensorgen.measure.ray import RayRunner, check_head, import_ray, node_command, target_resource  # noqa: E402
from tensorgen.measure.runner import LocalRunner  # noqa: E402
from tensorgen.measure.types import ErrorKind, MeasureInput  # noqa: E402
from tensorgen.records.database import SQLiteDatabase  # noqa: E402
from tensorgen.search.random_policy import RandomPolicy  # noqa: E402
from tensorgen.target import HardwareParams, Target  # noqa: E402
from tensorgen.task import SearchTask  # noqa: E402
from tensorgen.tuning.tune import MeasureConfig, tune  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

TARGET = "cpu"  # test_measure's tasks
OTHER = "cpu -cores=1"
SETTINGS = {"timeout": 3.0, "number": 1, "repeat": 2, "check_correctness": True}


@pytest.fixture(scope="module")
def cluster():
    """(cluster, head, node a, node b): the head measures OTHER, a and b measure TARGET."""
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "resources": {target_resource(OTHER): 1},
        "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 4}})
    a = c.add_node(num_cpus=1, resources={target_resource(TARGET): 1})
    b = c.add_node(num_cpus=1, resources={target_resource(TARGET): 1})
    c.wait_for_nodes()
    yield c, c.head_node, a, b
    if ray.is_initialized():
        ray.shutdown()
    c.shutdown()


@pytest.fixture(scope="module")
def runner(cluster):
    r = RayRunner(address=cluster[0].address, **SETTINGS)
    yield r
    r.close()


@pytest.fixture(scope="module")
def builder():
    with LocalBuilder(timeout=10.0, source_hook=inject) as b:
        yield b


def other_task(n: int) -> SearchTask:
    return SearchTask(task(n).dag, Target.parse(OTHER), HardwareParams(cores=1))


def test_candidates_run_only_on_nodes_of_their_target(cluster, runner, builder):
    _, head, a, b = cluster
    inputs = [tiled(task(n)) for n in (32, 48, 64, 32, 48, 64)]
    runner.measured_on.clear()
    results = runner.run(inputs, builder.build(inputs))
    assert all(r.ok for r in results), [r.error_msg for r in results]
    assert set(runner.measured_on) == {a.node_id, b.node_id}  # both, one candidate each at a time
    runner.measured_on.clear()
    inputs = [tiled(other_task(n)) for n in (32, 48)]
    assert all(r.ok for r in runner.run(inputs, builder.build(inputs)))
    assert set(runner.measured_on) == {head.node_id}


def test_results_equal_the_local_runners(runner, builder):
    inputs = [tiled(task()), unfilled(task()), tiled(task(desc="wrong")), tiled(task(desc="segfault")),
              tiled(task(32)), tiled(task(desc="hang")), tiled(task(desc="syntax"))]
    builds = builder.build(inputs)
    local = LocalRunner(**SETTINGS).run(inputs, builds)
    remote = runner.run(inputs, builds)
    assert [r.error_kind for r in remote] == [r.error_kind for r in local]
    assert [r.error_kind for r in local] == [ErrorKind.NONE, ErrorKind.INSTANTIATION, ErrorKind.WRONG_ANSWER,
                                             ErrorKind.RUNTIME_ERROR, ErrorKind.NONE, ErrorKind.RUN_TIMEOUT,
                                             ErrorKind.COMPILE_ERROR]
    assert "SIGSEGV" in remote[3].error_msg
    assert all(len(r.costs) == 2 and min(r.costs) > 0 for r in remote if r.ok)


def test_tuning_on_the_cluster_writes_the_local_records(cluster, tmp_path):
    """tune() with MeasureConfig("ray", "ray") (RayBuilder compiling on the nodes) stores the records a local
    tuning stores: the same programs with the same outcomes (but for timeouts, which may be the machine's: two
    nodes measure on this machine's two cores at once)."""
    t = SearchTask(task(48).dag, Target.parse(TARGET), HardwareParams(cores=1))
    outcomes = {}
    for name, measure in [("local", MeasureConfig()), ("ray", MeasureConfig().on_ray(cluster[0].address))]:
        result = tune(t, trials=8, db=tmp_path / f"{name}.db", policy=RandomPolicy(t, seed=3), batch_size=8,
                      measure=measure)
        assert result.trials == 8
        records = SQLiteDatabase(tmp_path / f"{name}.db").records(t.workload_key, str(t.target))
        outcomes[name] = {r.steps_hash: r.result.error_kind for r in records}
    assert len(outcomes["local"]) == 8 and outcomes["ray"].keys() == outcomes["local"].keys()
    same = [k for k, kind in outcomes["local"].items() if not (kind.retryable or outcomes["ray"][k].retryable)]
    assert len(same) >= 6 and all(outcomes["ray"][k] == outcomes["local"][k] for k in same)


def at_kernel_start(source: str, code: str) -> str:
    head = source.index(f"void {KERNEL_NAME}(")
    brace = source.index("{\n", head) + 2
    return "#include <omp.h>\n#include <stdio.h>\n" + source[:brace] + code + source[brace:]


def segfault_counting(inp: MeasureInput, source: str) -> str:
    """A source hook: the kernel appends an x to the file its task's desc names, then segfaults."""
    return at_kernel_start(source, f'  {{ FILE *f = fopen("{inp.task.desc}", "a"); if (f) {{ fputc(120, f); '
                                   "fclose(f); } }\n  *(volatile int*)0 = 0;\n")


def threads_noting(inp: MeasureInput, source: str) -> str:
    """A source hook: the kernel writes its OpenMP thread count to the file its task's desc names."""
    return at_kernel_start(source, f'  {{ FILE *f = fopen("{inp.task.desc}", "w"); if (f) {{ '
                                   'fprintf(f, "%d", omp_get_max_threads()); fclose(f); } }\n')


def test_candidates_run_with_the_tasks_threads_not_rays(runner, tmp_path):
    """Ray sets OMP_NUM_THREADS=1 in a task without CPUs; the candidate still runs with the task's 2 cores."""
    noted = tmp_path / "threads"
    inputs = [tiled(task(40, desc=str(noted)))]
    with LocalBuilder(n_parallel=1, source_hook=threads_noting) as b:
        (res,) = runner.run(inputs, b.build(inputs))
    assert res.ok, res.error_msg
    assert noted.read_text() == "2"


def test_a_segfaulting_candidate_is_classified_and_run_once(runner, tmp_path):
    counter = tmp_path / "runs"
    inputs = [tiled(task(40, desc=str(counter)))]
    with LocalBuilder(n_parallel=1, source_hook=segfault_counting) as b:
        builds = b.build(inputs)
    assert builds[0].error_kind == ErrorKind.NONE, builds[0].error_msg
    (res,) = runner.run(inputs, builds)
    assert res.error_kind == ErrorKind.RUNTIME_ERROR and "SIGSEGV" in res.error_msg
    assert counter.read_text() == "x"  # one harness run: neither Ray nor the runner ran it again


def test_a_target_no_node_measures_is_one_clear_error(runner, builder):
    t = SearchTask(task().dag, Target.parse("cpu -cores=3"), HardwareParams(cores=3))
    inputs = [tiled(t)]
    with pytest.raises(ClusterError, match="no node of the Ray cluster measures target 'cpu -cores=3'"):
        runner.run(inputs, builder.build(inputs))


def test_unreachable_address_and_missing_ray_are_one_line(monkeypatch):
    with pytest.raises(ClusterError, match=r"127.0.0.1:1 is not a Ray head \(Connection refused\)"):
        check_head("127.0.0.1:1", timeout=2.0)
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ClusterError, match=r"pip install tensorgen\[ray\]"):
        import_ray()


def test_cli_worker_and_tune_ray(capsys):
    assert main(["worker", "--ray", "10.0.0.1:6379", "--target", OTHER, "--num-cpus", "2", "--dry-run"]) == 0
    cmd = shlex.split(capsys.readouterr().out)
    assert cmd == node_command("10.0.0.1:6379", OTHER, num_cpus=2)
    assert cmd[cmd.index("--address") + 1] == "10.0.0.1:6379" and "--block" in cmd
    assert json.loads(cmd[cmd.index("--resources") + 1]) == {"tensorgen-target:cpu -cores=1": 1}
    # in a process of its own: this one is connected to the test cluster
    bad = subprocess.run([sys.executable, "-m", "tensorgen.cli", "tune", "gmm", "--shape", "64,64,64", "--trials",
                          "1", "--ray", "127.0.0.1:1", "--db", ":memory:"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("tensorgen: error: 127.0.0.1:1 is not a Ray head"), bad.stderr


def test_a_node_removed_mid_tuning_loses_nothing(cluster, tmp_path):
    """A node goes away while it measures a candidate; the candidate is measured again on a, and tuning goes on.
    The removal races the node's candidate (it may have just finished it): an attempt that missed is run again
    with a fresh node, and every attempt must lose nothing."""
    c, _, a, victim = cluster

    class LosesANode(RayRunner):
        def run_each(self, inputs, build_results):
            left, from_a = len(inputs), 0
            for i, res in super().run_each(inputs, build_results):
                yield i, res
                left, came_from_a, from_a = left - 1, self.measured_on[a.node_id] > from_a, self.measured_on[a.node_id]
                # a's result is in and a gets its next candidate after this yield: the victim, warm (it has measured
                # one: a task not yet started on a node that goes away is only rescheduled), measures one of the rest
                warm = self.measured_on[victim.node_id] >= 1
                if victim in c.worker_nodes and warm and came_from_a and left >= 2:
                    c.remove_node(victim)

    t = SearchTask(task(56).dag, Target.parse(TARGET), HardwareParams(cores=1))  # two nodes on two cores
    for attempt in range(5):  # under a loaded machine (the whole suite) three attempts all missed once
        if victim not in c.worker_nodes:
            victim = c.add_node(num_cpus=1, resources={target_resource(TARGET): 1})
            c.wait_for_nodes()
        runner = LosesANode(address=c.address, **{**SETTINGS, "min_repeat_ms": 50.0})
        db = tmp_path / f"n{attempt}.db"
        with LocalBuilder(timeout=10.0) as builder:
            result = tune(t, trials=12, db=db, policy=RandomPolicy(t, seed=4), batch_size=6,
                          measure=MeasureConfig(builder, runner))
        assert victim not in c.worker_nodes
        records = SQLiteDatabase(db).records(t.workload_key, str(t.target))
        assert result.trials == 12 and len({r.steps_hash for r in records}) == 12
        assert not [r.result.error_msg for r in records if r.result.error_kind == ErrorKind.UNKNOWN]
        if runner.resubmitted:
            break
    assert runner.resubmitted >= 1 and runner.measured_on[a.node_id] >= 6
