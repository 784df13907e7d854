"""Launcher commands of the ``hvdk8s`` CLI: ``run`` locally; ``submit``, ``status``, ``logs``, ``delete``
on Kubernetes (MPI Operator MPIJobs, kubeflow.org/v2beta1, or Kubeflow Trainer TrainJobs with --api trainjob)."""
from __future__ import annotations

import argparse
import typing

from hvdk8s.launcher.mpirun import DEFAULT_TCP_EAGER_LIMIT, AllreduceAlgorithm


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
    run.add_argument("--allreduce-algorithm", choices=typing.get_args(AllreduceAlgorithm), default="auto",
                     help="Open MPI's allreduce algorithm for Horovod's CPU tensors (default auto: Open MPI decides by "
                          "size; measured effects: README, Benchmarks)")
    run.add_argument("--tcp-eager-limit", type=int, default=DEFAULT_TCP_EAGER_LIMIT, metavar="BYTES",
                     help="largest message Open MPI's TCP transport sends without waiting for the receiver "
                          f"(default {DEFAULT_TCP_EAGER_LIMIT}; Open MPI's own: 65536; see README, Benchmarks)")
    elastic = run.add_argument_group(
        "elastic (horovodrun over Gloo; the script must use hvdk8s.elastic)",
        "Given --host-discovery-script, the job keeps between --min-np and --max-np ranks as hosts come and go.",
    )
    elastic.add_argument("--min-np", type=int, help="fewest ranks to keep running (default: -np)")
    elastic.add_argument("--max-np", type=int, help="most ranks to scale up to (default: -np)")
    elastic.add_argument("--host-discovery-script", metavar="SCRIPT", help="prints the available host[:slots] lines")
    elastic.add_argument("--slots", type=int, help="slots of hosts listed without a count")
    elastic.add_argument("--network-interface", metavar="NIC", help="interface for Gloo (lo for one host)")
    elastic.add_argument("--blacklist-cooldown", type=int, nargs=2, metavar=("MIN", "MAX"),
                         help="let the host of a failed worker back after MIN-MAX seconds (default: never; Horovod "
                              "blacklists the whole host)")
    # dest argv: "command" is the top-level parser's dest for the subcommand, which error messages name
    run.add_argument("argv", metavar="command", nargs=argparse.REMAINDER, help="script.py [args] or any command")
    run.set_defaults(handler=_run)
    _register_cluster(sub)


def _run(args: argparse.Namespace) -> int:
    from hvdk8s.errors import UserError
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
            network_interface=args.network_interface,
            blacklist_cooldown=tuple(args.blacklist_cooldown) if args.blacklist_cooldown else None,
        )
    elif args.min_np or args.max_np or args.blacklist_cooldown:
        raise UserError("--min-np/--max-np/--blacklist-cooldown: elastic runs need --host-discovery-script")
    return local.run(args.np, args.argv, hosts=args.hosts, env=args.env, timeline=args.timeline, elastic=elastic,
                     allreduce_algorithm=args.allreduce_algorithm, tcp_eager_limit=args.tcp_eager_limit)


def _cluster_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config, "
                        "else the in-cluster service account)")
    parser.add_argument("--context", help="kubeconfig context (default: its current-context)")
    parser.add_argument("-n", "--namespace", help="namespace (default: the manifest's, else the context's, "
                        "else default)")
    parser.add_argument("--api", choices=("mpijob", "trainjob"), default="mpijob",
                        help="mpijob: MPI Operator MPIJob (default); trainjob: Kubeflow Trainer TrainJob")


def _register_cluster(sub: argparse._SubParsersAction) -> None:
    submit = sub.add_parser(
        "submit", help="create an MPIJob (or TrainJob) on Kubernetes from a job spec or MPIJob YAML",
        description="Create the MPIJob (kubeflow.org/v2beta1; with --api trainjob a Kubeflow Trainer TrainJob "
        "and its TrainingRuntime) and, with --wait, report its conditions and replica counts as they "
        "change until it ends, and what it waits for when it does not start: exit 0 when it succeeded, "
        "1 when it failed.")
    submit.add_argument("file", help="hvdk8s job spec or MPIJob manifest (YAML)")
    submit.add_argument("--wait", action="store_true", help="follow the job's status until it ends")
    submit.add_argument("--follow", action="store_true", help="--wait and stream the launcher's logs")
    submit.add_argument("--dry-run", choices=("none", "server"), default="none",
                        help="server: have the API server validate and default it, create nothing, print it")
    _cluster_flags(submit)
    submit.set_defaults(handler=_submit)

    status = sub.add_parser("status", help="an MPIJob's (or TrainJob's) conditions and replica counts",
                            description="One-shot summary of a job: phase, conditions, replica counts.")
    status.add_argument("name", help="job name")
    _cluster_flags(status)
    status.set_defaults(handler=_status)

    logs = sub.add_parser("logs", help="the job launcher's logs",
                          description="Print the log of the job's newest launcher pod.")
    logs.add_argument("name", help="job name")
    logs.add_argument("-f", "--follow", action="store_true", help="wait for the launcher and stream until it exits")
    _cluster_flags(logs)
    logs.set_defaults(handler=_logs)

    delete = sub.add_parser(
        "delete", help="delete an MPIJob (or TrainJob) and (foreground) its pods",
        description="Delete with foreground propagation: the job stays, marked for deletion, until its "
        "pods, services and secrets are gone, so resubmitting the same name cannot collide with them.")
    delete.add_argument("name", help="job name")
    delete.add_argument("--wait", action="store_true", help="return once the job and its pods are gone")
    _cluster_flags(delete)
    delete.set_defaults(handler=_delete)


def _submit(args: argparse.Namespace) -> int:
    import yaml

    from hvdk8s import k8s, mpijob
    from hvdk8s.errors import UserError
    from hvdk8s.launcher import kube, watch

    dry_run = args.dry_run == "server"
    if dry_run and (args.wait or args.follow):
        raise UserError("--wait/--follow cannot be combined with --dry-run=server: nothing is created")
    *runtimes, manifest = mpijob.objects_from_file(args.file, args.api)
    kind = kube.kind_of(manifest)
    cluster = k8s.connect(args.kubeconfig, args.context)
    namespace = k8s.resolve_namespace(args.namespace, manifest.get("metadata", {}).get("namespace"),
                                      cluster.namespace)
    for runtime in runtimes:
        kube.apply_runtime(cluster, runtime, namespace, dry_run=dry_run)
    job = kube.create_job(cluster, manifest, namespace, dry_run=dry_run)
    for runtime in runtimes if not dry_run else ():
        kube.own_runtime(cluster, runtime, job)
    name, resource = job["metadata"]["name"], f"{kind.kind.lower()}.{kind.group}"
    if dry_run:
        print(f"# {resource}/{name} accepted by the API server (dry run: nothing was created)")
        print(yaml.safe_dump(job, sort_keys=False), end="")
        return 0
    on = "".join(f" on runtime {r['metadata']['name']}" for r in runtimes)
    print(f"{resource}/{name} created in namespace {namespace}{on}", flush=True)
    if not (args.wait or args.follow):
        return 0
    return watch.wait_for_job(cluster, namespace, name, follow_logs=args.follow, kind=kind)


def _status(args: argparse.Namespace) -> int:
    from hvdk8s import k8s
    from hvdk8s.launcher import jobstatus, kube

    cluster = k8s.connect(args.kubeconfig, args.context)
    job = kube.get_job(cluster, args.namespace or cluster.namespace, args.name, _kind(args))
    print("\n".join(jobstatus.summary(job)))
    return 0


def _logs(args: argparse.Namespace) -> int:
    from hvdk8s import k8s
    from hvdk8s.launcher import watch

    cluster = k8s.connect(args.kubeconfig, args.context)
    return watch.show_logs(cluster, args.namespace or cluster.namespace, args.name, args.follow, kind=_kind(args))


def _delete(args: argparse.Namespace) -> int:
    from hvdk8s import k8s
    from hvdk8s.launcher import kube, watch

    kind = _kind(args)
    cluster = k8s.connect(args.kubeconfig, args.context)
    namespace = args.namespace or cluster.namespace
    kube.delete_job(cluster, namespace, args.name, kind)
    resource = f"{kind.kind.lower()}.{kind.group}/{args.name}"
    print(f"{resource} deletion requested ({kube.PROPAGATION.lower()}: "
          "removed once its pods, services and secrets are gone)", flush=True)
    if args.wait:
        watch.wait_deleted(cluster, namespace, args.name, kind)
        print(f"{resource} deleted")
    return 0


def _kind(args: argparse.Namespace):  # -> kube.JobKind (imported lazily with the client)
    from hvdk8s.launcher import kube

    return kube.TRAINJOB if args.api == "trainjob" else kube.MPIJOB
