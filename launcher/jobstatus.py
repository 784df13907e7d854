"""Turn an MPIJob's ``status`` (kubeflow.org/v2beta1 JobStatus) into lines a person reads.

Pure functions over the status dict, so the wording of ``submit --wait`` and
``status`` is tested without a server. The MPI Operator keeps one condition
per type (Created, Running, Restarting, Succeeded, Failed, Suspended) and
replica counts per role (Launcher, Worker: active/succeeded/failed).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

TERMINAL = ("Succeeded", "Failed")
# Most telling first: the state a job is "in" is its first True condition in this order.
PHASE_ORDER = ("Succeeded", "Failed", "Suspended", "Restarting", "Running", "Created")
ROLE_ORDER = ("Launcher", "Worker")
COUNTS = ("active", "succeeded", "failed")


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


def phase(status: Mapping[str, Any] | None) -> str:
    """Created/Running/Restarting/Suspended/Succeeded/Failed, or Pending before the operator acts."""
    true = {c.type for c in conditions(status) if c.status == "True"}
    return next((p for p in PHASE_ORDER if p in true), "Pending")


def outcome(status: Mapping[str, Any] | None) -> Condition | None:
    """The Succeeded or Failed condition once the job has ended, else None."""
    return next((c for c in conditions(status) if c.type in TERMINAL and c.status == "True"), None)


def replica_counts(status: Mapping[str, Any] | None) -> dict[str, dict[str, int]]:
    statuses = (status or {}).get("replicaStatuses") or {}
    roles = [r for r in ROLE_ORDER if r in statuses] + sorted(set(statuses) - set(ROLE_ORDER))
    return {role: {k: int((statuses[role] or {}).get(k) or 0) for k in COUNTS} for role in roles}


def replica_line(status: Mapping[str, Any] | None) -> str | None:
    """``replicas: Launcher 1 active; Worker 2 active`` (zero counts left out), None before any."""
    counts = replica_counts(status)
    if not counts:
        return None
    parts = [f"{role} " + (", ".join(f"{n} {k}" for k, n in c.items() if n) or "none") for role, c in counts.items()]
    return "replicas: " + "; ".join(parts)


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


def summary(job: Mapping[str, Any]) -> list[str]:
    """``hvdk8s status``: the job's phase, every condition, replica counts and times."""
    meta, status = job.get("metadata", {}), job.get("status") or {}
    lines = [f"MPIJob {meta.get('namespace', '?')}/{meta.get('name', '?')}: {phase(status)}"]
    if "deletionTimestamp" in meta:
        lines.append(f"  being deleted since {meta['deletionTimestamp']}")
    lines += [f"  {c.line()}" for c in conditions(status)] or ["  no conditions yet (has the MPI Operator seen it?)"]
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
    return f"MPIJob {meta.get('namespace')}/{meta.get('name')} failed{reason}{detail}"
