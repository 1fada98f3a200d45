"""Candidates measured per minute: the local runner vs the Ray runner with 1 and 2 worker nodes.

The same candidates (random programs of one matmul, built once on this machine) are timed by each runner with
tuning's settings (3 repeats of >= 10 ms, output checked against the naive program); the Ray nodes are a
ray.cluster_utils.Cluster on this machine, each advertising the target `cpu -cores=1` (one thread per candidate,
so two nodes on two cores do not share a core). Each runner first measures one candidate per node untimed (the
harness and the naive reference are computed once per node). The Ray runner's overhead per candidate is its time
per candidate with one node minus the local runner's.

    python bench/ray_throughput.py [--candidates 48] [--size 128] [--min-repeat-ms 10]
"""

from __future__ import annotations

import argparse
import statistics
import time

from ray.cluster_utils import Cluster

from tensorgen import te
from tensorgen.measure.builder import LocalBuilder
from tensorgen.measure.ray import RayRunner, target_resource
from tensorgen.measure.runner import LocalRunner
from tensorgen.measure.types import MeasureInput
from tensorgen.search.random_policy import RandomPolicy
from tensorgen.tuning.tune import make_task

TARGET = "cpu -cores=1"
SETTINGS = {"timeout": 10.0, "number": 1, "repeat": 3, "min_repeat_ms": 10.0, "check_correctness": True}


def matmul(n: int) -> list[te.Tensor]:
    A = te.placeholder((n, n), name="A")
    B = te.placeholder((n, n), name="B")
    k = te.reduce_axis(n, "k")
    return [A, B, te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")]


def timed(runner: LocalRunner, inputs: list, builds: list, warm: int) -> tuple[float, list]:
    runner.run(inputs[:warm], builds[:warm])
    start = time.perf_counter()
    results = runner.run(inputs[warm:], builds[warm:])
    return time.perf_counter() - start, results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--candidates", type=int, default=48)
    ap.add_argument("--size", type=int, default=128, help="the matmul's n (n x n x n)")
    ap.add_argument("--min-repeat-ms", type=float, default=10.0, help="each of 3 repeats lasts this long (default 10)")
    args = ap.parse_args()
    task = make_task(matmul(args.size), TARGET)
    states = RandomPolicy(task, seed=0).next_batch(args.candidates + 2)
    inputs = [MeasureInput(task, s) for s in states]
    with LocalBuilder(timeout=30.0) as builder:
        builds = builder.build(inputs)
    n, settings = args.candidates, {**SETTINGS, "min_repeat_ms": args.min_repeat_ms}
    rows = []
    seconds, results = timed(LocalRunner(**settings), inputs, builds, 2)
    rows.append(("local runner", seconds, results))
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    try:
        cluster.add_node(num_cpus=1, resources={target_resource(TARGET): 1})
        cluster.wait_for_nodes()
        runner = RayRunner(address=cluster.address, **settings)
        seconds, results = timed(runner, inputs, builds, 2)
        rows.append(("ray, 1 worker node", seconds, results))
        cluster.add_node(num_cpus=1, resources={target_resource(TARGET): 1})
        cluster.wait_for_nodes()
        runner.measured_on.clear()
        seconds, results = timed(runner, inputs, builds, 2)
        rows.append((f"ray, 2 worker nodes ({'/'.join(map(str, runner.measured_on.values()))} candidates)",
                     seconds, results))
        runner.close()
    finally:
        cluster.shutdown()
    local_ok = [r for r in rows[0][2] if r.ok]
    print(f"{n} candidates of matmul {args.size}^3, target {TARGET!r}, repeats of >= {args.min_repeat_ms} ms, "
          f"{len(local_ok)} ok locally")
    print("| runner | wall s | candidates/min | s/candidate | median cost vs local |")
    print("|---|---|---|---|---|")
    for name, seconds, results in rows:
        ratio = statistics.median(r.median_cost / o.median_cost for r, o in zip(results, rows[0][2]) if r.ok and o.ok)
        print(f"| {name} | {seconds:.1f} | {60 * n / seconds:.0f} | {seconds / n:.3f} | {ratio:.2f}x |")
    print(f"Ray overhead per candidate (1 node - local): {(rows[1][1] - rows[0][1]) / n * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
