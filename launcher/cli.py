"""``hvdk8s run``: a training script on local (or ``-H`` listed) ranks, with mpirun or Horovod's elastic driver."""
from __future__ import annotations

import argparse
import typing

from hvdk8s.launcher.mpirun import DEFAULT_TCP_EAGER_LIMIT, AllreduceAlgorithm, check_hosts


def register(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser(
        "run",
        help="run a training script on N local (or -H listed) ranks with mpirun",
        description="Launch NP ranks of a command (a .py file runs with this Python) and "
        "stream their output prefixed by rank. Fails, naming the rank, if any rank fails.",
    )
    run.add_argument("-np", "--num-proc", dest="np", type=int, required=True, help="number of ranks")
    run.add_argument("-H", "--hosts", help="Open MPI host list, host or host:slots (a host without :slots has 1), "
                                           "e.g. host1:2,host2:2 (default: localhost)")
    run.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="set and forward a variable")
    run.add_argument("--timeline", metavar="FILE", help="write a Horovod timeline (Chrome trace) to FILE")
    run.add_argument("--allreduce-algorithm", choices=typing.get_args(AllreduceAlgorithm), default="auto",
                     help="Open MPI's allreduce algorithm for Horovod's CPU tensors (default auto: Open MPI decides by "
                          "size; measured effects: docs/benchmark-studies.md, 'Two hosts on a slow link')")
    run.add_argument("--tcp-eager-limit", type=int, default=DEFAULT_TCP_EAGER_LIMIT, metavar="BYTES",
                     help="largest message Open MPI's TCP transport sends without waiting for the receiver "
                          f"(default {DEFAULT_TCP_EAGER_LIMIT}; Open MPI's own: 65536; measured effects: "
                          "docs/benchmark-studies.md, 'Open MPI's TCP eager limit')")
    run.add_argument("--network-interface", metavar="NIC",
                     help="network interface for the ranks' traffic, as horovodrun's: Open MPI's TCP transport and "
                          "NCCL (elastic runs: Gloo; on one host pass lo)")
    elastic = run.add_argument_group(
        "elastic (horovodrun over Gloo; the script must use hvdk8s.elastic)",
        "Given --host-discovery-script, the job keeps between --min-np and --max-np ranks as hosts come and go.",
    )
    elastic.add_argument("--min-np", type=int, help="fewest ranks to keep running (default: -np)")
    elastic.add_argument("--max-np", type=int, help="most ranks to scale up to (default: -np)")
    elastic.add_argument("--host-discovery-script", metavar="SCRIPT", help="prints the available host[:slots] lines")
    elastic.add_argument("--slots", type=int, help="slots of hosts listed without a count")
    elastic.add_argument("--blacklist-cooldown", type=int, nargs=2, metavar=("MIN", "MAX"),
                         help="let the host of a failed worker back after its n-th failure, after MIN*2^n plus up to "
                              "MIN seconds, within [MIN, MAX]; 1 <= MIN <= MAX <= 3600 (default: never; Horovod "
                              "blacklists the whole host)")
    # dest argv: "command" is the top-level parser's dest for the subcommand, which error messages name
    run.add_argument("argv", metavar="command", nargs=argparse.REMAINDER, help="script.py [args] or any command")
    run.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from hvdk8s.common.errors import UserError
    from hvdk8s.launcher import local

    if not args.argv:
        raise UserError("run: give the script to run, e.g. hvdk8s run -np 2 train.py")
    elastic = None
    if args.host_discovery_script:
        if args.hosts:
            raise UserError("-H/--hosts: elastic runs take their hosts from --host-discovery-script; give one or the other")
        elastic = local.ElasticOptions(
            min_np=args.min_np or args.np,
            max_np=args.max_np or args.np,
            discovery_script=args.host_discovery_script,
            slots=args.slots,
            blacklist_cooldown=tuple(args.blacklist_cooldown) if args.blacklist_cooldown else None,
        )
    elif args.min_np or args.max_np or args.slots is not None or args.blacklist_cooldown:
        raise UserError("--min-np/--max-np/--slots/--blacklist-cooldown: elastic runs need --host-discovery-script "
                        "(a plain run takes slots in -H host:slots)")
    elif args.hosts is not None:  # refused here, not by mpirun's ssh attempt to a host named "foo:x"
        try:
            check_hosts(args.hosts)
        except ValueError as err:
            raise UserError(f"-H/--hosts: {err} (expected host or host:slots, comma-separated)") from None
    return local.run(args.np, args.argv, hosts=args.hosts, env=args.env, timeline=args.timeline, elastic=elastic,
                     allreduce_algorithm=args.allreduce_algorithm, tcp_eager_limit=args.tcp_eager_limit,
                     network_interface=args.network_interface)

