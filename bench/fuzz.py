"""Fuzz tensorgen for N minutes: random ONNX models tuned, built and compared with ONNX Runtime (default), or
random schedules on random DAGs compared with the NumPy interpreter (`--schedules`).

    python bench/fuzz.py --minutes 10 [--seed 0] [--trials 4] [--out fuzz_out/]
    python bench/fuzz.py --schedules --minutes 5 [--seed 0] [--out fuzz_out/]

Each graph case runs in its own process (a crash or a hang of a compiled model is a failure, not the end
of the run), with the policies of tests/fuzz_graph_check.POLICIES in turn. Every failure is saved under
--out as a reproducer: DIR/graph-<seed>-<policy>/model.onnx, failure.json (seed, policy, stage, the known
bug it matches if any) and error.txt (traceback or mismatch); a schedule failure as
DIR/schedule-<seed>/failure.json with the DAG and steps. Exits 1 if anything failed.
Re-run one case with `python bench/fuzz.py --case SEED --policy NAME`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the fuzzers live with the tests

import numpy as np  # noqa: E402
from fuzz_graph_check import POLICIES, Failure, check_model, known_bug, validate  # noqa: E402
from fuzz_graphs import random_model  # noqa: E402
from fuzz_schedules import check_schedule  # noqa: E402

CASE_TIMEOUT_S = 600


def run_case(seed: int, policy: str, trials: int, workdir: Path, out: Path | None) -> Failure | None:
    """One graph case in this process; saves the reproducer under `out` if it fails."""
    model = random_model(np.random.default_rng(seed))
    try:
        reference = validate(model)
    except Exception as err:  # the generator wrote an invalid model: its bug, reported like any other
        failure = Failure(seed, policy, "generate", f"{type(err).__name__}: {err}")
    else:
        failure = check_model(model, seed, policy, trials, workdir, reference)
    if failure is not None and out is not None:
        save(failure, out, model)
    return failure


def save(failure: Failure, out: Path, model=None) -> Path:
    import onnx

    directory = out / f"graph-{failure.seed}-{failure.policy}"
    directory.mkdir(parents=True, exist_ok=True)
    if model is not None:
        onnx.save(model, directory / "model.onnx")
    (directory / "error.txt").write_text(failure.error)
    if failure.records:  # the programs themselves (a search's candidates need not come again)
        (directory / "records.jsonl").write_text("".join(line + "\n" for line in failure.records))
    info = {"seed": failure.seed, "policy": failure.policy, "stage": failure.stage, "known_bug": known_bug(failure),
            "headline": failure.headline(),
            "reproduce": f"python bench/fuzz.py --case {failure.seed} --policy {failure.policy}"}
    (directory / "failure.json").write_text(json.dumps(info, indent=1))
    return directory


def isolated_case(seed: int, policy: str, trials: int, out: Path) -> Failure | None:
    """run_case in a child process: a crash or a hang is a failure of that case."""
    with tempfile.TemporaryDirectory(prefix="tg-fuzz-") as tmp:
        cmd = [sys.executable, __file__, "--case", str(seed), "--policy", policy, "--trials", str(trials),
               "--out", str(out), "--workdir", tmp]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=CASE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            failure = Failure(seed, policy, "hang", f"the case ran over {CASE_TIMEOUT_S} s")
            save(failure, out, random_model(np.random.default_rng(seed)))
            return failure
    if proc.returncode == 0:
        return None
    saved = out / f"graph-{seed}-{policy}" / "failure.json"
    if saved.exists():
        info = json.loads(saved.read_text())
        return Failure(seed, policy, info["stage"], (saved.parent / "error.txt").read_text())
    failure = Failure(seed, policy, "crash", f"exit code {proc.returncode}\n{proc.stderr[-4000:]}")
    save(failure, out, random_model(np.random.default_rng(seed)))
    return failure


def fuzz_graphs(args: argparse.Namespace) -> list[Failure]:
    policies = list(POLICIES)
    deadline = time.monotonic() + args.minutes * 60
    failures, tried, seed = [], 0, args.seed
    while time.monotonic() < deadline:
        policy = policies[seed % len(policies)]
        t0 = time.monotonic()
        failure = isolated_case(seed, policy, args.trials, args.out)
        tried += 1
        status = "ok" if failure is None else f"FAIL {failure.stage}"
        known = known_bug(failure) if failure else None
        print(f"graph seed {seed:5d} {policy:9s} {status}{f' (known: {known})' if known else ''} "
              f"{time.monotonic() - t0:.1f}s", flush=True)
        if failure is not None:
            failures.append(failure)
        seed += 1
    print(f"\n{tried} graphs, {tried - len(failures)} passed, {len(failures)} failed")
    return failures


def fuzz_schedules(args: argparse.Namespace) -> list[Failure]:
    deadline = time.monotonic() + args.minutes * 60
    failures, tried, rejected, refused, seed = [], 0, 0, 0, args.seed
    while time.monotonic() < deadline:
        outcome = check_schedule(seed)
        tried += 1
        rejected += outcome.rejected
        refused += outcome.refused
        if outcome.failure is not None:
            failures.append(Failure(seed, "schedule", outcome.stage, outcome.failure))
            directory = args.out / f"schedule-{seed}"
            directory.mkdir(parents=True, exist_ok=True)
            (directory / "failure.json").write_text(json.dumps(outcome.to_dict(), indent=1))
            print(f"schedule seed {seed}: FAIL {outcome.stage}: {outcome.failure.strip().splitlines()[-1][:200]}",
                  flush=True)
        seed += 1
    print(f"\n{tried} schedules, {rejected} steps rejected with ScheduleError, {refused} programs refused whole, "
          f"{tried - len(failures)} passed, {len(failures)} failed")
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=0, help="first seed (then seed+1, ...)")
    parser.add_argument("--trials", type=int, default=4, help="tuning trials per graph")
    parser.add_argument("--out", type=Path, default=Path("fuzz_out"), help="where failures are saved")
    parser.add_argument("--schedules", action="store_true", help="fuzz schedules instead of graphs")
    parser.add_argument("--case", type=int, help="run one graph case (this seed) in this process")
    parser.add_argument("--policy", choices=list(POLICIES), default="ansor", help="with --case")
    parser.add_argument("--workdir", type=Path, help="with --case: where it tunes and builds (default: a temp dir)")
    args = parser.parse_args(argv)
    if args.minutes <= 0 or args.trials < 0:
        parser.error("--minutes must be positive and --trials non-negative")
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    if args.case is not None:
        with tempfile.TemporaryDirectory(prefix="tg-fuzz-") as tmp:
            failure = run_case(args.case, args.policy, args.trials, args.workdir or Path(tmp), args.out)
        if failure is not None:
            print(failure.error, file=sys.stderr)
            print(failure.headline())
        return 1 if failure else 0
    failures = fuzz_schedules(args) if args.schedules else fuzz_graphs(args)
    for f in failures:
        known = known_bug(f)
        print(f"  {f.headline()}" + (f"  [known: {known}]" if known else ""))
    if failures:
        print(f"reproducers in {args.out}/")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
