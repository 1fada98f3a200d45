"""Measure on a Ray cluster: candidates compile and run on the nodes that advertise the task's target.

A node that measures for target T joins the cluster with the custom resource `tensorgen-target:T` of 1
(`tensorgen worker --ray ADDRESS --target T`, see `node_command`). RayBuilder compiles each candidate in a Ray
task on such a node (one per CPU: a build asks for one CPU and a sliver of the target resource, so `-march=native`
means the measuring machine) and leaves the shared object in the cluster's object store. RayRunner times each
candidate in a Ray task that asks for the node's whole target resource, so a node times one candidate at a time
with its cores to itself, and nodes time in parallel; the task writes the object to a temporary file and calls
LocalRunner.measure, the local runner's own code: a harness child process with a timeout, classified errors,
the correctness check against the naive program (computed on that node).

Ray's defaults are wrong for timing, so: OMP_NUM_THREADS (Ray sets it to the task's CPUs) is set to the task's
cores and the harness sets its thread count explicitly; tasks have max_retries=0, and a candidate crashes only
its harness process, so a crashing candidate is classified, never re-run; a task lost with its node or Ray
worker is sent again `resubmit` times (to whichever node of the target Ray picks), then recorded as an UNKNOWN
error, which a resumed tuning measures again. Results come back in the order they finish (`run_each`).

`ray` is an optional dependency, imported when a cluster is first used.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from tensorgen.errors import ClusterError
from tensorgen.measure.builder import Builder, build_candidate
from tensorgen.measure.ray_probe import probe
from tensorgen.measure.runner import LocalRunner
from tensorgen.measure.types import BuildResult, ErrorKind, MeasureInput, MeasureResult
from tensorgen.target import Target
from tensorgen.task import SearchTask

RESOURCE_PREFIX = "tensorgen-target:"
BUILD_SHARE = 0.01  # of a node's target resource a build asks for (plus one CPU): it lands on a node of the target
_BUILD_GRACE = 30.0  # seconds past the builds' own timeouts before a batch's unfinished builds are cancelled


def target_resource(target: str | Target) -> str:
    """The custom resource a Ray node advertises (1 of it) to measure programs of `target`."""
    return RESOURCE_PREFIX + str(Target.parse(target))


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ClusterError("measuring on a Ray cluster needs ray: pip install tensorgen[ray]") from None
    return ray


def connect(address: str | None) -> tuple[Any, bool]:
    """The ray module, connected to the cluster at `address` (the head's HOST:PORT; ray://HOST:PORT, Ray Client,
    needs ray[client]) unless this process is connected already; and whether this call connected it."""
    ray = import_ray()
    if ray.is_initialized():
        return ray, False
    if not address:
        raise ClusterError("no Ray cluster to measure on: give its address (tensorgen tune --ray HOST:PORT, "
                           "or runner_options={'address': ...})")
    check_head(address)
    try:
        ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
    except Exception as err:  # ray raises ConnectionError, RuntimeError, ValueError, ... for a bad address
        raise ClusterError(f"cannot connect to the Ray cluster at {address!r}: {err}") from None
    return ray, True


def check_head(address: str, timeout: float = 5.0) -> None:
    """Refuse an address HOST:PORT (or ray://HOST:PORT) where no Ray head answers within `timeout` seconds:
    ray.init would retry a port where something else listens for ever (see ray_probe)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return  # "auto", or a form ray itself understands
    answer = probe(address, timeout)
    if not answer.head:
        raise ClusterError(f"{address} is not a Ray head ({answer.why}): start one with `ray start --head` and "
                           f"give the address it prints")


def disconnect(ray: Any, owned: bool) -> None:
    """Leave the cluster if `owned` (this side connected it)."""
    if ray is not None and owned and ray.is_initialized():
        ray.shutdown()


def target_nodes(ray: Any, resource: str) -> list[dict]:
    """The live nodes of the cluster that advertise `resource`."""
    return [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get(resource, 0) >= 1]


def require_target(ray: Any, target: str | Target) -> None:
    """Refuse a target that no node of the cluster measures (its tasks would wait forever)."""
    resource = target_resource(target)
    if ray.cluster_resources().get(resource, 0) < 1:
        have = sorted(k[len(RESOURCE_PREFIX):] for k in ray.cluster_resources() if k.startswith(RESOURCE_PREFIX))
        raise ClusterError(f"no node of the Ray cluster measures target {str(target)!r} (its nodes measure: "
                           f"{', '.join(map(repr, have)) or 'nothing'}); start one with "
                           f"`tensorgen worker --ray ADDRESS --target '{target}'`")


def node_command(address: str, target: str | Target, num_cpus: int | None = None) -> list[str]:
    """`ray start` joining the cluster at `address` as a node that measures `target`, until it is stopped."""
    cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", "--address", address,
           "--resources", json.dumps({target_resource(target): 1}), "--block"]
    return cmd + (["--num-cpus", str(num_cpus)] if num_cpus else [])


# ---------------------------------------------------------------------------------------------
# what runs on the nodes (Ray tasks; module-level functions, so a node imports them from tensorgen)


def build_on_node(inp: MeasureInput, timeout: float) -> tuple[BuildResult, bytes | None]:
    """Build one candidate on this node: its result and the shared object's bytes (None if it failed)."""
    br = build_candidate(inp, timeout)
    return br, Path(br.path).read_bytes() if br.path is not None and br.error_kind == ErrorKind.NONE else None


_NODE_RUNNERS: dict[tuple, LocalRunner] = {}  # one per settings in each Ray worker: its harness and references


def measure_on_node(settings: dict[str, Any], inp: MeasureInput, br: BuildResult, blob: bytes,
                    fastest: float) -> tuple[MeasureResult, str]:
    """Time one candidate on this node with LocalRunner(**settings): its result and the node's id."""
    import ray

    os.environ["OMP_NUM_THREADS"] = str(inp.task.hw.cores)  # Ray sets it to the task's CPU count (1)
    runner = _NODE_RUNNERS.get(key := tuple(sorted(settings.items())))
    if runner is None:
        runner = _NODE_RUNNERS[key] = LocalRunner(**settings, guard=None)
    runner.note_fastest(inp.task, fastest)  # the driver's fastest: it bounds the timeout and the give-up time
    with tempfile.TemporaryDirectory(prefix="tensorgen-ray-") as tmp:
        path = Path(tmp) / "candidate.so"
        path.write_bytes(blob)
        res = runner.measure(inp, replace(br, path=str(path)))
    return res, ray.get_runtime_context().get_node_id()


# ---------------------------------------------------------------------------------------------
# the driver's side


@dataclass(frozen=True)
class ShippedBuild(BuildResult):
    """A candidate RayBuilder built: `path` is on the node that built it, `blob` the shared object's bytes as a
    Ray object (what RayRunner ships to the node that times it)."""

    blob: Any = None


def plain_build(br: BuildResult) -> BuildResult:
    """`br` as a plain BuildResult (a ShippedBuild without its Ray object)."""
    return BuildResult(**build_fields(br))


def build_fields(br: BuildResult) -> dict[str, Any]:
    return {f.name: getattr(br, f.name) for f in fields(BuildResult)}


@dataclass
class RayBuilder(Builder):
    """Compiles candidates on the nodes of the cluster at `address` that advertise their target, one per CPU,
    `timeout` seconds each; returns ShippedBuilds. Without an address it uses the cluster this process is
    connected to (the ray runner connects it)."""

    address: str | None = None
    timeout: float = 15.0
    _ray: Any = field(default=None, init=False, repr=False)
    _owned: bool = field(default=False, init=False, repr=False)
    _remote: Any = field(default=None, init=False, repr=False)

    def build(self, inputs: list[MeasureInput]) -> list[BuildResult]:
        if not inputs:
            return []
        if self._ray is None:
            self._ray, self._owned = connect(self.address)
            self._remote = self._ray.remote(max_retries=0, num_cpus=1, num_returns=2)(build_on_node)
        ray = self._ray
        cpus = 0.0
        for target in {str(inp.task.target) for inp in inputs}:
            require_target(ray, target)
            cpus += sum(n["Resources"].get("CPU", 0) for n in target_nodes(ray, target_resource(target)))
        refs = [self._remote.options(resources={target_resource(inp.task.target): BUILD_SHARE}).remote(
            inp, self.timeout) for inp in inputs]
        budget = _BUILD_GRACE + self.timeout * math.ceil(len(inputs) / max(cpus, 1))
        _, late = ray.wait([meta for meta, _ in refs], num_returns=len(refs), timeout=budget)
        for ref in late:
            ray.cancel(ref, force=True)
        late_ids = set(late)
        results: list[BuildResult] = []
        for meta, blob in refs:
            if meta in late_ids:
                results.append(BuildResult(None, "", ErrorKind.COMPILE_TIMEOUT,
                                           f"the batch's builds on the Ray cluster ran past {budget:.0f}s"))
                continue
            try:
                br = ray.get(meta)
            except ray.exceptions.RayError as err:
                results.append(BuildResult(None, "", ErrorKind.UNKNOWN, f"build on the Ray cluster failed: {err}"))
                continue
            results.append(ShippedBuild(**build_fields(br),
                                        blob=blob if br.error_kind == ErrorKind.NONE else None))
        return results

    def close(self) -> None:
        disconnect(self._ray, self._owned)
        self._ray = None


@dataclass
class RayRunner(LocalRunner):
    """LocalRunner's measurement on the nodes of the Ray cluster at `address` that advertise the task's target:
    each node times one candidate at a time, several nodes in parallel. The timing settings are LocalRunner's;
    `guard` and the fastest costs stay on this side. `measured_on` counts the candidates each node (by Ray
    node id) timed, `resubmitted` the candidates sent again. A task whose target no node advertises for
    `lost_after_s` stops the run (ClusterError)."""

    address: str | None = None
    resubmit: int = 1  # times a candidate lost with its node or Ray worker is sent again
    lost_after_s: float = 60.0
    poll_s: float = 1.0
    measured_on: Counter = field(default_factory=Counter, init=False, repr=False)
    resubmitted: int = field(default=0, init=False, repr=False)  # candidates sent again after a lost task
    _ray: Any = field(default=None, init=False, repr=False)
    _owned: bool = field(default=False, init=False, repr=False)
    _remote: Any = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self._ray, self._owned = connect(self.address)
        self._remote = self._ray.remote(max_retries=0, num_cpus=0)(measure_on_node)

    def settings(self) -> dict[str, Any]:
        """The LocalRunner fields a node's runner is made with."""
        return {f.name: getattr(self, f.name) for f in fields(LocalRunner) if f.init and f.name != "guard"}

    def slowdown(self, task: SearchTask) -> float | None:
        """None: the candidates run on the cluster's nodes, and this machine's load says nothing of theirs."""
        return None

    def run(self, inputs: list[MeasureInput], build_results: list[BuildResult]) -> list[MeasureResult]:
        results: list[MeasureResult] = [None] * len(inputs)  # type: ignore[list-item]
        for i, res in self.run_each(inputs, build_results):
            results[i] = res
        return results

    def run_each(self, inputs: list[MeasureInput],
                 build_results: list[BuildResult]) -> Iterator[tuple[int, MeasureResult]]:
        self.check_inputs(inputs, build_results)
        ray = self._ray
        for target in {str(inp.task.target) for inp in inputs}:
            require_target(ray, target)
        todo, tries = [], [0] * len(inputs)
        for i, (inp, br) in enumerate(zip(inputs, build_results)):
            if br.error_kind != ErrorKind.NONE or br.path is None:
                yield i, self.observe(i, inp, self.measure(inp, br))  # a failed build passes through
            else:
                todo.append(i)
        blobs, settings = {i: self.blob(build_results[i]) for i in todo}, self.settings()
        resource = {i: target_resource(inputs[i].task.target) for i in todo}
        pending: dict[Any, int] = {}  # Ray task -> candidate
        busy: Counter = Counter()  # target resource -> candidates in flight
        starved_since: float | None = None
        nodes, nodes_at = {}, -math.inf
        try:
            while todo or pending:
                if time.monotonic() - nodes_at > self.poll_s:  # a GCS call: not for every candidate
                    nodes, nodes_at = ray.cluster_resources(), time.monotonic()  # a node advertises 1 of its target
                gone = sorted({resource[i] for i in [*todo, *pending.values()] if nodes.get(resource[i], 0) < 1})
                starved_since = (starved_since or time.monotonic()) if gone else None
                if gone and time.monotonic() - starved_since > self.lost_after_s:  # type: ignore[operator]
                    raise ClusterError(f"no node of the Ray cluster has measured target "
                                       f"{gone[0][len(RESOURCE_PREFIX):]!r} for {self.lost_after_s:.0f}s")
                waiting = []
                for i in todo:  # each free node of a target gets the next candidate of that target
                    if busy[resource[i]] >= nodes.get(resource[i], 0):
                        waiting.append(i)
                        continue
                    fastest = self._fastest.get(inputs[i].task.key, math.inf)
                    ref = self._remote.options(resources={resource[i]: 1}).remote(
                        settings, inputs[i], plain_build(build_results[i]), blobs[i], fastest)
                    pending[ref] = i
                    busy[resource[i]] += 1
                todo = waiting
                if not pending:  # every node of the target left: wait a while for one to come (back)
                    time.sleep(self.poll_s)
                    continue
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=self.poll_s)
                for ref in ready:
                    i = pending.pop(ref)
                    busy[resource[i]] -= 1
                    res = self.collect(ref, tries[i])
                    if res is None:  # lost with its node or worker: again, where the cluster says now
                        tries[i] += 1
                        self.resubmitted += 1
                        nodes_at = -math.inf
                        todo.append(i)
                        continue
                    yield i, self.observe(i, inputs[i], res)
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)

    def collect(self, ref: Any, tries: int) -> MeasureResult | None:
        """The result of a measuring task, or None if it is to be sent again."""
        ray = self._ray
        try:
            res, node = ray.get(ref)
        except ray.exceptions.RayTaskError as err:  # the node's tensorgen raised (its toolchain, ...)
            return MeasureResult((), ErrorKind.UNKNOWN, f"measuring on a Ray node raised: {err}")
        except ray.exceptions.RayError as err:  # the node or its Ray worker died
            if tries < self.resubmit:
                return None
            return MeasureResult((), ErrorKind.UNKNOWN, f"lost {tries + 1} times with the Ray node measuring it: "
                                                        f"{type(err).__name__}: {str(err).splitlines()[0]}")
        self.measured_on[node] += 1
        return res

    def blob(self, br: BuildResult) -> Any:
        """The shared object of a built candidate as a Ray object (a ShippedBuild has one already)."""
        if isinstance(br, ShippedBuild) and br.blob is not None:
            return br.blob
        return self._ray.put(Path(br.path).read_bytes())  # type: ignore[arg-type]

    def close(self) -> None:
        disconnect(self._ray, self._owned)
        self._ray = None
