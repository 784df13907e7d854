"""Launcher commands of the ``hvdk8s`` CLI."""
from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser(
        "run",
        help="run a training script on N local (or -H listed) ranks with mpirun",
        description="Launch NP ranks of a command (a .py file runs with this Python) and "
        "stream their output prefixed by rank. Fails, naming the rank, if any rank fails.",
    )
    run.add_argument("-np", "--num-proc", dest="np", type=int, required=True, help="number of ranks")
    run.add_argument("-H", "--hosts", help="Open MPI host list, e.g. host1:2,host2:2 (default: localhost)")
    run.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="set and forward a variable")
    run.add_argument("--timeline", metavar="FILE", help="write a Horovod timeline (Chrome trace) to FILE")
    run.add_argument("command", nargs=argparse.REMAINDER, help="script.py [args] or any command")
    run.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from hvdk8s.errors import UserError
    from hvdk8s.launcher import local

    if not args.command:
        raise UserError("run: give the script to run, e.g. hvdk8s run -np 2 train.py")
    return local.run(args.np, args.command, hosts=args.hosts, env=args.env, timeline=args.timeline)
