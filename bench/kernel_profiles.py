"""Two or more builds of one model, kernel by kernel: each database's build profiled inside the model, the builds
taking turns, beside what each kernel's schedule measured when it was tuned.

    python bench/kernel_profiles.py --model resnet50 --db ansor.db --db pruner.db [--rounds 8] [--repeat 20]
                                    [--threads 2] [--json FILE]

The first --db is the reference. Each round profiles every build once (CompiledModel.profile: each kernel's median
over --repeat runs of the whole model), in an order that alternates round by round, so that all builds see the same
minutes of a machine whose speed drifts. A build's time in a round is the sum of its kernels' medians; the figures
are each build's median over the rounds and its per-round ratio to the reference (median, min, max): on a shared
machine whose whole-model timings disagree from round to round (bench/networks.py marks them UNRELIABLE), the ratio
of builds profiled side by side is the steadier comparison. Every build's outputs are checked against the
reference's first (graph.reference.compare.OUTPUT_RTOL). The kernels whose in-model time differs most from the
reference's follow (kernels match by name: the same model partitioned the same way), with their tuned costs: a
kernel much slower in the model than tuned against its peer was picked on a measurement the model does not repeat.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import thread_env  # noqa: E402, F401  (first: the thread counts of NumPy and torch)

# isort: split

import numpy as np  # noqa: E402

from tensorgen.errors import TensorgenError  # noqa: E402
from tensorgen.graph.backend.build import build_model  # noqa: E402
from tensorgen.graph.frontend.onnx_inputs import random_inputs  # noqa: E402
from tensorgen.graph.load import load_graph, onnx_model_of  # noqa: E402
from tensorgen.graph.reference.compare import OUTPUT_RTOL, output_error  # noqa: E402
from tensorgen.records.database import SQLiteDatabase  # noqa: E402
from tensorgen.runtime.model import CompiledModel  # noqa: E402


def profile_builds(builds: dict[str, CompiledModel], inputs: list[np.ndarray], rounds: int,
                   repeat: int) -> dict[str, list[list[dict]]]:
    """Per build, its profile in each round; the builds take turns, in reversed order every other round."""
    names = list(builds)
    out: dict[str, list[list[dict]]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            out[name].append(builds[name].profile(inputs, repeat=repeat))
    return out


def summarize(profiles: dict[str, list[list[dict]]], reference: str, top: int = 8) -> dict[str, Any]:
    """Each build's median total, its per-round ratios to the reference, and the kernels that differ most."""
    totals = {name: [sum(k["ms"] for k in p) for p in rounds] for name, rounds in profiles.items()}
    builds = {}
    for name, rounds in profiles.items():
        ratios = [t / ref for t, ref in zip(totals[name], totals[reference])]
        builds[name] = {"median_ms": float(np.median(totals[name])), "rounds_ms": totals[name],
                        "tuned_ms": sum(k["tuned_ms"] or 0.0 for k in rounds[0]),
                        "ratio": float(np.median(ratios)), "ratio_min": min(ratios), "ratio_max": max(ratios)}
    kernels = {}
    base = _kernel_medians(profiles[reference])
    for name, rounds in profiles.items():
        if name == reference:
            continue
        mine = _kernel_medians(rounds)
        rows = [{"kernel": k, "ms": ms, "tuned_ms": tuned, "reference_ms": base[k][0], "reference_tuned_ms": base[k][1]}
                for k, (ms, tuned) in mine.items() if k in base]
        rows.sort(key=lambda row: -abs(row["ms"] - row["reference_ms"]))
        kernels[name] = rows[:top]
    return {"reference": reference, "builds": builds, "kernels": kernels}


def _kernel_medians(rounds: list[list[dict]]) -> dict[str, tuple[float, float | None]]:
    """Kernel name -> (median in-model ms over the rounds, tuned ms)."""
    ms = np.median([[k["ms"] for k in p] for p in rounds], axis=0)
    return {k["kernel"]: (float(m), k["tuned_ms"]) for k, m in zip(rounds[0], ms)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="zoo name or ONNX file")
    p.add_argument("--db", action="append", required=True, help="a tuning database (repeat; the first: reference)")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--repeat", type=int, default=20, help="whole-model runs per profile")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args(argv)
    if len(args.db) < 2 or len(set(args.db)) != len(args.db) or args.rounds < 1 or args.repeat < 1:
        raise SystemExit("need two or more distinct --db, --rounds >= 1 and --repeat >= 1")
    for path in args.db:
        if not Path(path).is_file():
            raise SystemExit(f"no database at {path}")
    try:
        onnx_model = onnx_model_of(args.model)
        graph = load_graph(onnx_model)
    except TensorgenError as e:  # an unknown model: one line, not a traceback
        raise SystemExit(f"error: {e}") from None
    feeds = random_inputs(onnx_model, 0, None)
    inputs = [feeds[name] for name in graph.inputs]
    with tempfile.TemporaryDirectory() as tmp:
        builds: dict[str, CompiledModel] = {}
        for i, path in enumerate(args.db):
            with SQLiteDatabase(path, readonly=True) as db:
                directory = build_model(graph, Path(tmp) / str(i), db=db)
            builds[path] = CompiledModel(directory, threads=args.threads)
        reference = builds[args.db[0]].run(inputs)
        for path, build in builds.items():
            _, rel = output_error(build.run(inputs), reference)
            if rel > OUTPUT_RTOL:
                raise SystemExit(f"{path}: the build's outputs differ from {args.db[0]}'s by {rel:.3g} of their "
                                 f"largest value (tolerance {OUTPUT_RTOL:g})")
        report = summarize(profile_builds(builds, inputs, args.rounds, args.repeat), args.db[0])
    for path, b in report["builds"].items():
        print(f"{path}: {b['median_ms']:.3f} ms in the model (tuned {b['tuned_ms']:.3f} ms); "
              f"{b['ratio']:.3f}x the reference (rounds {b['ratio_min']:.3f}-{b['ratio_max']:.3f})")
    for path, rows in report["kernels"].items():
        print(f"{path}: kernels furthest from the reference's, in the model (tuned):")
        for row in rows:
            print(f"  {row['kernel']:32s} {row['ms']:.3f} ({row['tuned_ms'] or 0:.3f}) ms against "
                  f"{row['reference_ms']:.3f} ({row['reference_tuned_ms'] or 0:.3f})")
    if args.json:
        Path(args.json).write_text(json.dumps({"model": args.model, "rounds": args.rounds, "repeat": args.repeat,
                                               **report}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
