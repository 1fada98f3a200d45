"""`tensorgen worker --ray ADDRESS [--target T]`: join a Ray cluster as a node that measures programs of T."""

from __future__ import annotations

import argparse
import os
import shlex

from tensorgen.cli.args import examples, local_target, positive_int


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `worker` command to a `tensorgen` argument parser's subparsers."""
    p = subparsers.add_parser("worker", help="join a Ray cluster as a node that measures one target's programs "
                                             "(for tune --ray)",
                              epilog=examples("ray start --head --port 6379 --num-cpus 0   # on the head",
                                              "tensorgen worker --ray HEAD:6379            # on each measuring machine",
                                              "tensorgen tune resnet50 --ray HEAD:6379     # anywhere"))
    p.add_argument("--ray", required=True, metavar="ADDRESS",
                   help="the Ray head node's address, HOST:PORT (what `ray start --head` prints)")
    p.add_argument("--target", type=local_target, default="cpu",
                   help="the target this machine measures (default cpu), e.g. 'cpu -mcpu=znver3 -cores=16'; the "
                        "tuner's --target must be the same string")
    p.add_argument("--num-cpus", type=positive_int, default=None,
                   help="CPUs this node offers the cluster for compiling candidates (default: all)")
    p.add_argument("--dry-run", action="store_true", help="print the `ray start` command instead of running it")
    p.set_defaults(fn=_worker)


def _worker(args: argparse.Namespace) -> int:
    from tensorgen.measure.harness import harness_executable
    from tensorgen.measure.ray import check_head, import_ray, node_command, target_resource

    cmd = node_command(args.ray, args.target, args.num_cpus)
    if args.dry_run:
        print(shlex.join(cmd))
        return 0
    import_ray()  # a clear error if ray is missing
    check_head(args.ray)  # `ray start --address` at something else retries for minutes
    harness_executable()  # compiled once here, before the first candidate arrives
    print(f"joining the Ray cluster at {args.ray} with resource {target_resource(args.target)!r}; "
          f"Ctrl-C (or SIGTERM) stops this node", flush=True)
    os.execv(cmd[0], cmd)  # `ray start --block` in this process: a signal reaches it, and it stops its node
    return 0  # not reached
