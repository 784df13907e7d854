"""Defaulting, then validation: of job specs (paths as written in the job file)
and of MPIJob manifests (the MPI Operator's own rules, MPIJob paths).

The operator validates an MPIJob only after the API server has stored it, and
then just marks it Failed; checking here turns that into an error at render
or submit time. Rules mirror kubeflow/mpi-operator pkg/apis/kubeflow/validation
plus hvdk8s's own invariants (-np = workers x slots, GPUs per worker = slots).
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any

from hvdk8s.mpijob.render import API_VERSION, GENERATED_ENV, KIND
from hvdk8s.mpijob.spec import GPU_RESOURCE, MPI_CONFIG_DIR, JobSpec, Toleration

# \Z, not $: $ also matches before a final newline (YAML block scalars end in one).
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?\Z")
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?\Z")
LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]\Z")
# Kubernetes resource.Quantity, as the CRD's schema spells it.
QUANTITY = re.compile(
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?\Z"
)
ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*\Z")
USER_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}\Z")

RESTART_POLICIES = ("Never", "OnFailure")
CLEAN_POD_POLICIES = ("None", "Running", "All")
LAUNCHER_CREATION_POLICIES = ("AtStartup", "WaitForWorkersReady")
MPI_IMPLEMENTATIONS = ("OpenMPI", "Intel", "MPICH")
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
NCCL_DEBUG_LEVELS = ("VERSION", "WARN", "INFO", "TRACE")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
GPU_TOLERATION = Toleration(key=GPU_RESOURCE, operator="Exists", effect="NoSchedule")
Err = Callable[[str], None]  # appends one "path: problem"


def with_defaults(spec: JobSpec) -> JobSpec:
    """Fill the defaults that depend on other fields."""
    changes: dict[str, Any] = {}
    if spec.ssh_auth_mount_path is None:
        changes["ssh_auth_mount_path"] = f"{spec.home}/.ssh"
    if spec.scheduling.tolerations is None:
        tolerations = (GPU_TOLERATION,) if spec.gpu else ()
        changes["scheduling"] = dataclasses.replace(spec.scheduling, tolerations=tolerations)
    return dataclasses.replace(spec, **changes)


def check_spec(spec: JobSpec) -> list[str]:
    """Every problem of a defaulted spec, as ``field.path: problem``."""
    errors: list[str] = []
    err = errors.append

    max_workers = spec.elastic.max_workers if spec.elastic else spec.workers
    if problem := _pod_hostname_problem(spec.name, max_workers):
        err(f"name: {problem}")
    if spec.namespace is not None and (not DNS1123_LABEL.match(spec.namespace) or len(spec.namespace) > 63):
        err(f"namespace: {spec.namespace!r} is not a valid namespace (DNS-1123 label)")
    if not spec.image or any(c.isspace() for c in spec.image):
        err(f"image: {spec.image!r} is not an image reference")
    _one_of(err, "imagePullPolicy", spec.image_pull_policy, PULL_POLICIES)
    if not spec.command:
        err("command: must not be empty")
    for i, arg in enumerate(spec.command):
        if not arg:
            err(f"command[{i}]: must not be empty")

    _at_least(err, "workers", spec.workers, 1)
    _at_least(err, "slotsPerWorker", spec.slots_per_worker, 1)
    for role in ("worker", "launcher"):
        res = getattr(spec.resources, role)
        _quantity(err, f"resources.{role}.cpu", res.cpu)
        _quantity(err, f"resources.{role}.memory", res.memory)
    if spec.shm_size is not None:
        _quantity(err, "shmSize", spec.shm_size)

    for name in spec.env:
        if not ENV_NAME.match(name):
            err(f"env.{name}: not a valid environment variable name")
        elif name in GENERATED_ENV:
            err(f"env.{name}: set by hvdk8s from {GENERATED_ENV[name]}; set it there")

    reserved = {
        "/dev/shm": "shmSize",
        MPI_CONFIG_DIR: "the MPI Operator's hostfile",
        spec.ssh_auth_mount_path or "": "sshAuthMountPath",
    }
    if vol := spec.shared_volume:
        if not DNS1123_SUBDOMAIN.match(vol.claim_name):
            err(f"sharedVolume.claimName: {vol.claim_name!r} is not a valid PersistentVolumeClaim name")
        if _absolute(err, "sharedVolume.mountPath", vol.mount_path):
            for path, owner in reserved.items():
                if _overlaps(vol.mount_path, path):
                    err(f"sharedVolume.mountPath: {vol.mount_path!r} overlaps {path} ({owner})")

    sched = spec.scheduling
    if sched.gpu_product is not None:
        if not spec.gpu:
            err("scheduling.gpuProduct: only for GPU jobs (gpu: true)")
        if not _label_value_ok(sched.gpu_product):
            err(f"scheduling.gpuProduct: {sched.gpu_product!r} is not a node label value, e.g. NVIDIA-A100-SXM4-80GB")
    if not _label_key_ok(sched.gpu_product_label):
        err(f"scheduling.gpuProductLabel: {sched.gpu_product_label!r} is not a label key")
    for key, value in sched.node_selector.items():
        where = f"scheduling.nodeSelector.{key}"
        if not _label_key_ok(key):
            err(f"{where}: {key!r} is not a label key")
        elif not _label_value_ok(value):
            err(f"{where}: {value!r} is not a label value")
    for i, tol in enumerate(sched.tolerations or ()):
        _toleration(err, f"scheduling.tolerations[{i}]", tol)
    if sched.priority_class_name is not None and not DNS1123_SUBDOMAIN.match(sched.priority_class_name):
        err(f"scheduling.priorityClassName: {sched.priority_class_name!r} is not a PriorityClass name")

    rp = spec.run_policy
    _one_of(err, "runPolicy.cleanPodPolicy", rp.clean_pod_policy, CLEAN_POD_POLICIES)
    _at_least(err, "runPolicy.backoffLimit", rp.backoff_limit, 0)
    _at_least(err, "runPolicy.ttlSecondsAfterFinished", rp.ttl_seconds_after_finished, 0)
    _at_least(err, "runPolicy.activeDeadlineSeconds", rp.active_deadline_seconds, 1)
    if gang := rp.scheduling_policy:
        _at_least(err, "runPolicy.schedulingPolicy.minAvailable", gang.min_available, 1)
        if gang.min_available is not None and gang.min_available > max_workers + 1:
            err(f"runPolicy.schedulingPolicy.minAvailable: must be <= {max_workers + 1} (workers + launcher)")
        _at_least(err, "runPolicy.schedulingPolicy.scheduleTimeoutSeconds", gang.schedule_timeout_seconds, 1)
        for key, value in (gang.min_resources or {}).items():
            _quantity(err, f"runPolicy.schedulingPolicy.minResources.{key}", value)

    _one_of(err, "restartPolicy.launcher", spec.restart_policy.launcher, RESTART_POLICIES)
    _one_of(err, "restartPolicy.worker", spec.restart_policy.worker, RESTART_POLICIES)
    _one_of(err, "launcherCreationPolicy", spec.launcher_creation_policy, LAUNCHER_CREATION_POLICIES)
    if spec.mpi_implementation != "OpenMPI":
        err(f"mpiImplementation: {spec.mpi_implementation!r}: hvdk8s launches with Open MPI's mpirun; only OpenMPI")
    if spec.user:
        _at_least(err, "user.uid", spec.user.uid, 1)
        if not USER_NAME.match(spec.user.name):
            err(f"user.name: {spec.user.name!r} is not a user name")
    _absolute(err, "sshAuthMountPath", spec.ssh_auth_mount_path or "")
    _port(err, "sshPort", spec.ssh_port)

    if el := spec.elastic:
        _at_least(err, "elastic.minWorkers", el.min_workers, 1)
        if el.max_workers < el.min_workers:
            err(f"elastic.maxWorkers: must be >= elastic.minWorkers ({el.min_workers})")
        elif not el.min_workers <= spec.workers <= el.max_workers:
            err(f"workers: must be between elastic.minWorkers ({el.min_workers}) and elastic.maxWorkers ({el.max_workers})")

    if spec.metrics.enabled:
        last = spec.metrics.port + max(spec.slots_per_worker, 1) - 1
        if _port(err, "metrics.port", spec.metrics.port) and last > 65535:
            err(f"metrics.port: ranks use ports {spec.metrics.port}..{last}, past 65535")
        elif spec.metrics.port <= spec.ssh_port <= last:
            err(f"metrics.port: ranks use ports {spec.metrics.port}..{last}, which include sshPort {spec.ssh_port}")
        if not spec.metrics.path.startswith("/"):
            err(f"metrics.path: {spec.metrics.path!r} must start with /")
    _at_least(err, "horovod.fusionThreshold", spec.horovod.fusion_threshold, 0)
    if spec.horovod.timeline is not None:
        _absolute(err, "horovod.timeline", spec.horovod.timeline)
    _one_of(err, "nccl.debug", spec.nccl.debug, NCCL_DEBUG_LEVELS)
    return errors


# ---- MPIJob manifests ------------------------------------------------------

_SPEC_FIELDS = {
    "slotsPerWorker", "runLauncherAsWorker", "runPolicy", "mpiReplicaSpecs",
    "sshAuthMountPath", "launcherCreationPolicy", "mpiImplementation",
}  # fmt: skip
_RUN_POLICY_FIELDS = {
    "cleanPodPolicy", "ttlSecondsAfterFinished", "activeDeadlineSeconds", "backoffLimit",
    "schedulingPolicy", "suspend", "managedBy",
}  # fmt: skip
_REPLICA_FIELDS = {"replicas", "template", "restartPolicy"}


def check_manifest(manifest: Mapping[str, Any]) -> list[str]:
    """The MPI Operator's validation of an MPIJob (after its defaulting)."""
    errors: list[str] = []
    err = errors.append
    if manifest.get("apiVersion") != API_VERSION or manifest.get("kind") != KIND:
        return [f"apiVersion/kind: {manifest.get('apiVersion')}/{manifest.get('kind')}: expected {API_VERSION} {KIND}"]
    spec = manifest.get("spec")
    if not isinstance(spec, Mapping):
        return ["spec: required"]
    _unknown(err, "spec", spec, _SPEC_FIELDS)
    run_policy = spec.get("runPolicy") or {}
    _unknown(err, "spec.runPolicy", run_policy, _RUN_POLICY_FIELDS)
    replica_specs = spec.get("mpiReplicaSpecs")
    if not isinstance(replica_specs, Mapping):
        err("spec.mpiReplicaSpecs: must have replica specs")
        replica_specs = {}
    _unknown(err, "spec.mpiReplicaSpecs", replica_specs, {"Launcher", "Worker"})
    launcher, worker = replica_specs.get("Launcher"), replica_specs.get("Worker")
    slots = spec.get("slotsPerWorker", 1)

    workers = worker.get("replicas", 0) if isinstance(worker, Mapping) else 0
    name = (manifest.get("metadata") or {}).get("name", "")
    if problem := _pod_hostname_problem(name, workers if isinstance(workers, int) else 1):
        err(f"metadata.name: {problem}")
    if not isinstance(slots, int) or slots < 0:
        err(f"spec.slotsPerWorker: {slots!r}: must be >= 0")
    _one_of(err, "spec.runPolicy.cleanPodPolicy", run_policy.get("cleanPodPolicy", "None"), CLEAN_POD_POLICIES)
    for key in ("ttlSecondsAfterFinished", "activeDeadlineSeconds", "backoffLimit"):
        _at_least(err, f"spec.runPolicy.{key}", run_policy.get(key), 0)
    if not spec.get("sshAuthMountPath", "/root/.ssh"):
        err("spec.sshAuthMountPath: must have a mount path for SSH credentials")
    _one_of(err, "spec.mpiImplementation", spec.get("mpiImplementation", "OpenMPI"), MPI_IMPLEMENTATIONS)
    _one_of(err, "spec.launcherCreationPolicy", spec.get("launcherCreationPolicy", "AtStartup"), LAUNCHER_CREATION_POLICIES)

    for role, replica, default_restart in (("Launcher", launcher, "OnFailure"), ("Worker", worker, "Never")):
        path = f"spec.mpiReplicaSpecs[{role}]"
        if replica is None:
            if role == "Launcher":
                err(f"{path}: must have Launcher replica spec")
            continue
        if not isinstance(replica, Mapping):
            err(f"{path}: must be a mapping")
            continue
        _unknown(err, path, replica, _REPLICA_FIELDS)
        _one_of(err, f"{path}.restartPolicy", replica.get("restartPolicy", default_restart), RESTART_POLICIES)
        replicas = replica.get("replicas", 1 if role == "Launcher" else 0)
        if role == "Launcher" and replicas != 1:
            err(f"{path}.replicas: {replicas!r}: must be 1")
        if role == "Worker" and (not isinstance(replicas, int) or replicas < 1):
            err(f"{path}.replicas: {replicas!r}: must be >= 1")
        if not _containers(replica):
            err(f"{path}.template.spec.containers: must define at least one container")

    if not errors:  # hvdk8s's invariants, on an otherwise valid MPIJob
        _check_np(err, _containers(launcher), workers * slots)
        _check_gpus(err, _containers(worker), slots)
    return errors


def _check_np(err: Err, containers: list[Any], expected: int) -> None:
    """-np of the launcher's mpirun/horovodrun must fill exactly the hostfile's slots."""
    if not containers or not isinstance(containers[0], Mapping):
        return
    argv = [str(a) for a in (containers[0].get("command") or []) + (containers[0].get("args") or [])]
    if not argv or argv[0].rsplit("/", 1)[-1] not in ("mpirun", "horovodrun"):
        return
    for flag in ("-np", "-n"):
        if flag in argv[:-1]:
            value = argv[argv.index(flag) + 1]
            if value != str(expected):
                err(
                    f"spec.mpiReplicaSpecs[Launcher].template.spec.containers[0].command: {argv[0]} {flag} {value}, "
                    f"but Worker replicas x slotsPerWorker = {expected}"
                )
            return


def _check_gpus(err: Err, containers: list[Any], slots: int) -> None:
    if not containers or not isinstance(containers[0], Mapping):
        return
    limits = (containers[0].get("resources") or {}).get("limits") or {}
    if GPU_RESOURCE in limits and str(limits[GPU_RESOURCE]) != str(slots):
        err(
            f"spec.mpiReplicaSpecs[Worker].template.spec.containers[0].resources.limits.{GPU_RESOURCE}: "
            f"{limits[GPU_RESOURCE]}, but slotsPerWorker = {slots} (one rank per GPU)"
        )


def _containers(replica: Any) -> list[Any]:
    if not isinstance(replica, Mapping):  # e.g. no Worker: the operator allows launcher-only jobs
        return []
    containers = ((replica.get("template") or {}).get("spec") or {}).get("containers")
    return containers if isinstance(containers, list) else []


# ---- small rules -----------------------------------------------------------


def _dns1035(host: str) -> str | None:
    if len(host) > 63:
        return f"is {len(host)} characters; a DNS-1035 label has at most 63 (shorten the name)"
    if not DNS1035_LABEL.match(host):
        return "is not a DNS-1035 label (lowercase letters, digits and '-', starting with a letter)"
    return None


def _one_of(err: Err, path: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        err(f"{path}: {value!r} is not one of {', '.join(allowed)}")


def _at_least(err: Err, path: str, value: Any, low: int) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < low):
        err(f"{path}: must be >= {low}, got {value!r}")


def _quantity(err: Err, path: str, value: str) -> None:
    if not QUANTITY.match(value):
        err(f"{path}: {value!r} is not a Kubernetes quantity (e.g. 500m, 2, 4Gi)")


def _absolute(err: Err, path: str, value: str) -> bool:
    if not value.startswith("/"):
        err(f"{path}: {value!r} must be an absolute path")
        return False
    return True


def _port(err: Err, path: str, value: int) -> bool:
    if not 1 <= value <= 65535:
        err(f"{path}: {value} is not a port (1-65535)")
        return False
    return True


def _overlaps(a: str, b: str) -> bool:
    a, b = a.rstrip("/") + "/", b.rstrip("/") + "/"
    return a.startswith(b) or b.startswith(a)


def _pod_hostname_problem(name: str, workers: int) -> str | None:
    """What is wrong with the job's longest pod hostname, ``<name>-worker-<N-1>`` (``<name>-launcher`` is never longer)."""
    host = f"{name}-worker-{max(workers, 1) - 1}"
    problem = _dns1035(host)
    return f"pod hostname {host!r} {problem}" if problem else None


def _label_value_ok(value: str) -> bool:
    return len(value) <= 63 and bool(LABEL_VALUE.match(value))


def _label_key_ok(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not DNS1123_SUBDOMAIN.match(prefix)):
        return False
    return len(name) <= 63 and bool(LABEL_NAME.match(name))


def _toleration(err: Err, path: str, tol: Toleration) -> None:
    _one_of(err, f"{path}.operator", tol.operator, ("Equal", "Exists"))
    if tol.effect is not None:
        _one_of(err, f"{path}.effect", tol.effect, TAINT_EFFECTS)
    if tol.operator == "Exists" and tol.value:
        err(f"{path}.value: must be empty when operator is Exists")
    if tol.key is None and tol.operator != "Exists":
        err(f"{path}.operator: must be Exists when key is empty")
    if tol.toleration_seconds is not None and tol.effect != "NoExecute":
        err(f"{path}.tolerationSeconds: only with effect NoExecute")


def _unknown(err: Err, path: str, obj: Any, known: set[str]) -> None:
    if isinstance(obj, Mapping):
        for key in obj:
            if key not in known:
                err(f"{path}.{key}: unknown field (known: {', '.join(sorted(known))})")
