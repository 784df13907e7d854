"""JobSpec -> kubeflow.org/v2beta1 MPIJob manifest (and an optional PodMonitor).

Pure functions building plain dicts in Kubernetes' usual key order. The
launcher runs ``hvdk8s.launcher.mpirun.mpirun_argv`` -- the very command
``hvdk8s run`` runs locally -- against the hostfile the MPI Operator mounts;
workers run sshd and wait for it.
"""
from __future__ import annotations

from typing import Any

from hvdk8s.common.fields import QUEUE_LABEL
from hvdk8s.common.quiet import quiet_tensorflow
from hvdk8s.launcher.mpirun import forwarded_env, horovodrun_argv, mpirun_argv, transport_mca
from hvdk8s.mpijob.spec import (
    DEFAULT_POD_LABELS,
    DISCOVER_HOSTS,
    GPU_RESOURCE,
    LAUNCHER_CONTAINER,
    WORKER_CONTAINER,
    JobSpec,
    Resources,
    Toleration,
)

API_VERSION = "kubeflow.org/v2beta1"
KIND = "MPIJob"
LAUNCHER_COMMANDS = ("mpirun", "horovodrun")
HOSTS_MODULE = ("python", "-m", "hvdk8s.launcher.hosts")
# Seconds (min, max) Horovod keeps a failed elastic host out. Horovod 0.28.1 horovod/runner/elastic/discovery.py
# (HostState._set_cooldown_period) counts the host's failures (never reset), then waits
# min * 2**count + uniform(0, 1) * min, clamped to [min, max]: a replacement pod rejoins after 20-30 s, then
# 40-50 s, 80-90 s, 160-170 s, and a crash-looping one is retried every 300 s from the fifth failure.
BLACKLIST_COOLDOWN = (10, 300)
SHM_VOLUME = "dshm"
SHARED_VOLUME = "shared"
# Variables an ssh-started rank would not see otherwise: orted's session gets
# sshd's minimal environment, so the image's PATH (its Python) and library
# path travel with ``mpirun -x`` like every variable hvdk8s sets.
IMAGE_ENV = ("PATH", "LD_LIBRARY_PATH")
# Names hvdk8s sets itself, with the job-spec field that controls each.
GENERATED_ENV = {
    "HVDK8S_JOB_NAME": "name",
    "HVDK8S_METRICS_PORT": "metrics.port",
    "HOROVOD_FUSION_THRESHOLD": "horovod.fusionThreshold",
    "HOROVOD_CYCLE_TIME": "horovod.cycleTimeMs",
    "HOROVOD_CACHE_CAPACITY": "horovod.cacheCapacity",
    "HOROVOD_AUTOTUNE": "horovod.autotune",
    "HOROVOD_TIMELINE": "horovod.timeline",
    "NCCL_DEBUG": "nccl.debug",
    "PYTHONUNBUFFERED": "(always 1, so logs stream)",
}


def labels(spec: JobSpec, component: str | None = None) -> dict[str, str]:
    """Recommended app labels (the PodMonitor selects workers by them), then the spec's own."""
    out = {"app.kubernetes.io/name": "hvdk8s", "app.kubernetes.io/instance": spec.name}
    if component:
        out["app.kubernetes.io/component"] = component
    return out | spec.labels


def pod_env(spec: JobSpec) -> dict[str, str]:
    """Environment of every container (and, via ``-x``, of every rank): hvdk8s's, the job file's ``env``, and
    TensorFlow's start-up lines off as the ``hvdk8s`` CLI's own default (``hvdk8s.common.quiet``: the pods run
    mpirun and the script, not an ``hvdk8s`` command) unless that ``env`` sets ``TF_CPP_MIN_LOG_LEVEL`` or
    ``HVDK8S_VERBOSE``."""
    env = {"HVDK8S_JOB_NAME": spec.name}
    if spec.metrics.enabled:
        env["HVDK8S_METRICS_PORT"] = str(spec.metrics.port)
    env["HOROVOD_FUSION_THRESHOLD"] = str(spec.horovod.fusion_threshold)
    if spec.horovod.cycle_time_ms is not None:
        env["HOROVOD_CYCLE_TIME"] = f"{spec.horovod.cycle_time_ms:g}"
    if spec.horovod.cache_capacity is not None:
        env["HOROVOD_CACHE_CAPACITY"] = str(spec.horovod.cache_capacity)
    if spec.horovod.autotune:
        env["HOROVOD_AUTOTUNE"] = "1"
    if spec.horovod.timeline:
        env["HOROVOD_TIMELINE"] = spec.horovod.timeline
    env["NCCL_DEBUG"] = spec.nccl.debug
    env["PYTHONUNBUFFERED"] = "1"
    env |= spec.env
    quiet_tensorflow(env)
    return env


def launcher_command(spec: JobSpec, ssh_identity: str | None = None) -> list[str]:
    """mpirun (or, for elastic jobs, horovodrun) argv of the launcher container (``spec`` defaulted);
    ``ssh_identity``: a private key ssh must use through a 0600 copy (``hosts --identity``)."""
    port = str(spec.ssh_port)
    if spec.elastic:
        # The operator's discover_hosts.sh lists the Running workers, one host
        # per line without a count (hence --slots); only those whose sshd
        # answers (Ready) are handed to Horovod.
        slots = spec.slots_per_worker
        argv = horovodrun_argv(
            spec.np,
            spec.command,
            min_np=spec.elastic.min_workers * slots,
            max_np=spec.elastic.max_workers * slots,
            slots=slots,
            discovery_script=" ".join([*HOSTS_MODULE, "ready", "--port", port, "--", DISCOVER_HOSTS]),
        )
        # The operator re-creates a lost worker pod under its old name; Horovod blacklists a failed
        # host for good unless it has a cooldown (horovod/runner/elastic/discovery.py, HostState).
        return [argv[0], "--blacklist-cooldown-range", *map(str, BLACKLIST_COOLDOWN), *argv[1:]]
    names = forwarded_env(pod_env(spec), extra=(*IMAGE_ENV, *spec.env))
    ompi = spec.open_mpi
    argv = mpirun_argv(spec.np, spec.command, env_names=names, allow_run_as_root=spec.user is None,
                       mca=transport_mca(ompi.allreduce_algorithm, ompi.yield_when_idle, ompi.mca,
                                         tcp_eager_limit=ompi.tcp_eager_limit))
    if not spec.workers:
        return argv  # the launcher runs every rank itself
    # Always wait for the workers' sshd: WaitForWorkersReady does not hold once anything suspends
    # the job (Kueue does, label or not), and the operator then starts the launcher with the workers.
    wait = [*HOSTS_MODULE, "wait", "--port", port, "--timeout", str(spec.worker_wait_seconds)]
    if ssh_identity:
        wait += ["--identity", ssh_identity]
    return [*wait, "--", *argv]


def metadata(spec: JobSpec) -> dict[str, Any]:
    """name, namespace only when the spec sets one (else the applier's), labels
    (with Kueue's queue-name), annotations."""
    meta: dict[str, Any] = {"name": spec.name}
    _put(meta, "namespace", spec.namespace)
    meta["labels"] = labels(spec) | ({QUEUE_LABEL: spec.queue} if spec.queue else {})
    _put(meta, "annotations", dict(spec.annotations))
    return meta


def render(spec: JobSpec) -> dict[str, Any]:
    """The MPIJob manifest for ``kubectl apply -f`` (``spec`` defaulted and validated: ``load_spec``)."""
    run_policy: dict[str, Any] = {
        "cleanPodPolicy": spec.run_policy.clean_pod_policy,
        "backoffLimit": spec.run_policy.backoff_limit,
    }
    _put(run_policy, "ttlSecondsAfterFinished", spec.run_policy.ttl_seconds_after_finished)
    _put(run_policy, "activeDeadlineSeconds", spec.run_policy.active_deadline_seconds)
    if policy := spec.run_policy.scheduling_policy:
        gang: dict[str, Any] = {}
        _put(gang, "minAvailable", policy.min_available)
        _put(gang, "queue", policy.queue)
        _put(gang, "priorityClass", policy.priority_class)
        _put(gang, "scheduleTimeoutSeconds", policy.schedule_timeout_seconds)
        _put(gang, "minResources", policy.min_resources)
        run_policy["schedulingPolicy"] = gang
    _put(run_policy, "suspend", spec.run_policy.suspend)
    _put(run_policy, "managedBy", spec.run_policy.managed_by)
    replicas = {
        "Launcher": {
            "replicas": 1,
            "restartPolicy": spec.restart_policy.launcher,
            "template": _launcher_template(spec),
        },
    }
    if spec.workers:  # none: the launcher runs every rank (runLauncherAsWorker)
        replicas["Worker"] = {
            "replicas": spec.workers,
            "restartPolicy": spec.restart_policy.worker,
            "template": _worker_template(spec),
        }
    job_spec: dict[str, Any] = {"slotsPerWorker": spec.slots_per_worker}
    if spec.run_launcher_as_worker:
        job_spec["runLauncherAsWorker"] = True
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata(spec),
        "spec": job_spec | {
            "runPolicy": run_policy,
            "launcherCreationPolicy": spec.launcher_creation_policy,
            "mpiImplementation": spec.mpi_implementation,
            "sshAuthMountPath": spec.ssh_auth_mount_path,
            "mpiReplicaSpecs": replicas,
        },
    }


def render_podmonitor(spec: JobSpec) -> dict[str, Any]:
    """A Prometheus Operator PodMonitor scraping every rank of the job's workers."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": metadata(spec),
        "spec": {
            "selector": {"matchLabels": labels(spec, "worker")},
            "podMetricsEndpoints": [
                {"port": port["name"], "path": spec.metrics.path} for port in _metrics_ports(spec)
            ],
        },
    }


def _launcher_template(spec: JobSpec) -> dict[str, Any]:
    """mpirun's pod; with runLauncherAsWorker it also hosts ranks, sized and placed like a worker."""
    ranks = spec.run_launcher_as_worker
    container: dict[str, Any] = {
        "name": LAUNCHER_CONTAINER,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": launcher_command(spec),
        "env": _env_list(spec),
    }
    if ranks:
        _put(container, "ports", _metrics_ports(spec))
    container["resources"] = _resources(spec, spec.resources.worker if ranks else spec.resources.launcher, gpus=ranks)
    _put(container, "volumeMounts", _mounts(spec, shm=ranks))
    pod = _pod_spec(spec, container, shm=ranks)
    if ranks:
        _place_like_a_worker(spec, pod)
    return {"metadata": _pod_metadata(spec, "launcher", metrics=ranks), "spec": pod}


def _worker_template(spec: JobSpec) -> dict[str, Any]:
    sshd = ["/usr/sbin/sshd", "-De"]
    if spec.user:  # non-root sshd: its own config (port, host key, pid file) in $HOME
        sshd += ["-f", f"{spec.home}/.sshd_config"]
    container: dict[str, Any] = {
        "name": WORKER_CONTAINER,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": sshd,
        "env": _env_list(spec),
        "ports": [{"name": "ssh", "containerPort": spec.ssh_port}, *_metrics_ports(spec)],
        # Ready = sshd accepts connections: what WaitForWorkersReady waits for
        # before it creates the launcher.
        "readinessProbe": {"tcpSocket": {"port": spec.ssh_port}, "periodSeconds": 2},
        "resources": _resources(spec, spec.resources.worker, gpus=True),
    }
    if spec.capabilities:
        container["securityContext"] = {"capabilities": {"add": list(spec.capabilities)}}
    _put(container, "volumeMounts", _mounts(spec, shm=True))
    pod = _pod_spec(spec, container, shm=True)
    _place_like_a_worker(spec, pod)
    if spec.host_network:
        # The node's network (RDMA NICs); ClusterFirstWithHostNet keeps the
        # headless Service's pod names resolvable.
        pod["hostNetwork"] = True
        pod["dnsPolicy"] = "ClusterFirstWithHostNet"
    return {"metadata": _pod_metadata(spec, "worker", metrics=True), "spec": pod}


def _pod_metadata(spec: JobSpec, component: str, *, metrics: bool) -> dict[str, Any]:
    annotations = dict(spec.pod_annotations)
    if metrics and spec.metrics.enabled:
        # The annotation convention names one port: local rank 0's. The
        # PodMonitor (render --podmonitor) scrapes every rank's named port.
        annotations |= {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": str(spec.metrics.port),
            "prometheus.io/path": spec.metrics.path,
        }
    meta: dict[str, Any] = {"labels": DEFAULT_POD_LABELS | labels(spec, component)}
    _put(meta, "annotations", annotations)
    return meta


def _place_like_a_worker(spec: JobSpec, pod: dict[str, Any]) -> None:
    """Node selection of a pod that runs ranks: GPU model, node labels, affinity, spreading."""
    node_selector = dict(spec.scheduling.node_selector)
    if spec.scheduling.gpu_product:
        node_selector[spec.scheduling.gpu_product_label] = spec.scheduling.gpu_product
    _put(pod, "nodeSelector", node_selector)
    _put(pod, "affinity", spec.affinity)
    _put(pod, "topologySpreadConstraints", list(spec.topology_spread_constraints))


def _pod_spec(spec: JobSpec, container: dict[str, Any], *, shm: bool) -> dict[str, Any]:
    """What every pod shares: identity, scheduler, priority, user, tolerations, volumes."""
    pod: dict[str, Any] = {"containers": [container]}
    _put(pod, "serviceAccountName", spec.service_account_name)
    _put(pod, "imagePullSecrets", [{"name": name} for name in spec.image_pull_secrets])
    _put(pod, "schedulerName", spec.scheduler_name)
    _put(pod, "priorityClassName", spec.scheduling.priority_class_name)
    if spec.user:
        uid = spec.user.uid
        pod["securityContext"] = {"runAsUser": uid, "runAsGroup": uid, "runAsNonRoot": True, "fsGroup": uid}
    # On the launcher too: on a tainted GPU-only pool it must land as well.
    _put(pod, "tolerations", [_toleration(t) for t in spec.scheduling.tolerations or ()])
    _put(pod, "volumes", _volumes(spec, shm=shm))
    return pod


def _volumes(spec: JobSpec, *, shm: bool) -> list[dict[str, Any]]:
    volumes = []
    if shm and spec.shm_size is not None:
        volumes.append({"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": spec.shm_size}})
    if spec.shared_volume:
        claim: dict[str, Any] = {"claimName": spec.shared_volume.claim_name}
        if spec.shared_volume.read_only:
            claim["readOnly"] = True
        volumes.append({"name": SHARED_VOLUME, "persistentVolumeClaim": claim})
    return volumes


def _mounts(spec: JobSpec, *, shm: bool) -> list[dict[str, Any]]:
    mounts: list[dict[str, Any]] = []
    if shm and spec.shm_size is not None:
        mounts.append({"name": SHM_VOLUME, "mountPath": "/dev/shm"})
    if spec.shared_volume:
        mount: dict[str, Any] = {"name": SHARED_VOLUME, "mountPath": spec.shared_volume.mount_path}
        if spec.shared_volume.read_only:
            mount["readOnly"] = True
        mounts.append(mount)
    return mounts


def _metrics_ports(spec: JobSpec) -> list[dict[str, Any]]:
    if not spec.metrics.enabled:
        return []
    return [
        {"name": f"metrics-{i}", "containerPort": spec.metrics.port + i}
        for i in range(spec.slots_per_worker)
    ]


def _env_list(spec: JobSpec) -> list[dict[str, str]]:
    return [{"name": name, "value": value} for name, value in pod_env(spec).items()]


def _resources(spec: JobSpec, res: Resources, *, gpus: bool) -> dict[str, dict[str, Any]]:
    """Requests = limits; ``gpus``: this pod runs ranks, one GPU each when ``spec.gpu``."""
    amounts: dict[str, Any] = {"cpu": res.cpu, "memory": res.memory, **res.extra}
    limits = dict(amounts)
    if gpus and spec.gpu:
        limits[GPU_RESOURCE] = spec.slots_per_worker
    return {"requests": amounts, "limits": limits}


def _toleration(t: Toleration) -> dict[str, Any]:
    out: dict[str, Any] = {}
    _put(out, "key", t.key)
    out["operator"] = t.operator
    _put(out, "value", t.value)
    _put(out, "effect", t.effect)
    _put(out, "tolerationSeconds", t.toleration_seconds)
    return out


def _put(target: dict[str, Any], key: str, value: Any) -> None:
    """Set ``key`` only when it has a value, so manifests carry no nulls or empties."""
    if value is not None and value != [] and value != {}:
        target[key] = value

