"""Pruner's headline on this machine (Pruner §3.3, Fig. 10): the search time Pruner needs to reach the latency Ansor
reaches with its whole budget, on whole networks.

    python bench/pruner_networks.py --models resnet50,mobilenet_v2 --trials 2000 [--pretrained model.pt] \\
                                    [--variants ansor,ansor@8,pruner@8,pruner-mtl@8] [--dbs pruner_networks] \\
                                    [--seeds 0,1,2] [--target "cpu -mcpu=haswell"] [--full] [--json F]

Variants, each from an empty database `<dbs>_<model>_<variant>_s<seed>.db` (the model's name, or its file's stem):

    ansor       Ansor: sketch policy, XGBoost learned online (the reference: the first variant named)
    pruner      Pruner without transfer: draft-then-verify (policy "pruner"), PaCM learned online
    pruner-mtl  Pruner: draft-then-verify, PaCM pretrained (`--pretrained`, tensorgen costmodel train) with
                momentum transfer; pruner-mtl:pretrained=FILE starts from FILE instead (two pretrained models
                side by side)
    NAME@N      the variant with a warm-up round of N programs per task (SchedulerConfig.warmup_trials; without
                @N every round has --round-trials)
    NAME:K=V    the variant with its policy's knob K set to V (any number of :K=V, after @N if any; e.g.
                pruner@8:draft_population=512 — the knobs of PrunerPolicy.from_options / SketchPolicy.of);
                :pacm.K=V sets the PaCM cost model's K (costmodel.pacm.PaCMConfig; e.g.
                pruner-mtl@8:pacm.transfer_lr=1e-4), :sched.K=V the task scheduler's (SchedulerConfig, e.g.
                pruner-mtl@8:sched.backward_window=1)

The variants of a network run interleaved, in one run: each in its own process, taking turns round by round, so that
all of them measure in the same minutes of this machine (whose speed drifts by up to 25% within minutes on some
days). Each variant's clock counts only its own turns. Its curve is the task scheduler's estimated end-to-end
latency (sum of each task's best measured latency times its weight) against that clock. The reference runs its whole
budget of --trials; another variant's budget is time, not trials: it sits out its turns while its estimate is at or
below the reference's current one (it is ahead), and ends once it reaches the reference's final estimate or has used
the reference's whole time (a search that measures faster may measure more programs in that time; at most
OTHERS_TRIALS times --trials). `--full`: every variant runs --trials. The figures: the reference's final estimate
and time; for every other variant the first time its estimate is at or below the reference's final one (and the
ratio of the reference's time to it), its final estimate, and the tasks whose weighted best latency at its end is
furthest above the reference's final one, with the trials each spent (where a run that misses loses). With several
--seeds the whole comparison runs once per seed (every variant with that seed) and each variant's median ratio over
the seeds is reported too (a run that never reaches the reference's final counts as slower than any that does): one
run's ratio is one sample of a wide distribution. Time the compiled models next to ONNX Runtime with
bench/networks.py --trials 0 --db <the database>.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import multiprocessing
import re
import sys
import time
import traceback
from dataclasses import asdict, dataclass, fields
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import thread_env  # noqa: E402, F401  (first: the thread counts of NumPy and torch)

# isort: split

import numpy as np  # noqa: E402

from tensorgen.costmodel.pacm import PaCM, PaCMConfig  # noqa: E402
from tensorgen.errors import TensorgenError  # noqa: E402
from tensorgen.graph.backend.tasks import extract_tasks  # noqa: E402
from tensorgen.graph.load import load_graph  # noqa: E402
from tensorgen.target import Target  # noqa: E402
from tensorgen.tuning.progress import SchedulerProgress, StopTuning, TaskRow  # noqa: E402
from tensorgen.tuning.scheduler import SchedulerConfig, TaskScheduler  # noqa: E402

OTHERS_TRIALS = 4  # the other variants' budget in trials, as a multiple of the reference's (theirs is its time)
POLICIES = {"ansor": ("ansor", "xgb"), "pruner": ("pruner", "pacm"), "pruner-mtl": ("pruner", "pacm:{pretrained}")}


@dataclass(frozen=True)
class Variant:
    """One way to tune: a policy, its cost model and the scheduler's warm-up round (None: a whole round)."""
    name: str
    policy: str
    cost_model: str
    warmup_trials: int | None = None
    options: tuple[tuple[str, Any], ...] = ()  # the policy's knobs (tune's policy_options)
    pacm: tuple[tuple[str, Any], ...] = ()  # the PaCM cost model's knobs (PaCMConfig)
    sched: tuple[tuple[str, Any], ...] = ()  # the task scheduler's knobs (SchedulerConfig)

    def make_cost_model(self, seed: int) -> str | PaCM:
        """The cost model as tune takes it: its name, or a PaCM made with this variant's knobs."""
        if not self.pacm:
            return self.cost_model
        _, _, path = self.cost_model.partition(":")
        return PaCM(seed=seed, path=path or None, config=PaCMConfig(**dict(self.pacm)))


def _knob(text: str, variant: str) -> tuple[str, str, Any]:
    """[pacm.|sched.]K=V of a variant as (prefix, K, V): V as a Python literal (512, 0.5, None), else as its text."""
    key, eq, value = text.partition("=")
    prefix, _, name = key.rpartition(".")
    if not (prefix in ("", "pacm", "sched") and name.isidentifier() and eq and value):
        raise SystemExit(f"--variants: {variant!r}: expected :[pacm.|sched.]KNOB=VALUE, got {text!r}")
    try:
        return prefix, name, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return prefix, name, value


def parse_variant(text: str, pretrained: str | None) -> Variant:
    """NAME, NAME@N, each with any :K=V (see the module's docstring)."""
    head, *knobs = text.split(":")
    base, _, warmup = head.partition("@")
    if base not in POLICIES or (warmup and not (warmup.isdigit() and int(warmup) > 0)):
        raise SystemExit(f"--variants: unknown variant {text!r}; use any of {', '.join(POLICIES)}, each optionally "
                         f"with @N (a warm-up round of N > 0 programs per task) and :KNOB=VALUE")
    policy, cost_model = POLICIES[base]
    own = [k.partition("=")[2] for k in knobs if k.startswith("pretrained=")]  # a file name, as written
    if own and not ("{pretrained}" in cost_model and own[-1]):
        raise SystemExit(f"--variants: {text!r}: pretrained=FILE needs a pretrained variant (pruner-mtl) and a file")
    pretrained = own[-1] if own else pretrained
    groups: dict[str, list[tuple[str, Any]]] = {"": [], "pacm": [], "sched": []}  # policy, PaCM, scheduler knobs
    for prefix, name, value in (_knob(k, text) for k in knobs if not k.startswith("pretrained=")):
        groups[prefix].append((name, value))
    if groups["pacm"] and not cost_model.startswith("pacm"):
        raise SystemExit(f"--variants: {text!r}: pacm.KNOB needs a variant whose cost model is PaCM")
    for prefix, config in (("pacm", PaCMConfig), ("sched", SchedulerConfig)):
        unknown = sorted({k for k, _ in groups[prefix]} - {f.name for f in fields(config)})
        if unknown:
            raise SystemExit(f"--variants: {text!r}: {config.__name__} has no knob {unknown[0]!r}")
    if "{pretrained}" in cost_model:
        if pretrained is None:
            raise SystemExit(f"variant {text} needs --pretrained MODEL.pt (tensorgen costmodel train)")
        cost_model = cost_model.format(pretrained=pretrained)
    return Variant(text, policy, cost_model, int(warmup) if warmup else None, tuple(groups[""]),
                   tuple(groups["pacm"]), tuple(groups["sched"]))


class Turn:
    """A variant's side of the turn-taking, in its own process: it runs only between a "go" of the coordinator and
    the end of its next round; `own_s` is the wall clock of its turns."""

    def __init__(self, conn: Connection) -> None:
        self.conn, self.own_s, self.since = conn, 0.0, time.perf_counter()

    def wait(self) -> None:
        """Until the coordinator says go (StopTuning if it says stop); the clock runs again from here."""
        move = self.conn.recv()
        self.since = time.perf_counter()
        if move == "stop":
            raise StopTuning

    def clock(self) -> float:
        return self.own_s + time.perf_counter() - self.since

    def hand_over(self, trials: int, estimate_ms: float | None) -> None:
        """End of a round: report it, give the machine back and wait for the next turn."""
        self.own_s = self.clock()
        self.conn.send(("round", self.own_s, trials, estimate_ms))
        self.wait()


def run_variant(model: str, variant: Variant, trials: int, db: str, seed: int, round_trials: int, target: str,
                turn: Turn) -> dict[str, Any]:
    """Tune `model` for `target` from an empty `db` with one variant, a round per turn."""
    graph = load_graph(model)
    curve: list[tuple[float, int, float]] = []
    last_rows: list[TaskRow] = []  # the tasks at the last round

    def record(p: SchedulerProgress) -> None:
        if p.phase != "round":
            return
        last_rows[:] = p.rows
        latency = p.models.get(graph.name)
        if latency is not None:
            curve.append((round(turn.clock(), 2), p.trials_done, latency * 1e3))
            if len(curve) % 10 == 0:
                print(f"  {variant.name} {model}: {p.trials_done}/{p.trials} trials, {turn.clock():.0f} s, "
                      f"estimate {latency * 1e3:.3f} ms", flush=True)
        turn.hand_over(p.trials_done, curve[-1][2] if latency is not None else None)

    config = SchedulerConfig(**{"round_trials": round_trials, "warmup_trials": variant.warmup_trials,
                                **dict(variant.sched)})
    scheduler = TaskScheduler.from_models({graph.name: extract_tasks(graph, target)}, seed=seed, callbacks=[record],
                                          config=config)
    result = scheduler.tune(trials, db=db, policy=variant.policy, cost_model=variant.make_cost_model(seed),
                            policy_options=dict(variant.options) or None, progress=False)  # its own lines
    return asdict(variant) | {"db": db, "trials": result.trials, "round_trials": round_trials,
                              "stopped": result.stopped, "wall_s": turn.clock(), "search_s": result.search_s,
                              "build_s": result.build_s, "run_s": result.run_s,
                              "final_ms": curve[-1][2] if curve else None, "curve": curve,
                              "tasks": [{"index": r.index, "desc": r.desc, "weight": r.weight, "trials": r.trials,
                                         "ms": r.latency * 1e3 if math.isfinite(r.latency) else None}
                                        for r in last_rows]}


def play(conn: Connection, *args: Any) -> None:
    """A variant's process: run_variant(*args) in turns; the last message is ("done", run) or ("error", text)."""
    turn = Turn(conn)
    try:
        turn.wait()
        conn.send(("done", run_variant(*args, turn=turn)))
    except TensorgenError as e:  # bad input (a knob the policy lacks, a model it cannot load): one line
        conn.send(("error", str(e)))
    except BaseException:  # noqa: BLE001 - the coordinator reports it and stops the others
        conn.send(("error", traceback.format_exc()))


class VariantFailed(Exception):
    """A variant's process stopped with an error (its text: one line for bad input, else the traceback)."""


@dataclass
class Player:
    """The coordinator's view of one variant's process."""
    conn: Connection
    own_s: float = 0.0
    estimate_ms: float | None = None
    run: dict[str, Any] | None = None


def next_move(name: str, players: dict[str, Player], reference: str, full: bool) -> str | None:
    """What the coordinator tells `name` at its turn: "go", "stop" or None (sit this turn out)."""
    me, ref = players[name], players[reference]
    if name == reference or full:
        return "go"
    if ref.run is None:  # the reference still runs: sit out while ahead of it
        ahead = me.estimate_ms is not None and ref.estimate_ms is not None and me.estimate_ms <= ref.estimate_ms
        return None if ahead else "go"
    final = ref.run["final_ms"]
    reached = final is not None and me.estimate_ms is not None and me.estimate_ms <= final
    return "stop" if reached or me.own_s >= ref.run["wall_s"] else "go"


def coordinate(players: dict[str, Player], reference: str, full: bool) -> dict[str, dict[str, Any]]:
    """Give the players turns, in order, until every one has finished; their runs by name."""
    while any(p.run is None for p in players.values()):
        for name, player in players.items():
            if player.run is not None or (move := next_move(name, players, reference, full)) is None:
                continue
            player.conn.send(move)
            kind, *payload = player.conn.recv()
            if kind == "error":
                raise VariantFailed(f"variant {name} failed: {payload[0]}")
            if kind == "done":
                player.run = payload[0]
            else:
                player.own_s, _, player.estimate_ms = payload
    return {name: p.run for name, p in players.items()}


def variant_db(prefix: str, model: str, variant: str, seed: int) -> str:
    """The database of one variant's run: `<prefix>_<model>_<variant>_s<seed>.db`, the variant's name with every
    character a file name should not have (a path's /: pretrained=DIR/FILE) as _."""
    safe = re.sub(r"[^\w@:=.,+-]", "_", variant)
    return f"{prefix}_{Path(model).stem}_{safe}_s{seed}.db"


def tune_interleaved(model: str, variants: list[Variant], seed: int,
                     args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Every variant of `model` in its own process, in turns, with `seed`; the first is the reference."""
    ctx = multiprocessing.get_context("spawn")
    players, procs = {}, []
    for v in variants:
        trials = args.trials if v is variants[0] or args.full else OTHERS_TRIALS * args.trials
        ours, theirs = ctx.Pipe()
        proc = ctx.Process(target=play, name=f"{model}-{v.name}",
                           args=(theirs, model, v, trials, variant_db(args.dbs, model, v.name, seed),
                                 seed, args.round_trials, args.target))
        proc.start()
        players[v.name] = Player(ours)
        procs.append(proc)
    try:
        return coordinate(players, variants[0].name, args.full)
    except BaseException:
        for proc in procs:
            proc.kill()
        raise
    finally:
        for proc in procs:
            proc.join()


def time_to_reach(curve: list, target_ms: float) -> tuple[float, int] | None:
    """(seconds, trials) at the first point of `curve` at or below `target_ms`; None if it never gets there."""
    return next(((t, n) for t, n, ms in curve if ms <= target_ms), None)


def summarize(runs: dict[str, dict[str, Any]], reference: str) -> dict[str, dict[str, Any]]:
    """Per variant: its final estimate, own time, and when it reached the reference's final estimate."""
    base = runs[reference]
    rows = {}
    for name, run in runs.items():
        reach = time_to_reach(run["curve"], base["final_ms"]) if base["final_ms"] is not None else None
        rows[name] = {"final_ms": run["final_ms"], "wall_s": run["wall_s"], "trials": run["trials"],
                      "reaches_reference_final_at_s": reach[0] if reach else None,
                      "reaches_reference_final_at_trials": reach[1] if reach else None,
                      "time_ratio": reach[0] / base["wall_s"] if reach else None,
                      "first_estimate": run["curve"][0] if run["curve"] else None,  # (s, trials, ms): warmed up
                      **{k: run[k] for k in ("search_s", "build_s", "run_s")}}
    return rows


def print_rows(title: str, rows: dict[str, dict[str, Any]], reference: str) -> None:
    """One line per variant of a summary (summarize)."""
    for name, row in rows.items():
        final = f"{row['final_ms']:.3f} ms" if row["final_ms"] is not None else "- (a task has no program yet)"
        at = row["reaches_reference_final_at_s"]
        reach = "never" if at is None else (f"at {at:.0f} s ({row['reaches_reference_final_at_trials']} trials, "
                                            f"{row['time_ratio']:.2f}x its time)")
        first = row["first_estimate"]
        warm = f"first estimate {first[2]:.3f} ms at {first[0]:.0f} s ({first[1]} trials); " if first else ""
        print(f"{title} {name}: final {final} in {row['wall_s']:.0f} s, {row['trials']} trials; reaches {reference}'s "
              f"final {reach}; {warm}search {row['search_s']:.0f} s, build {row['build_s']:.0f} s, "
              f"run {row['run_s']:.0f} s", flush=True)


def task_gaps(runs: dict[str, dict[str, Any]], reference: str, top: int = 5) -> dict[str, list[dict[str, Any]]]:
    """Per other variant, the `top` tasks whose weighted best latency at its end exceeds the reference's final one
    most (weight x ms above the reference's; the trials each spent): where a variant that misses loses its time."""
    base = {t["index"]: t for t in runs[reference]["tasks"]}
    out = {}
    for name, run in runs.items():
        if name == reference:
            continue
        gaps = []
        for t in run["tasks"]:
            ref = base.get(t["index"])
            if ref is None or t["ms"] is None or ref["ms"] is None:
                continue
            gaps.append({**t, "gap_ms": t["weight"] * (t["ms"] - ref["ms"]), "reference_ms": ref["ms"],
                         "reference_trials": ref["trials"]})
        out[name] = sorted(gaps, key=lambda g: -g["gap_ms"])[:top]
    return out


def print_gaps(title: str, gaps: dict[str, list[dict[str, Any]]], reference: str) -> None:
    """The tasks of task_gaps, one line per variant."""
    for name, rows in gaps.items():
        cells = "; ".join(f"#{g['index']} {g['desc']} x{g['weight']:g} {g['gap_ms']:+.3f} ms ({g['trials']} vs "
                          f"{g['reference_trials']} trials)" for g in rows)
        print(f"{title} {name}: tasks furthest above {reference}'s at the end: {cells or '-'}", flush=True)


def median_ratios(summaries: list[dict[str, dict[str, Any]]]) -> dict[str, float | None]:
    """Each variant's median time ratio over the seeds' summaries; None where the median run never reached the
    reference's final."""
    out = {}
    for name in summaries[0]:
        ratios = [math.inf if s[name]["time_ratio"] is None else s[name]["time_ratio"] for s in summaries]
        median = float(np.median(ratios))
        out[name] = median if math.isfinite(median) else None
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="resnet50,mobilenet_v2")
    p.add_argument("--trials", type=int, default=2000)
    p.add_argument("--variants", default="ansor,pruner,pruner-mtl",
                   help="comma-separated, the reference first (see above)")
    p.add_argument("--pretrained", default=None, help="a PaCM file (tensorgen costmodel train) for pruner-mtl")
    p.add_argument("--dbs", default="pruner_networks", help="prefix of the databases")
    p.add_argument("--seeds", default="0", help="comma-separated: one whole comparison per seed")
    p.add_argument("--round-trials", type=int, default=32,
                   help="programs per task round (default 32: MobileNet-V2's 33 tasks take 1056 trials to have an "
                        "estimate; the scheduler's 64 would take 2112)")
    p.add_argument("--target", default="cpu",
                   help='the target of every variant ("cpu -mcpu=haswell": AVX2 programs on an AVX-512 machine)')
    p.add_argument("--full", action="store_true", help="run every variant to the whole budget")
    p.add_argument("--json", default=None)
    p.add_argument("--threads", default="2", help="(read by thread_env)")
    args = p.parse_args(argv)
    variants = [parse_variant(v, args.pretrained) for v in args.variants.split(",")]
    try:
        seeds = [int(x) for x in args.seeds.split(",")]
    except ValueError:
        raise SystemExit(f"--seeds: expected comma-separated integers, got {args.seeds!r}") from None
    if len(variants) < 2 or len({v.name for v in variants}) < len(variants):
        raise SystemExit("--variants: name a reference and at least one other variant, each once")
    try:
        args.target = str(Target.parse(args.target))
    except TensorgenError as err:
        raise SystemExit(f"--target: {err}") from None
    report: dict[str, Any] = {"trials": args.trials, "round_trials": args.round_trials, "target": args.target,
                              "protocol": "interleaved", "reference": variants[0].name, "models": {}}
    for model in args.models.split(","):
        per_seed = {}
        for seed in seeds:
            try:
                runs = tune_interleaved(model, variants, seed, args)
            except VariantFailed as e:
                raise SystemExit(f"{model}: {e}") from None
            rows = summarize(runs, variants[0].name)
            gaps = task_gaps(runs, variants[0].name)
            print_rows(f"{model} seed {seed}", rows, variants[0].name)
            print_gaps(f"{model} seed {seed}", gaps, variants[0].name)
            per_seed[str(seed)] = {"summary": rows, "task_gaps": gaps, "runs": runs}
        medians = median_ratios([r["summary"] for r in per_seed.values()])
        for name, ratio in medians.items():
            print(f"{model} {name}: median time ratio over {len(seeds)} seed(s) "
                  f"{'never' if ratio is None else f'{ratio:.2f}x'}", flush=True)
        report["models"][model] = {"seeds": per_seed, "median_time_ratio": medians}
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
