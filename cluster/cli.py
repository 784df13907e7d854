"""Cluster commands of the ``hvdk8s`` CLI: ``submit``, ``status``, ``logs``, ``delete`` of MPI Operator MPIJobs
(kubeflow.org/v2beta1) or, with ``--api trainjob``, Kubeflow Trainer TrainJobs."""
from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the client is imported lazily, by the commands that connect
    from hvdk8s.cluster.client import Cluster


def cluster_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config, "
                        "else the in-cluster service account)")
    parser.add_argument("--context", help="kubeconfig context (default: its current-context)")
    parser.add_argument("-n", "--namespace", help="namespace (default: the manifest's, else the context's, "
                        "else default)")
    parser.add_argument("--api", choices=("mpijob", "trainjob"), default="mpijob",
                        help="mpijob: MPI Operator MPIJob (default); trainjob: Kubeflow Trainer TrainJob")


def register(sub: argparse._SubParsersAction) -> None:
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
    cluster_flags(submit)
    submit.set_defaults(handler=_submit)

    status = sub.add_parser("status", help="an MPIJob's (or TrainJob's) conditions and replica counts",
                            description="One-shot summary of a job: phase, conditions, replica counts.")
    status.add_argument("name", metavar="NAME", help="job name")
    cluster_flags(status)
    status.set_defaults(handler=_status)

    logs = sub.add_parser("logs", help="the job launcher's logs",
                          description="Print the log of the job's newest launcher pod.")
    logs.add_argument("name", metavar="NAME", help="job name")
    logs.add_argument("-f", "--follow", action="store_true", help="wait for the launcher and stream until it exits")
    cluster_flags(logs)
    logs.set_defaults(handler=_logs)

    delete = sub.add_parser(
        "delete", help="delete an MPIJob (or TrainJob) and (foreground) its pods",
        description="Delete with foreground propagation: the job stays, marked for deletion, until its "
        "pods, services and secrets are gone, so resubmitting the same name cannot collide with them.")
    delete.add_argument("name", metavar="NAME", help="job name")
    delete.add_argument("--wait", action="store_true", help="return once the job and its pods are gone")
    cluster_flags(delete)
    delete.set_defaults(handler=_delete)


def _submit(args: argparse.Namespace) -> int:
    from hvdk8s import mpijob
    from hvdk8s.cluster import client, kube, watch
    from hvdk8s.common.errors import UserError

    dry_run = args.dry_run == "server"
    if dry_run and (args.wait or args.follow):
        raise UserError("--wait/--follow cannot be combined with --dry-run=server: nothing is created")
    *runtimes, manifest = mpijob.objects_from_file(args.file, args.api)
    kind = kube.kind_of(manifest)
    cluster = client.connect(args.kubeconfig, args.context)
    namespace = client.resolve_namespace(args.namespace, manifest.get("metadata", {}).get("namespace"),
                                      cluster.namespace)
    if dry_run:
        return _dry_run(cluster, runtimes, manifest, namespace)
    if runtimes:
        (runtime,) = runtimes
        job = kube.submit_trainjob(cluster, runtime, manifest, namespace)
    else:
        job = kube.create_job(cluster, manifest, namespace)
    name, resource = job["metadata"]["name"], f"{kind.kind.lower()}.{kind.group}"
    on = "".join(f" on runtime {r['metadata']['name']}" for r in runtimes)
    print(f"{resource}/{name} created in namespace {namespace}{on}", flush=True)
    if not (args.wait or args.follow):
        return 0
    return watch.wait_for_job(cluster, namespace, name, follow_logs=args.follow, kind=kind)


def _dry_run(cluster: Cluster, runtimes: list[dict], manifest: dict, namespace: str) -> int:
    """Print what the API server accepted, creating nothing; a TrainJob it cannot check yet (see
    ``kube.dry_run_trainjob``) is printed as it would be sent, saying so."""
    import yaml

    from hvdk8s.cluster import kube

    if runtimes:
        (runtime,) = runtimes
        accepted, job = kube.dry_run_trainjob(cluster, runtime, manifest, namespace)
        documents = [(accepted, True), (job or kube.in_namespace(manifest, namespace), job is not None)]
    else:
        documents = [(kube.create_job(cluster, manifest, namespace, dry_run=True), True)]
    for i, (obj, checked) in enumerate(documents):
        what = f"{obj['kind'].lower()}.{obj['apiVersion'].split('/')[0]}/{obj['metadata']['name']}"
        said = "accepted by the API server" if checked else (
            f"not checked by the API server: Kubeflow Trainer's webhook validates a TrainJob against its "
            f"TrainingRuntime as stored, and {runtimes[0]['metadata']['name']} is not stored as rendered until submit")
        if i:
            print("---")
        print(f"# {what} {said} (dry run: nothing was created)")
        print(yaml.safe_dump(obj, sort_keys=False), end="")
    return 0


def _status(args: argparse.Namespace) -> int:
    from hvdk8s.cluster import jobstatus, kube, watch

    cluster, namespace = _target(args)
    kind = _kind(args)
    job = kube.get_job(cluster, namespace, args.name, kind)
    print("\n".join(jobstatus.summary(job, watch.launcher_phase(cluster, namespace, args.name, kind))))
    return 0


def _logs(args: argparse.Namespace) -> int:
    from hvdk8s.cluster import watch

    cluster, namespace = _target(args)
    return watch.show_logs(cluster, namespace, args.name, args.follow, kind=_kind(args))


def _delete(args: argparse.Namespace) -> int:
    from hvdk8s.cluster import kube, watch

    kind = _kind(args)
    cluster, namespace = _target(args)
    kube.delete_job(cluster, namespace, args.name, kind)
    resource = f"{kind.kind.lower()}.{kind.group}/{args.name}"
    print(f"{resource} deletion requested ({kube.PROPAGATION.lower()}: "
          "removed once its pods, services and secrets are gone)", flush=True)
    if args.wait:
        watch.wait_deleted(cluster, namespace, args.name, kind)
        print(f"{resource} deleted")
    return 0


def _target(args: argparse.Namespace) -> tuple[Cluster, str]:
    """The cluster and namespace of ``status``/``logs``/``delete``, once NAME and -n/--namespace are names its
    requests can carry (an empty NAME would make a GET or DELETE one on the whole collection), checked before
    the kubeconfig is read; the context's namespace is checked when it is the one used."""
    import json

    from hvdk8s.cluster import client, kube
    from hvdk8s.common.errors import UserError

    kind = _kind(args)
    if problem := kube.job_name_problem(args.name, kind):
        raise UserError(f"NAME: {json.dumps(args.name, ensure_ascii=False)} is not a valid {kind.kind} name: {problem}")
    if args.namespace is not None:
        client.check_namespace(args.namespace, "-n/--namespace")
    cluster = client.connect(args.kubeconfig, args.context)
    return cluster, client.resolve_namespace(args.namespace, None, cluster.namespace)


def _kind(args: argparse.Namespace):  # -> kube.JobKind (imported lazily with the client)
    from hvdk8s.cluster import kube

    return kube.TRAINJOB if args.api == "trainjob" else kube.MPIJOB
