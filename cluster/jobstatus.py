"""Turn a job's ``status`` into lines a person reads: an MPIJob's (kubeflow.org/v2beta1
JobStatus) or a TrainJob's (trainer.kubeflow.org/v1alpha1).

Pure functions over the status dict, so the wording of ``submit --wait`` and
``status`` is tested without a server. The MPI Operator keeps one condition
per type (Created, Running, Restarting, Succeeded, Failed, Suspended) and
replica counts per role (Launcher, Worker: active/succeeded/failed). Trainer
has only Suspended, Complete and Failed conditions, and counts child Jobs per
replicated job in ``jobsStatus`` (node, launcher). A child Job is ``active`` while
"at least 1 pod [is] in a running or pending state" (Trainer v2.3.0,
pkg/apis/trainer/v1alpha1/trainjob_types.go, JobStatus.active), so an active launcher
may still be unschedulable: a TrainJob is Running once its launcher pod runs.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hvdk8s.common.fields import QUEUE_LABEL

SUCCESS = ("Succeeded", "Complete")  # MPIJob, TrainJob
TERMINAL = (*SUCCESS, "Failed")
# Most telling first: the state a job is "in" is its first True condition in this order.
PHASE_ORDER = ("Succeeded", "Complete", "Failed", "Suspended", "Restarting", "Running", "Created")
ROLE_ORDER = ("Launcher", "Worker", "launcher", "node")
COUNTS = ("active", "succeeded", "failed")
STARTED = ("Running", "Succeeded", "Failed")  # pod phases once its containers have run


@dataclass(frozen=True)
class Condition:
    type: str
    status: str
    reason: str = ""
    message: str = ""

    def line(self) -> str:
        """``Running: MPIJob ns/x is running. [MPIJobRunning]``; False conditions say so."""
        head = self.type if self.status == "True" else f"{self.type}={self.status}"
        text = f"{head}: {self.message}" if self.message else head
        return f"{text} [{self.reason}]" if self.reason else text


def conditions(status: Mapping[str, Any] | None) -> list[Condition]:
    return [Condition(c["type"], c.get("status", "Unknown"), c.get("reason", ""), c.get("message", ""))
            for c in (status or {}).get("conditions") or []]


def phase(status: Mapping[str, Any] | None, launcher_pod: str | None = None) -> str:
    """Created/Running/Restarting/Suspended/Succeeded/Complete/Failed, or Pending before the controller acts.

    ``launcher_pod``: a TrainJob's launcher pod phase (None: no such pod), which says
    whether it runs; an MPIJob's Running condition says so itself.
    """
    true = {c.type for c in conditions(status) if c.status == "True"}
    if found := next((p for p in PHASE_ORDER if p in true), None):
        return found
    if launcher_pod in STARTED:
        return "Running"
    return "Created" if (status or {}).get("jobsStatus") else "Pending"


def started(phase_: str) -> bool:
    """Running or ended: nothing left to explain about why it waits."""
    return phase_ in ("Running", *TERMINAL)


def outcome(status: Mapping[str, Any] | None) -> Condition | None:
    """The Succeeded or Failed condition once the job has ended, else None."""
    return next((c for c in conditions(status) if c.type in TERMINAL and c.status == "True"), None)


def replica_counts(status: Mapping[str, Any] | None) -> dict[str, dict[str, int]]:
    statuses = (status or {}).get("replicaStatuses") or {
        j["name"]: j for j in (status or {}).get("jobsStatus") or [] if j.get("name")}
    roles = [r for r in ROLE_ORDER if r in statuses] + sorted(set(statuses) - set(ROLE_ORDER))
    return {role: {k: int((statuses[role] or {}).get(k) or 0) for k in COUNTS} for role in roles}


def replica_line(status: Mapping[str, Any] | None) -> str | None:
    """``replicas: Launcher 1 active; Worker 2 active`` (pods; zero counts left out), None before any.

    A TrainJob's counts are child Jobs (one per replicated job here, whatever its pod
    count), so its line says ``child Jobs: launcher 1 active; node 1 active``.
    """
    counts = replica_counts(status)
    if not counts:
        return None
    parts = [f"{role} " + (", ".join(f"{n} {k}" for k, n in c.items() if n) or "none") for role, c in counts.items()]
    label = "replicas" if (status or {}).get("replicaStatuses") else "child Jobs"
    return f"{label}: " + "; ".join(parts)


def transitions(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> list[str]:
    """Lines for what changed between two observations of a job's status.

    A condition is reported when it turns True (or its reason/message changes while
    True), and when a False one gets a new reason (Suspended -> MPIJobResumed). The
    operator flipping Running to False as the job ends is not news: Succeeded says it.
    The replica line is reported whenever any count changes.
    """
    before = {c.type: c for c in conditions(old)}
    lines = []
    for cond in conditions(new):
        prev = before.get(cond.type)
        if cond == prev:
            continue
        if cond.status == "True" or (prev is not None and cond.reason != prev.reason):
            lines.append(cond.line())
    if replica_counts(old) != replica_counts(new) and (line := replica_line(new)):
        lines.append(line)
    return lines


def summary(job: Mapping[str, Any], launcher_pod: str | None = None) -> list[str]:
    """``hvdk8s status``: the job's phase, every condition, replica counts and times.

    ``launcher_pod``: a TrainJob's launcher pod phase, as for :func:`phase`.
    """
    meta, status = job.get("metadata", {}), job.get("status") or {}
    head = f"{job.get('kind', 'MPIJob')} {meta.get('namespace', '?')}/{meta.get('name', '?')}"
    lines = [f"{head}: {phase(status, launcher_pod)}"]
    if "deletionTimestamp" in meta:
        lines.append(f"  being deleted since {meta['deletionTimestamp']}")
    lines += [f"  {c.line()}" for c in conditions(status)] or [f"  no conditions yet{_seen_by(job)}"]
    if line := replica_line(status):
        lines.append(f"  {line}")
    for key, label in (("startTime", "started"), ("completionTime", "completed")):
        if status.get(key):
            lines.append(f"  {label} {status[key]}")
    return lines


def failure_message(job: Mapping[str, Any]) -> str:
    """What ``submit --wait`` prints when the operator marks a job Failed."""
    meta = job.get("metadata", {})
    cond = outcome(job.get("status"))
    reason = f" ({cond.reason})" if cond and cond.reason else ""
    detail = f": {cond.message}" if cond and cond.message else ""
    return f"{job.get('kind', 'MPIJob')} {meta.get('namespace')}/{meta.get('name')} failed{reason}{detail}"


def controller(job: Mapping[str, Any]) -> str:
    return "Kubeflow Trainer" if job.get("kind") == "TrainJob" else "the MPI Operator"


def _seen_by(job: Mapping[str, Any]) -> str:
    """MPIJobs get a condition at once; a running TrainJob may have none."""
    return "" if job.get("kind") == "TrainJob" else " (has the MPI Operator seen it?)"


def waiting_reasons(job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]],
                    events: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[str]:
    """Why a job that has not started is still waiting, from its status, pods and events.

    ``events`` maps an object name (the job's, its pods') to the events about it.
    Pure, so ``submit --wait`` can say it after a bounded time instead of hanging silently.
    """
    meta, spec, status = job.get("metadata", {}), job.get("spec") or {}, job.get("status") or {}
    name, run_policy = meta.get("name", "?"), spec.get("runPolicy") or {}
    true = {c.type for c in conditions(status) if c.status == "True"}
    queue = (meta.get("labels") or {}).get(QUEUE_LABEL)
    if "Suspended" in true or run_policy.get("suspend") or spec.get("suspend"):
        if queue:
            return [f"suspended: waiting for Kueue to admit it from LocalQueue {queue!r} "
                    f"(kubectl get workloads -n {meta.get('namespace')}; its quota or admission checks hold it)"]
        field = "suspend" if job.get("kind") == "TrainJob" else "runPolicy.suspend"
        return [f"suspended ({field}: true): nothing runs until it is resumed"]
    if phase(status) == "Pending" and not pods:
        warnings = [e for e in events.get(name, []) if e.get("type") == "Warning"]
        if warnings:
            return [f"{controller(job)} did not start it: {e.get('reason')}: {e.get('message')}" for e in warnings]
        managed_by = run_policy.get("managedBy") or spec.get("managedBy")
        if managed_by and managed_by not in ("kubeflow.org/mpi-operator", "trainer.kubeflow.org/trainjob-controller"):
            return [f"no status: its managedBy is {managed_by!r}, so {controller(job)} leaves it to that controller"]
        if job.get("kind") == "TrainJob":
            return ["no pods and no status yet: is Kubeflow Trainer running? Check: kubectl get pods -n kubeflow-system"]
        return ["no status yet: is the MPI Operator running? Check: kubectl get pods -A -l app=mpi-operator"]
    if not pods:
        return ["no pods created yet (a gang scheduler's PodGroup or a quota may hold them; "
                f"kubectl describe {job.get('kind', 'MPIJob').lower()} {name})"]
    lines = []
    for pod in pods:
        pod_name = pod["metadata"]["name"]
        if (pod.get("status") or {}).get("phase") != "Pending":
            continue
        failed = [e for e in events.get(pod_name, []) if e.get("reason") == "FailedScheduling"]
        lines.append(f"pod {pod_name} is unschedulable: {failed[-1].get('message')}" if failed
                     else f"pod {pod_name} is Pending")
    return lines
