"""``hvdk8s bench --cluster submit``: run the matrix on a cluster, one job at a time, through ``hvdk8s.cluster``.

For each job: create it (the API server validates it against its CRD), follow its status until it ends
(saying why it waits, as ``submit --wait`` does), note the node of each of its pods while they exist,
keep the log of its rank 0 / Chief / worker 0 pod, delete it and wait until its pods are gone, then the
next. So no two benchmark jobs share the cluster's GPUs or links; with a Kueue queue in the job file each
job also waits for the queue's admission. Before anything is created, every kind of job in the matrix
is looked up, so a missing operator (MPI Operator, Training Operator) is reported before any job runs.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from pathlib import Path

from hvdk8s.cluster import jobstatus, kube, watch
from hvdk8s.cluster.client import Cluster
from hvdk8s.common import atomic
from hvdk8s.common.errors import UserError

from .cluster_collect import JobLog
from .cluster_jobs import BenchJob


def preflight(cluster: Cluster, namespace: str, jobs: list[BenchJob]) -> None:
    """Refuse (UserError) a kind the cluster does not serve, or a job name already taken in ``namespace``."""
    for job in jobs:
        listed = kube.list_job(cluster, namespace, job.name, kube.kind_of(job.manifest))  # 404: the CRD is missing
        if listed.get("items"):
            raise UserError(f"{job.manifest['kind']} {namespace}/{job.name} already exists (left by an earlier run?): "
                            f"delete it first (kubectl delete {job.manifest['kind'].lower()} {job.name} -n {namespace})")


def run_job(cluster: Cluster, namespace: str, job: BenchJob, logs_dir: Path) -> JobLog:
    """Create, follow, read and delete one job; its log is also saved as ``logs_dir/<job>.log``."""
    kind = kube.kind_of(job.manifest)
    kube.create_job(cluster, job.manifest, namespace)
    printer = watch.Printer(job.name, kind)
    explainer = watch.Explainer(cluster, namespace, job.name, printer, kind)
    explainer.start()
    try:
        pods: dict[str, str] = {}
        try:  # the explainer says why the job waits while it is followed, and only then
            for obj in watch.job_updates(cluster, namespace, job.name, kind=kind):
                status = obj.get("status") or {}
                if jobstatus.started(jobstatus.phase(status)):  # note each pod's node while the pods exist
                    pods |= {p["metadata"]["name"]: p["spec"]["nodeName"]
                             for p in kube.job_pods(cluster, namespace, job.name, kind) if (p.get("spec") or {}).get("nodeName")}
                if ended := jobstatus.outcome(status):
                    failed = None if ended.type in jobstatus.SUCCESS else jobstatus.failure_message(obj)
                    break
            else:
                failed = f"{kind.kind} {namespace}/{job.name} was deleted before it finished"
        finally:
            explainer.stop()
        pod = kube.launcher_pod(cluster, namespace, job.name, kind)
        text = "\n".join(kube.log_lines(cluster, namespace, pod, follow=False)) if pod and pod.phase != "Pending" else ""
        atomic.write_text(logs_dir / f"{job.name}.log", text + "\n")
        return JobLog(job, text, pods, failed)
    finally:
        kube.delete_job(cluster, namespace, job.name, kind)
        watch.wait_deleted(cluster, namespace, job.name, kind)


def run_jobs(cluster: Cluster, namespace: str, jobs: list[BenchJob], logs_dir: Path,
             step: Callable[[str, Callable[[], JobLog]], JobLog]) -> Iterator[JobLog]:
    """Every job in order (``step`` reports each, as the suite's ``Progress.step``), each as it ends; a job that
    fails is yielded with its error and the next one runs. A job interrupted (Ctrl-C) is deleted first."""
    preflight(cluster, namespace, jobs)
    logs_dir.mkdir(parents=True, exist_ok=True)
    for job in jobs:
        label = f"{job.kind} {job.strategy or 'horovod'} N={job.workers}" + (
            f" round {job.round + 1}" if job.kind == "train" else "") + f" ({job.manifest['kind']} {job.name})"
        yield step(label, functools.partial(run_job, cluster, namespace, job, logs_dir))
