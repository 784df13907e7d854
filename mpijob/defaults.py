"""Defaulting: of job specs (the values hvdk8s fills from other fields) and of MPIJob
manifests (the MPI Operator's SetDefaults_MPIJob).

Pure functions returning the defaulted object or a derived value; nothing here refuses anything.
As in the operator (``pkg/apis/kubeflow/v2beta1/default.go`` first, then
``pkg/apis/kubeflow/validation/validation.go``), defaults come first and ``validation`` checks the
defaulted object: ``files`` parses, runs ``with_defaults``, then
``validation.check_spec``, then renders; ``validation.check_manifest`` checks ``manifest_defaults``' result.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from hvdk8s.common.fields import join, quantity_problem, scale_quantity
from hvdk8s.mpijob.spec import GPU_RESOURCE, JobSpec, SchedulingPolicy, Toleration

GPU_TOLERATION = Toleration(key=GPU_RESOURCE, operator="Exists", effect="NoSchedule")


# ---- job specs ---------------------------------------------------------------


def with_defaults(spec: JobSpec) -> JobSpec:
    """Fill the defaults that depend on other fields (before any rule is checked)."""
    changes: dict[str, Any] = {}
    if spec.ssh_auth_mount_path is None:
        changes["ssh_auth_mount_path"] = f"{spec.home}/.ssh"
    if spec.scheduling.tolerations is None:
        tolerations = (GPU_TOLERATION,) if spec.gpu else ()
        changes["scheduling"] = dataclasses.replace(spec.scheduling, tolerations=tolerations)
    policy = spec.launcher_creation_policy
    if policy is None:
        # A job created suspended gets its launcher created at once anyway
        # (mpi-operator issue 615): AtStartup says what really happens.
        policy = "AtStartup" if created_suspended(spec) else "WaitForWorkersReady"
        changes["launcher_creation_policy"] = policy
    gang = spec.run_policy.scheduling_policy or SchedulingPolicy()
    pods = gang_pods(spec, policy) if gang.min_available is None else gang.min_available
    gang = dataclasses.replace(gang, min_available=pods)
    if gang.min_resources is None and policy == "WaitForWorkersReady" and spec.workers > 0:
        gang = dataclasses.replace(gang, min_resources=gang_resources(spec, pods))
    changes["run_policy"] = dataclasses.replace(spec.run_policy, scheduling_policy=gang)
    return dataclasses.replace(spec, **changes)


def derived_paths(spec: JobSpec, path: str = "") -> set[str]:
    """Job-file paths (under ``path``) ``with_defaults`` fills from other fields when the file leaves them
    out: their errors are reported only when the fields they come from are valid."""
    gang = spec.run_policy.scheduling_policy or SchedulingPolicy()
    fields = {"minAvailable": gang.min_available, "minResources": gang.min_resources}
    return {join(path, "runPolicy", "schedulingPolicy", key) for key, value in fields.items() if value is None}


def gang_resources(spec: JobSpec, pods: int) -> dict[str, str] | None:
    """What ``pods`` workers request together: the PodGroup's minResources.

    Without it the operator's calPGMinResource (podgroup.go) counts the launcher and cuts the
    workers to minAvailable - 1, so under WaitForWorkersReady (no launcher yet) Volcano would
    reserve a launcher and one worker too few. None while the worker's quantities are invalid or
    negative (defaults come before validation: their own errors say why).
    """
    res = spec.resources.worker
    amounts: dict[str, str | int] = {"cpu": res.cpu, "memory": res.memory, **res.extra}
    if spec.gpu:
        amounts[GPU_RESOURCE] = spec.slots_per_worker
    if pods < 1 or any(quantity_problem(str(v)) for v in amounts.values()):
        return None
    return {name: scale_quantity(value, pods) for name, value in amounts.items()}


def gang_pods(spec: JobSpec, launcher_creation_policy: str) -> int:
    """Pods a gang scheduler must place together for the job to start.

    The operator's default (workers + 1) counts the launcher, which under
    WaitForWorkersReady is created only after the workers run: a PodGroup
    waiting for it never fills (mpi-operator issue 608). Elastic jobs start
    with as few as ``minWorkers``.
    """
    workers = min(spec.elastic.min_workers, spec.workers) if spec.elastic else spec.workers
    launcher = launcher_creation_policy == "AtStartup"
    return workers + int(launcher) if workers else 1


def created_suspended(spec: JobSpec) -> bool:
    """Kueue creates queued jobs suspended (its webhook sets runPolicy.suspend)."""
    return spec.queue is not None or bool(spec.run_policy.suspend)


# ---- MPIJob manifests: the operator's defaulting ------------------------------


def manifest_defaults(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The MPIJob's ``spec`` as the operator's SetDefaults_MPIJob leaves it (v2beta1)."""
    raw = manifest.get("spec")
    spec = dict(raw) if isinstance(raw, Mapping) else {}
    spec.setdefault("slotsPerWorker", 1)
    spec.setdefault("sshAuthMountPath", "/root/.ssh")
    spec.setdefault("mpiImplementation", "OpenMPI")
    spec.setdefault("launcherCreationPolicy", "AtStartup")
    run_policy = spec.get("runPolicy") or {}
    # Anything but a mapping stays as written: validation's shape check names it.
    spec["runPolicy"] = {"cleanPodPolicy": "None"} | dict(run_policy) if isinstance(run_policy, Mapping) else run_policy
    replicas = spec.get("mpiReplicaSpecs")
    if isinstance(replicas, Mapping):
        defaults = {"Launcher": {"restartPolicy": "OnFailure", "replicas": 1},
                    "Worker": {"restartPolicy": "Never", "replicas": 0}}
        spec["mpiReplicaSpecs"] = {role: defaults[role] | dict(r) if role in defaults and isinstance(r, Mapping) else r
                                   for role, r in replicas.items()}
    return spec
