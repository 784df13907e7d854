"""Kueue v0.19.2 (github.com/kubernetes-sigs/kueue, tag v0.19.2): what its job webhooks do on create.

``pkg/controller/jobframework/defaults.go`` (ApplyDefaultLocalQueue, ApplyDefaultForSuspend) and
``utils.go`` (WorkloadShouldBeSuspended): a job in a namespace with a LocalQueue named ``default``
gets the queue-name label, and a job with a queue name -- or any job when the Configuration sets
``manageJobsWithoutQueueName`` (in the managed namespaces) -- is created suspended until admitted.
"""
from __future__ import annotations

from typing import Any

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"  # constants.QueueLabel
DEFAULT_LOCAL_QUEUE = "default"  # constants.DefaultLocalQueueName


def on_create(job: dict[str, Any], *, default_local_queue: bool = False,
              manage_jobs_without_queue_name: bool = False) -> dict[str, Any]:
    """The job as stored: queue label defaulted, and suspended (runPolicy.suspend for an MPIJob,
    spec.suspend for a TrainJob) when Kueue manages it. Ancestor/owner checks are not modelled
    (hvdk8s's jobs have no owner Kueue manages)."""
    out = {**job, "metadata": {**job["metadata"], "labels": dict(job["metadata"].get("labels") or {})}}
    labels = out["metadata"]["labels"]
    if default_local_queue and not labels.get(QUEUE_LABEL):
        labels[QUEUE_LABEL] = DEFAULT_LOCAL_QUEUE
    if labels.get(QUEUE_LABEL) or manage_jobs_without_queue_name:
        spec = dict(out["spec"])
        if job["kind"] == "MPIJob":
            spec["runPolicy"] = {**spec.get("runPolicy", {}), "suspend": True}
        else:
            spec["suspend"] = True
        out["spec"] = spec
    return out


def admit(job: dict[str, Any]) -> dict[str, Any]:
    """Admission unsuspends the job (GenericJob.RunWithPodSetsInfo)."""
    spec = dict(job["spec"])
    if job["kind"] == "MPIJob":
        spec["runPolicy"] = {**spec["runPolicy"], "suspend": False}
    else:
        spec["suspend"] = False
    return {**job, "spec": spec}
