"""`tensorgen hw`: show what search and cost models will assume about this machine, and measure its roofline."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from tensorgen.cli.args import examples, output_file_or_stdout, write_json
from tensorgen.errors import TensorgenError
from tensorgen.hardware import cache_path, local_hardware
from tensorgen.target import GPU_FIELDS, HardwareParams


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the `hw` subcommand to an argparse subparsers object; the handler is stored as `fn`."""
    p = subparsers.add_parser("hw", help="show detected hardware parameters; --measure peak FLOP/s and bandwidth",
                              epilog=examples("tensorgen hw", "tensorgen hw --measure     # on a quiet machine; cached",
                                              "tensorgen hw --set cores=1 l2_bytes=1M --json -"))
    p.add_argument("--measure", action="store_true",
                   help="run the FP32-peak and memory-bandwidth micro-benchmarks (~1 s; best on an otherwise idle "
                        "machine) and cache the results per machine")
    p.add_argument("--json", type=output_file_or_stdout, metavar="FILE",
                   help="write the parameters as JSON to FILE ('-' for stdout)")
    p.add_argument("--set", metavar="KEY=VALUE", nargs="+", action="extend", default=[], dest="overrides",
                   help="override a parameter for this run, e.g. --set cores=1 l2_bytes=1M peak_gflops=150")
    p.set_defaults(fn=run)
    return p


def parse_overrides(items: list[str]) -> dict[str, str]:
    """['cores=1', 'l2_bytes=1M'] -> {'cores': '1', 'l2_bytes': '1M'}; values are checked by local_hardware."""
    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise TensorgenError(f"--set {item!r}: expected KEY=VALUE, e.g. cores=2")
        out[key.strip()] = value.strip()
    return out


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def format_table(hw: HardwareParams, overridden: frozenset[str] = frozenset()) -> str:
    """The params as an aligned `name  value unit` table, field names as `--set` spells them."""
    missing = "not measured (run: tensorgen hw --measure)"
    rows = [
        ("cores", str(hw.cores)),
        ("simd_bytes", f"{_bytes(hw.simd_bytes)}  ({hw.simd_bytes // 4} x fp32)"),
        ("cache_line_bytes", _bytes(hw.cache_line_bytes)),
        ("l1_bytes", _bytes(hw.l1_bytes) + "  (L1d, per core)"),
        ("l2_bytes", _bytes(hw.l2_bytes) + "  (per core)"),
        ("l3_bytes", _bytes(hw.l3_bytes) + "  (per instance)"),
        ("peak_gflops", f"{hw.peak_gflops:.1f} GFLOP/s  (FP32, all cores)" if hw.peak_gflops else missing),
        ("bandwidth_gbs", f"{hw.bandwidth_gbs:.1f} GB/s  (STREAM triad)" if hw.bandwidth_gbs else missing),
    ]
    if hw.sm_count:
        rows += [(name, str(getattr(hw, name))) for name in GPU_FIELDS]
    width = max(len(name) for name, _ in rows)
    lines = [f"# {hw.extra.get('model', 'unknown cpu')}   (cache: {cache_path()})"]
    lines += [f"{name:<{width}}  {value}{'  [--set]' if name in overridden else ''}" for name, value in rows]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Handler of `tensorgen hw`: detect (and maybe measure), print the table, optionally write JSON."""
    overrides = parse_overrides(args.overrides)
    progress = (lambda msg: print(msg, file=sys.stderr, flush=True)) if args.measure else None
    hw = local_hardware(measure=args.measure, overrides=overrides, progress=progress)
    print(format_table(hw, frozenset(overrides)), file=sys.stderr if args.json == "-" else sys.stdout)
    if args.json == "-":
        sys.stdout.write(json.dumps(hw.to_dict(), indent=2) + "\n")
    elif args.json:
        write_json(args.json, hw.to_dict())
    return 0
