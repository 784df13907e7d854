"""Validation: of defaulted job specs (paths as written in the job file) and of
MPIJob manifests (the MPI Operator's own rules, MPIJob paths).

Runs after ``defaults``, as the operator's validation.go runs after its default.go: ``check_spec``
gets the spec ``with_defaults`` returned (``files``: parse -> default -> validate -> render), and
``check_manifest`` checks what ``manifest_defaults`` leaves of a manifest whose fields have the CRD's
types (checked first, as the API server checks its schema first).

Shaped like the operator's ``pkg/apis/kubeflow/validation``: one validator per
section, each returning field errors (kind, path, detail), all collected at
once. The operator validates an MPIJob only after the API server has stored
it; on an invalid one it records a Warning event (ValidationError) and does
nothing else: no condition, no pods. Checking here turns that silence into an
error at render or submit time. hvdk8s adds its own invariant (-np fills the
hostfile; a ready-made MPIJob whose GPUs per worker differ from its slots is
warned about, not refused) and refuses combinations the operator
accepts but no scheduler will run (see ``_check_gang`` and ``_check_launcher_creation``: MPIJob only).
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from hvdk8s.common import fields
from hvdk8s.common.fields import (
    INT32_MAX,
    INT64_MAX,
    MULTIKUEUE,
    FieldError,
    at_least,
    forbidden,
    invalid,
    join,
    one_of,
    quantity,
    required,
)
from hvdk8s.launcher.mpirun import OWNED_MCA, mca_problems, tcp_eager_limit_problem
from hvdk8s.mpijob import parse
from hvdk8s.mpijob.defaults import created_suspended, manifest_defaults
from hvdk8s.mpijob.render import API_VERSION, GENERATED_ENV, KIND, LAUNCHER_COMMANDS
from hvdk8s.mpijob.spec import (
    GPU_RESOURCE,
    ISTIO_INJECT,
    MPI_CONFIG_DIR,
    CleanPodPolicy,
    JobSpec,
    LauncherCreationPolicy,
    ManagedBy,
    MPIImplementation,
    OpenMpi,
    RestartPolicyName,
    Toleration,
    allowed,
)

MCA_ENV = "OMPI_MCA_"  # Open MPI reads its parameters from these variables too
USER_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}\Z")
CAPABILITY = re.compile(r"^[A-Z][A-Z_]*\Z")
AFFINITY_KINDS = ("nodeAffinity", "podAffinity", "podAntiAffinity")


# ---- job specs: one validator per section ------------------------------------


def check_spec(spec: JobSpec, path: str = "", api: str = "mpijob") -> list[FieldError]:
    """Every problem of a defaulted spec, each at its job-file path under ``path`` (a pipeline
    passes ``candidates[i].job``). With ``api="trainjob"`` the MPI Operator's launcher-creation and
    PodGroup rules are left out: ``render_trainjob`` sets its own launcherCreationPolicy and drops
    ``schedulingPolicy`` (JobSet's dependsOn does the waiting), so they would refuse valid TrainJobs."""
    operator_only = (_check_gang, _check_launcher_creation) if api == "mpijob" else ()
    return [
        error
        for section in (_check_identity, _check_metadata, _check_size, _check_resources, _check_env, _check_volumes,
                        _check_scheduling, _check_network, _check_run_policy, *operator_only, _check_queueing,
                        _check_mpi, _check_metrics)
        for error in section(spec, path)
    ]


def _check_identity(spec: JobSpec, path: str) -> list[FieldError]:
    errors = []
    if problem := pod_hostname_problem(spec.name, spec.elastic.max_workers if spec.elastic else spec.workers):
        errors.append(invalid(join(path, "name"), problem))
    if spec.namespace is not None and (problem := fields.name_problem(spec.namespace, "DNS-1123 label")):
        errors.append(invalid(join(path, "namespace"), f"{spec.namespace!r} {problem}"))
    if not spec.image or any(c.isspace() for c in spec.image):
        errors.append(invalid(join(path, "image"), f"{spec.image!r} is not an image reference"))
    if not spec.command:
        errors.append(required(join(path, "command"), "must not be empty"))
    errors += [required(join(path, "command", i), "must not be empty") for i, arg in enumerate(spec.command) if not arg]
    return errors


def _check_metadata(spec: JobSpec, path: str) -> list[FieldError]:
    errors = [
        *fields.labels_errors(join(path, "labels"), spec.labels),
        *fields.labels_errors(join(path, "annotations"), spec.annotations, values=False),
        *fields.labels_errors(join(path, "podAnnotations"), spec.pod_annotations, values=False),
    ]
    if ISTIO_INJECT in spec.pod_annotations:
        errors.append(forbidden(join(path, "podAnnotations", ISTIO_INJECT), f"set it as labels.{ISTIO_INJECT}: Istio "
                                "reads the label (the annotation is deprecated), and hvdk8s's default label would "
                                "win over it"))
    if spec.queue is not None and not fields.is_label_value(spec.queue):
        errors.append(invalid(join(path, "queue"), f"{spec.queue!r} is not a LocalQueue name (a label value)"))
    names = (("serviceAccountName",), spec.service_account_name), (("schedulerName",), spec.scheduler_name), *(
        (("imagePullSecrets", i), secret) for i, secret in enumerate(spec.image_pull_secrets))
    for keys, name in names:
        if name is not None and (problem := fields.name_problem(name, "DNS-1123 subdomain")):
            errors.append(invalid(join(path, *keys), f"{name!r} {problem}"))
    return errors


def _check_size(spec: JobSpec, path: str) -> list[FieldError]:
    # A launcher that runs ranks may be the only pod (the operator allows no Worker). Worker replicas and
    # slotsPerWorker are int32 in the MPIJob CRD.
    errors = at_least(join(path, "workers"), spec.workers, 0 if spec.run_launcher_as_worker else 1, INT32_MAX)
    if spec.slots_per_worker == 0:
        errors.append(invalid(join(path, "slotsPerWorker"), "0 slots give mpirun no host to start a rank on: "
                              "set the ranks per worker (= GPUs per worker with gpu: true)"))
    else:
        errors += at_least(join(path, "slotsPerWorker"), spec.slots_per_worker, 1, INT32_MAX)
    if el := spec.elastic:
        errors += at_least(join(path, "elastic", "minWorkers"), el.min_workers, 1, INT32_MAX)
        if el.max_workers < el.min_workers:
            errors.append(invalid(join(path, "elastic", "maxWorkers"), f"must be >= elastic.minWorkers ({el.min_workers})"))
        elif not el.min_workers <= spec.workers <= el.max_workers:
            errors.append(invalid(join(path, "workers"), f"must be between elastic.minWorkers ({el.min_workers}) "
                                  f"and elastic.maxWorkers ({el.max_workers})"))
        if spec.run_launcher_as_worker:
            errors.append(forbidden(join(path, "runLauncherAsWorker"), "not with elastic: Horovod's elastic driver "
                                    "runs on the launcher and discovers only worker pods"))
    return errors


def _check_resources(spec: JobSpec, path: str) -> list[FieldError]:
    errors = []
    for role in ("worker", "launcher"):
        res, where = getattr(spec.resources, role), join(path, "resources", role)
        errors += quantity(join(where, "cpu"), res.cpu) + quantity(join(where, "memory"), res.memory)
        for name, value in res.extra.items():
            key = join(where, "extra", name)
            if name in ("cpu", "memory", GPU_RESOURCE):
                errors.append(invalid(key, f"set {name} with resources.{role}.{name}"
                                      if name != GPU_RESOURCE else "set GPUs with gpu: true and slotsPerWorker"))
            elif not fields.is_label_key(name):
                errors.append(invalid(key, f"{name!r} is not a resource name"))
            else:
                errors += quantity(key, value)
    if spec.shm_size is not None:
        errors += quantity(join(path, "shmSize"), spec.shm_size)
    return errors


def _check_env(spec: JobSpec, path: str) -> list[FieldError]:
    errors = []
    for name in spec.env:
        where = join(path, "env", name)
        if not fields.ENV_NAME.match(name):
            errors.append(invalid(where, "not a valid environment variable name"))
        elif name in GENERATED_ENV:
            errors.append(forbidden(where, f"set by hvdk8s from {GENERATED_ENV[name]}; set it there"))
        elif name.startswith(MCA_ENV) and name[len(MCA_ENV):] in OWNED_MCA:
            errors.append(forbidden(where, OWNED_MCA[name[len(MCA_ENV):]]))
    return errors


def _check_volumes(spec: JobSpec, path: str) -> list[FieldError]:
    vol = spec.shared_volume
    if vol is None:
        return []
    errors = []
    if problem := fields.name_problem(vol.claim_name, "DNS-1123 subdomain"):
        errors.append(invalid(join(path, "sharedVolume", "claimName"), f"{vol.claim_name!r} {problem}"))
    reserved = {"/dev/shm": "shmSize", MPI_CONFIG_DIR: "the MPI Operator's hostfile",
                spec.ssh_auth_mount_path or "": "sshAuthMountPath"}
    mount_path = join(path, "sharedVolume", "mountPath")
    if not (errors := errors + _absolute(mount_path, vol.mount_path)):
        errors += [invalid(mount_path, f"{vol.mount_path!r} overlaps {reserved_path} ({owner})")
                   for reserved_path, owner in reserved.items() if _overlaps(vol.mount_path, reserved_path)]
    return errors


def _check_scheduling(spec: JobSpec, path: str) -> list[FieldError]:
    sched, errors, where = spec.scheduling, [], join(path, "scheduling")
    if sched.gpu_product is not None:
        if not spec.gpu:
            errors.append(invalid(join(where, "gpuProduct"), "only for GPU jobs (gpu: true)"))
        if not fields.is_label_value(sched.gpu_product):
            errors.append(invalid(join(where, "gpuProduct"), f"{sched.gpu_product!r} is not a node label value, "
                                  "e.g. NVIDIA-A100-SXM4-80GB"))
    if not fields.is_label_key(sched.gpu_product_label):
        errors.append(invalid(join(where, "gpuProductLabel"), f"{sched.gpu_product_label!r} is not a label key"))
    errors += fields.labels_errors(join(where, "nodeSelector"), sched.node_selector)
    for i, tol in enumerate(sched.tolerations or ()):
        errors += _toleration(join(where, "tolerations", i), tol)
    if sched.priority_class_name is not None and (
        problem := fields.name_problem(sched.priority_class_name, "DNS-1123 subdomain")
    ):
        errors.append(invalid(join(where, "priorityClassName"), f"{sched.priority_class_name!r} {problem}"))
    # The rest of these objects is the pod schema's, which the API server applies on create.
    if spec.affinity is not None:
        if not isinstance(spec.affinity, Mapping):
            errors.append(invalid(join(path, "affinity"), "must be a mapping (a Kubernetes Affinity)"))
        else:
            errors += [FieldError("NotSupported", join(path, "affinity", key),
                                  f"unknown field (known: {', '.join(AFFINITY_KINDS)})")
                       for key in spec.affinity if key not in AFFINITY_KINDS]
    for i, constraint in enumerate(spec.topology_spread_constraints):
        if not isinstance(constraint, Mapping) or not {"maxSkew", "topologyKey", "whenUnsatisfiable"} <= set(constraint):
            errors.append(required(join(path, "topologySpreadConstraints", i),
                                   "needs maxSkew, topologyKey and whenUnsatisfiable (a TopologySpreadConstraint)"))
    return errors


def _check_network(spec: JobSpec, path: str) -> list[FieldError]:
    errors = [invalid(join(path, "capabilities", i), f"{cap!r} is not a Linux capability name (e.g. IPC_LOCK)")
              for i, cap in enumerate(spec.capabilities) if not CAPABILITY.match(cap)]
    errors += _port(join(path, "sshPort"), spec.ssh_port)
    errors += at_least(join(path, "workerWaitSeconds"), spec.worker_wait_seconds, 1)
    return errors


def _check_run_policy(spec: JobSpec, path: str) -> list[FieldError]:
    rp, where = spec.run_policy, join(path, "runPolicy")
    errors = [
        *at_least(join(where, "backoffLimit"), rp.backoff_limit, 0, INT32_MAX),  # the CRD's integer formats
        *at_least(join(where, "ttlSecondsAfterFinished"), rp.ttl_seconds_after_finished, 0, INT32_MAX),
        *at_least(join(where, "activeDeadlineSeconds"), rp.active_deadline_seconds, 1, INT64_MAX),
    ]
    if gang := rp.scheduling_policy:
        where = join(where, "schedulingPolicy")
        errors += at_least(join(where, "minAvailable"), gang.min_available, 1, INT32_MAX)
        errors += at_least(join(where, "scheduleTimeoutSeconds"), gang.schedule_timeout_seconds, 1, INT32_MAX)
        if spec.scheduler_name == "volcano" and gang.schedule_timeout_seconds is not None:
            errors.append(forbidden(join(where, "scheduleTimeoutSeconds"), "Volcano ignores it (the MPI Operator's "
                                    "VolcanoCtrl does not pass it to the PodGroup; only the scheduler-plugins "
                                    "coscheduling gang reads it): remove it"))
        for key, value in (gang.min_resources or {}).items():
            errors += quantity(join(where, "minResources", key), value)
    return errors


def _check_gang(spec: JobSpec, path: str) -> list[FieldError]:
    """A PodGroup's minAvailable must be reachable by the pods that exist together."""
    gang = spec.run_policy.scheduling_policy
    if gang is None or gang.min_available is None:
        return []
    where = join(path, "runPolicy", "schedulingPolicy", "minAvailable")
    max_workers = spec.elastic.max_workers if spec.elastic else spec.workers
    if not 1 <= gang.min_available <= INT32_MAX or max_workers < 0:
        return []  # their own errors say why
    if gang.min_available > max_workers + 1:
        return [invalid(where, f"{gang.min_available} is more than the job's pods ({max_workers} workers + launcher)")]
    waits = spec.launcher_creation_policy == "WaitForWorkersReady" and max_workers > 0
    if waits and gang.min_available > max_workers:
        return [invalid(where, f"{gang.min_available} counts the launcher, but launcherCreationPolicy: "
                        f"WaitForWorkersReady creates it only once the workers run, and a gang scheduler runs none "
                        f"of them before {gang.min_available} pods exist: the job would never start (mpi-operator "
                        f"issue 608). Use at most {max_workers}, or launcherCreationPolicy: AtStartup")]
    return []


def _check_launcher_creation(spec: JobSpec, path: str) -> list[FieldError]:
    """The MPI Operator's launcher creation under suspension: a policy it does not honour."""
    if spec.launcher_creation_policy == "WaitForWorkersReady" and created_suspended(spec):
        why = "queue (Kueue creates it suspended)" if spec.queue else "runPolicy.suspend: true"
        return [forbidden(join(path, "launcherCreationPolicy"), f"WaitForWorkersReady does not hold with {why}: "
                          "the operator creates the launcher while no worker exists and starts it together "
                          "with them on resume (mpi-operator issue 615). Leave it unset: hvdk8s then "
                          "renders AtStartup and the launcher waits for the workers' sshd itself")]
    return []


def _check_queueing(spec: JobSpec, path: str) -> list[FieldError]:
    """Kueue and managedBy: combinations under which the job never runs as written."""
    if spec.run_policy.managed_by == MULTIKUEUE and spec.queue is None:
        return [required(join(path, "queue"), f"runPolicy.managedBy: {MULTIKUEUE} hands the job to MultiKueue, "
                         "which only dispatches queued jobs: set queue to a LocalQueue with MultiKueue")]
    return []


def _check_mpi(spec: JobSpec, path: str) -> list[FieldError]:
    errors = []
    if spec.mpi_implementation != "OpenMPI":
        errors.append(FieldError("NotSupported", join(path, "mpiImplementation"), f"{spec.mpi_implementation!r}: "
                                 "hvdk8s launches with Open MPI's mpirun; only OpenMPI"))
    if spec.user:
        errors += at_least(join(path, "user", "uid"), spec.user.uid, 1, INT64_MAX)  # runAsUser: int64
        if not USER_NAME.match(spec.user.name):
            errors.append(invalid(join(path, "user", "name"), f"{spec.user.name!r} is not a user name"))
    errors += _absolute(join(path, "sshAuthMountPath"), spec.ssh_auth_mount_path or "")
    errors += [invalid(join(path, "openMpi", "mca", name), problem)
               for name, problem in mca_problems(spec.open_mpi.mca).items()]
    if problem := tcp_eager_limit_problem(spec.open_mpi.tcp_eager_limit):
        errors.append(invalid(join(path, "openMpi", "tcpEagerLimit"), problem))
    if spec.elastic and spec.open_mpi != OpenMpi():
        errors.append(forbidden(join(path, "openMpi"), "not with elastic: elastic jobs run horovodrun over Gloo, "
                                "not mpirun"))
    return errors


def _check_metrics(spec: JobSpec, path: str) -> list[FieldError]:
    hvd, where = spec.horovod, join(path, "horovod")
    errors = at_least(join(where, "fusionThreshold"), hvd.fusion_threshold, 0)
    if hvd.cycle_time_ms is not None and not hvd.cycle_time_ms > 0:
        errors.append(invalid(join(where, "cycleTimeMs"), f"must be > 0 (milliseconds), got {hvd.cycle_time_ms:g}"))
    if hvd.cache_capacity is not None:
        errors += at_least(join(where, "cacheCapacity"), hvd.cache_capacity, 0)
    if hvd.timeline is not None:
        errors += _absolute(join(where, "timeline"), hvd.timeline)
    if not spec.metrics.enabled:
        return errors
    # Local ranks' ports: as many as slotsPerWorker, once it is valid (else its own error says why).
    ranks = spec.slots_per_worker if 1 <= spec.slots_per_worker <= INT32_MAX else 1
    port, last, where = spec.metrics.port, spec.metrics.port + ranks - 1, join(path, "metrics")
    if bad_port := _port(join(where, "port"), port):
        errors += bad_port
    elif last > 65535:
        errors.append(invalid(join(where, "port"), f"ranks use ports {port}..{last}, past 65535"))
    elif port <= spec.ssh_port <= last:
        errors.append(invalid(join(where, "port"), f"ranks use ports {port}..{last}, which include sshPort "
                              f"{spec.ssh_port}"))
    if not spec.metrics.path.startswith("/"):
        errors.append(invalid(join(where, "path"), f"{spec.metrics.path!r} must start with /"))
    return errors


# ---- MPIJob manifests: the operator's rules, after its defaulting -------------

_SPEC_FIELDS = {
    "slotsPerWorker", "runLauncherAsWorker", "runPolicy", "mpiReplicaSpecs",
    "sshAuthMountPath", "launcherCreationPolicy", "mpiImplementation",
}  # fmt: skip
_RUN_POLICY_FIELDS = {
    "cleanPodPolicy", "ttlSecondsAfterFinished", "activeDeadlineSeconds", "backoffLimit",
    "schedulingPolicy", "suspend", "managedBy",
}  # fmt: skip
_REPLICA_FIELDS = {"replicas", "template", "restartPolicy"}

# The types the MPI Operator's v2beta1 CRD (its openAPIV3Schema, with the pod template's) gives every field
# these rules, ``manifest_defaults`` and ``manifest_warnings`` read, and their neighbours: checked first, as
# the API server checks an object's schema before anything reads it. A dict lists a mapping's fields (the
# others are left to the API server), ``"*"`` types every value of a map (``"[*]"`` too, its keys written
# ``[key]`` like the operator's replica types), a one-item list a list's items; null is absent, as the
# API server prunes it. Quantities as resource.Quantity (a string or an integer) that is not negative.
_CONTAINER_SHAPE: dict[str, Any] = {
    "name": "string", "image": "string", "command": ["string"], "args": ["string"],
    "env": [{"name": "string", "value": "string"}],
    "resources": {"limits": {"*": "quantity"}, "requests": {"*": "quantity"}},
}  # fmt: skip
_OBJECT_META_SHAPE: dict[str, Any] = {"name": "string", "namespace": "string", "labels": {"*": "string"},
                                      "annotations": {"*": "string"}}
_MPIJOB_SHAPE: dict[str, Any] = {
    "metadata": _OBJECT_META_SHAPE,
    "spec": {
        "slotsPerWorker": "int32", "runLauncherAsWorker": "boolean", "sshAuthMountPath": "string",
        "launcherCreationPolicy": "string", "mpiImplementation": "string",
        "runPolicy": {
            "cleanPodPolicy": "string", "ttlSecondsAfterFinished": "int32", "activeDeadlineSeconds": "int64",
            "backoffLimit": "int32", "suspend": "boolean", "managedBy": "string",
            "schedulingPolicy": {"minAvailable": "int32", "queue": "string", "priorityClass": "string",
                                 "scheduleTimeoutSeconds": "int32", "minResources": {"*": "quantity"}},
        },
        "mpiReplicaSpecs": {"[*]": {
            "replicas": "int32", "restartPolicy": "string",
            "template": {
                "metadata": _OBJECT_META_SHAPE,
                "spec": {"containers": [_CONTAINER_SHAPE], "initContainers": [_CONTAINER_SHAPE],
                         "volumes": [{"name": "string"}]},
            },
        }},
    },
}  # fmt: skip
_INT_RANGES = {"int32": (-(2**31), INT32_MAX), "int64": (-(2**63), INT64_MAX)}


def check_manifest(manifest: Mapping[str, Any], path: str = "") -> list[FieldError]:
    """The MPI Operator's validation of an MPIJob (``ValidateMPIJob``, which hands ``spec``'s path down
    the same way), then hvdk8s's -np rule; paths under ``path``. First the types of the fields they read
    (``_MPIJOB_SHAPE``): a field of the wrong type is the only error then, as no rule can read it."""
    if manifest.get("apiVersion") != API_VERSION or manifest.get("kind") != KIND:
        return [invalid(join(path, "apiVersion/kind"), f"{manifest.get('apiVersion')}/{manifest.get('kind')}: "
                        f"expected {API_VERSION} {KIND}")]
    where = join(path, "spec")
    if not isinstance(manifest.get("spec"), Mapping):
        return [required(where)]
    if shape_errors := _shape(manifest, _MPIJOB_SHAPE, path):
        return shape_errors  # the rules below read these fields as the CRD types them
    spec = manifest_defaults(manifest)
    replicas = spec.get("mpiReplicaSpecs")
    errors = [
        *_unknown(where, manifest["spec"], _SPEC_FIELDS),
        *_check_manifest_name(manifest, spec, join(path, "metadata", "name")),
        *_check_manifest_spec(spec, where),
        *_check_manifest_run_policy(spec["runPolicy"], join(where, "runPolicy")),
    ]
    where = join(where, "mpiReplicaSpecs")
    if not isinstance(replicas, Mapping):
        return [*errors, required(where, "must have replica specs")]
    errors += _unknown(where, replicas, {"Launcher", "Worker"})
    errors += _check_replica("Launcher", replicas.get("Launcher"), f"{where}[Launcher]")
    errors += _check_replica("Worker", replicas.get("Worker"), f"{where}[Worker]")
    return errors or _check_np(spec, join(f"{where}[Launcher]", "template", "spec", "containers", 0, "command"))


def manifest_warnings(manifest: Mapping[str, Any]) -> list[str]:
    """What the operator allows but is likely a mistake in a ready-made MPIJob."""
    spec = manifest_defaults(manifest)
    worker = (spec.get("mpiReplicaSpecs") or {}).get("Worker")
    containers = _containers(worker)
    limits = ((containers[0].get("resources") or {}).get("limits") or {}) if containers else {}
    gpus, slots = limits.get(GPU_RESOURCE), spec["slotsPerWorker"]
    if gpus is not None and str(gpus) != str(slots):
        return [f"spec.mpiReplicaSpecs[Worker].template.spec.containers[0].resources.limits.{GPU_RESOURCE}: "
                f"{gpus} GPUs per worker, but slotsPerWorker = {slots}: hvdk8s renders one rank per GPU"]
    return []


def _check_manifest_name(manifest: Mapping[str, Any], spec: Mapping[str, Any], path: str) -> list[FieldError]:
    name = (manifest.get("metadata") or {}).get("name")
    if not name:  # generateName leaves the pods' hostnames unknown until the API server picks one
        return [required(path, "required (the pods' hostnames are <name>-worker-<i>)")]
    worker = (spec.get("mpiReplicaSpecs") or {}).get("Worker")
    workers = worker.get("replicas") if isinstance(worker, Mapping) else 1
    problem = pod_hostname_problem(name, workers if isinstance(workers, int) else 1)
    return [invalid(path, problem)] if problem else []


def _check_manifest_spec(spec: Mapping[str, Any], path: str) -> list[FieldError]:
    errors = at_least(join(path, "slotsPerWorker"), spec["slotsPerWorker"], 0)
    if not spec["sshAuthMountPath"]:
        errors.append(required(join(path, "sshAuthMountPath"), "must have a mount path for SSH credentials"))
    errors += one_of(join(path, "mpiImplementation"), spec["mpiImplementation"], allowed(MPIImplementation))
    errors += one_of(join(path, "launcherCreationPolicy"), spec["launcherCreationPolicy"],
                     allowed(LauncherCreationPolicy))
    return errors


def _check_manifest_run_policy(run_policy: Mapping[str, Any], path: str) -> list[FieldError]:
    errors = _unknown(path, run_policy, _RUN_POLICY_FIELDS)
    errors += one_of(join(path, "cleanPodPolicy"), run_policy["cleanPodPolicy"], allowed(CleanPodPolicy))
    for key in ("ttlSecondsAfterFinished", "activeDeadlineSeconds", "backoffLimit"):
        errors += at_least(join(path, key), run_policy.get(key), 0)
    if (managed_by := run_policy.get("managedBy")) is not None:
        # Any other controller name: the operator skips the job and nothing else claims it.
        errors += one_of(join(path, "managedBy"), managed_by, allowed(ManagedBy))
    return errors


def _check_replica(role: str, replica: Any, path: str) -> list[FieldError]:
    if replica is None:  # the operator allows launcher-only jobs
        return [required(path, "must have Launcher replica spec")] if role == "Launcher" else []
    if not isinstance(replica, Mapping):
        return [invalid(path, "must be a mapping")]
    errors = _unknown(path, replica, _REPLICA_FIELDS)
    errors += one_of(join(path, "restartPolicy"), replica["restartPolicy"], allowed(RestartPolicyName))
    count = replica["replicas"]
    if role == "Launcher" and count != 1:
        errors.append(invalid(join(path, "replicas"), f"{count!r}: must be 1"))
    if role == "Worker" and (not isinstance(count, int) or count < 1):
        errors.append(invalid(join(path, "replicas"), f"{count!r}: must be >= 1"))
    if not _containers(replica):
        errors.append(required(join(path, "template", "spec", "containers"), "must define at least one container"))
    return errors


def _check_np(spec: Mapping[str, Any], path: str) -> list[FieldError]:
    """-np of the launcher's mpirun/horovodrun (its command, at ``path``) must fill exactly the operator's hostfile."""
    replicas = spec["mpiReplicaSpecs"]
    containers = _containers(replicas.get("Launcher"))
    worker = replicas.get("Worker")
    workers = worker["replicas"] if worker else 0
    as_worker = bool(spec.get("runLauncherAsWorker"))
    hosts = workers + int(as_worker)
    if not containers or not isinstance(containers[0], Mapping) or hosts == 0:
        return []  # no hostfile entries: mpirun starts its ranks on the launcher alone
    argv = [str(a) for a in (containers[0].get("command") or []) + (containers[0].get("args") or [])]
    start = next((i for i, a in enumerate(argv) if a.rsplit("/", 1)[-1] in LAUNCHER_COMMANDS), None)
    if start is None:
        return []
    argv = argv[start:]
    slots = spec["slotsPerWorker"]
    expected = hosts * slots
    for flag in ("-np", "-n"):
        if flag in argv[:-1]:
            value = argv[argv.index(flag) + 1]
            if value == str(expected):
                return []
            hostfile = f"(Worker replicas{' + the launcher' if as_worker else ''}) x slotsPerWorker = {expected}"
            if slots == 0:
                hostfile = "slotsPerWorker = 0: the operator's hostfile offers no slots"
            return [invalid(path, f"{argv[0]} {flag} {value}, but {hostfile}")]
    return []


def _containers(replica: Any) -> list[Any]:
    if not isinstance(replica, Mapping):
        return []
    containers = ((replica.get("template") or {}).get("spec") or {}).get("containers")
    return containers if isinstance(containers, list) else []


def _shape(value: Any, shape: Any, path: str) -> list[FieldError]:
    """Where ``value`` (not null) differs from ``shape`` (see ``_MPIJOB_SHAPE``), each at its path under ``path``."""
    if isinstance(shape, dict):
        if not isinstance(value, Mapping):
            return [parse.type_error(path or "<top level>", "a mapping", value)]
        if "*" in shape:
            items = [(join(path, str(key)), item, shape["*"]) for key, item in value.items()]
        elif "[*]" in shape:
            items = [(f"{path}[{key}]", item, shape["[*]"]) for key, item in value.items()]
        else:
            items = [(join(path, key), value[key], inner) for key, inner in shape.items()
                     if value.get(key) is not None]
        return [error for where, item, inner in items for error in _shape(item, inner, where)]
    if isinstance(shape, list):
        if not isinstance(value, list):
            return [parse.type_error(path, "a list", value)]
        return [error for i, item in enumerate(value) for error in _shape(item, shape[0], join(path, i))]
    integer = isinstance(value, int) and not isinstance(value, bool)
    if shape == "quantity":
        if not (integer or isinstance(value, str)):
            return [parse.type_error(path, "a Kubernetes quantity (a string or an integer)", value)]
        return quantity(path, str(value))
    if shape in _INT_RANGES:
        low, high = _INT_RANGES[shape]
        if not integer:
            return [parse.type_error(path, "an integer", value)]
        return [] if low <= value <= high else [invalid(path, f"{value} is out of range for an {shape} ({low}..{high})")]
    expected = {"string": (str, "a string"), "boolean": (bool, "true or false")}[shape]
    return [] if isinstance(value, expected[0]) else [parse.type_error(path, expected[1], value)]


# ---- small rules -----------------------------------------------------------


def pod_hostname_problem(name: str, workers: int) -> str | None:
    """What is wrong with the job's longest pod hostname, ``<name>-worker-<N-1>`` (``<name>-launcher`` is never longer)."""
    host = f"{name}-worker-{max(workers, 1) - 1}"
    problem = fields.name_problem(host)
    return f"pod hostname {host!r} {problem}" if problem else None


def _absolute(path: str, value: str) -> list[FieldError]:
    return [] if value.startswith("/") else [invalid(path, f"{value!r} must be an absolute path")]


def _port(path: str, value: int) -> list[FieldError]:
    return [] if 1 <= value <= 65535 else [invalid(path, f"{value} is not a port (1-65535)")]


def _overlaps(a: str, b: str) -> bool:
    a, b = a.rstrip("/") + "/", b.rstrip("/") + "/"
    return a.startswith(b) or b.startswith(a)


def _toleration(path: str, tol: Toleration) -> list[FieldError]:
    errors = []
    if tol.operator == "Exists" and tol.value:
        errors.append(invalid(f"{path}.value", "must be empty when operator is Exists"))
    if tol.key is None and tol.operator != "Exists":
        errors.append(invalid(f"{path}.operator", "must be Exists when key is empty"))
    if tol.toleration_seconds is not None and tol.effect != "NoExecute":
        errors.append(invalid(f"{path}.tolerationSeconds", "only with effect NoExecute"))
    return errors


def _unknown(path: str, obj: Any, known: set[str]) -> list[FieldError]:
    if not isinstance(obj, Mapping):
        return []
    return [FieldError("NotSupported", f"{path}.{key}", f"unknown field (known: {', '.join(sorted(known))})")
            for key in obj if key not in known]
