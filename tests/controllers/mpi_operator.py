"""The MPI Operator v0.8.2 (github.com/kubeflow/mpi-operator, commit caa3c47, "Prepare v0.8.2").

What its controller creates for an MPIJob, and when: ``pkg/controller/mpi_job_controller.go``
(syncHandler, newLauncherJob, newLauncherPodTemplate, newWorker, newConfigMap,
updateDiscoverHostsInConfigMap, setupSSHOnPod) and ``pkg/controller/podgroup.go``
(VolcanoCtrl/SchedulerPluginsCtrl.newPodGroup, calculateMinAvailable, calPGMinResource).
Objects are plain dicts; the MPIJob is defaulted first (SetDefaults_MPIJob, which
``hvdk8s.mpijob.defaults.manifest_defaults`` already models).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from hvdk8s.mpijob.defaults import manifest_defaults

ROOT_SSH = "/root/.ssh"  # rootSSHPath
CONFIG_MOUNT = "/etc/mpi"  # configMountPath
# ompiEnvVars + openMPISlotsEnv (newLauncherPodTemplate), OpenMPI only.
LAUNCHER_ENV = {
    "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
    "OMPI_MCA_orte_default_hostfile": f"{CONFIG_MOUNT}/hostfile",
    "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10",
}
# Kubernetes' own default for a Secret volume without defaultMode (core/v1 SecretVolumeSourceDefaultMode).
SECRET_DEFAULT_MODE = 0o644


@dataclass(frozen=True)
class Sync:
    """One syncHandler pass: the worker pods that exist, and the launcher Job (None: not created yet)."""

    workers: list[dict[str, Any]]
    launcher: dict[str, Any] | None


def suspended(mpijob: dict[str, Any]) -> bool:
    """isMPIJobSuspended."""
    return bool(manifest_defaults(mpijob)["runPolicy"].get("suspend"))


def sync(mpijob: dict[str, Any], ready_workers: int, launcher: dict[str, Any] | None = None) -> Sync:
    """syncHandler: a suspended MPIJob gets no workers (cleanUpWorkerPods), but its launcher Job
    is created anyway -- countReadyWorkerPods([]) == len([]) holds -- suspended. Unsuspended, the
    workers are created and the launcher with them (AtStartup) or once every worker is Ready;
    an existing suspended launcher is unsuspended in the same pass, Ready workers or not."""
    spec = manifest_defaults(mpijob)
    workers = [] if suspended(mpijob) else [worker_pod(mpijob, i) for i in range(_worker_replicas(spec))]
    if launcher is None:
        if spec["launcherCreationPolicy"] == "AtStartup" or min(ready_workers, len(workers)) == len(workers):
            launcher = launcher_job(mpijob)
    elif not suspended(mpijob) and launcher.get("suspend"):
        launcher = {**launcher, "suspend": False}
    return Sync(workers, launcher)


def launcher_job(mpijob: dict[str, Any]) -> dict[str, Any]:
    """newLauncherJob: runPolicy's ttlSecondsAfterFinished, activeDeadlineSeconds and backoffLimit
    go to the launcher Job only (the worker pods and the MPIJob carry none of them)."""
    run_policy = manifest_defaults(mpijob)["runPolicy"]
    job: dict[str, Any] = {"name": f"{mpijob['metadata']['name']}-launcher"}
    for key in ("ttlSecondsAfterFinished", "activeDeadlineSeconds", "backoffLimit"):
        if key in run_policy:
            job[key] = run_policy[key]
    if suspended(mpijob):
        job["suspend"] = True
    job["template"] = launcher_pod(mpijob)
    return job


def launcher_pod(mpijob: dict[str, Any]) -> dict[str, Any]:
    """newLauncherPodTemplate: hostname, the OpenMPI variables, the ssh Secret, the hostfile at /etc/mpi."""
    spec = manifest_defaults(mpijob)
    name = mpijob["metadata"]["name"]
    pod = copy.deepcopy(spec["mpiReplicaSpecs"]["Launcher"]["template"])
    pod["spec"]["hostname"], pod["spec"]["subdomain"] = f"{name}-launcher", name
    container = pod["spec"]["containers"][0]
    container["env"] = [*container.get("env", []), *({"name": k, "value": v} for k, v in LAUNCHER_ENV.items()),
                        {"name": "OMPI_MCA_orte_set_default_slots", "value": str(spec["slotsPerWorker"])}]
    _setup_ssh(pod["spec"], mpijob)
    pod["spec"]["volumes"].append({"name": "mpi-job-config", "configMap": {"name": f"{name}-config"}})
    container["volumeMounts"].append({"name": "mpi-job-config", "mountPath": CONFIG_MOUNT})
    return pod


def worker_pod(mpijob: dict[str, Any], index: int) -> dict[str, Any]:
    """newWorker: ``<job>-worker-<i>`` in the job's headless Service, sshd by default, the ssh Secret."""
    spec = manifest_defaults(mpijob)
    name = mpijob["metadata"]["name"]
    pod = copy.deepcopy(spec["mpiReplicaSpecs"]["Worker"]["template"])
    pod.setdefault("metadata", {})["name"] = f"{name}-worker-{index}"
    pod["spec"]["hostname"], pod["spec"]["subdomain"] = f"{name}-worker-{index}", name
    container = pod["spec"]["containers"][0]
    if not container.get("command") and not container.get("args"):
        container["command"] = ["/usr/sbin/sshd", "-De"]
    _setup_ssh(pod["spec"], mpijob)
    return pod


def ssh_key_mode(pod_spec: dict[str, Any]) -> int:
    """The mode the kubelet gives ``id_rsa`` in the ssh Secret volume (setupSSHOnPod)."""
    volume = next(v for v in pod_spec["volumes"] if v["name"] == "ssh-auth")
    return volume["secret"].get("defaultMode", SECRET_DEFAULT_MODE)


def hostfile(mpijob: dict[str, Any], cluster_domain: str = "") -> str:
    """newConfigMap (OpenMPI): the launcher (runLauncherAsWorker) and every worker, by Service DNS name."""
    spec = manifest_defaults(mpijob)
    name, namespace = mpijob["metadata"]["name"], mpijob["metadata"].get("namespace", "default")
    suffix = f".{cluster_domain}" if cluster_domain else ""
    hosts = [f"{name}-launcher"] if spec.get("runLauncherAsWorker") else []
    hosts += [f"{name}-worker-{i}" for i in range(_worker_replicas(spec))]
    return "".join(f"{h}.{name}.{namespace}.svc{suffix} slots={spec['slotsPerWorker']}\n" for h in hosts)


def discover_hosts(mpijob: dict[str, Any], running_pods: list[str]) -> str:
    """updateDiscoverHostsInConfigMap: the Running worker pods (getRunningWorkerPods: phase Running,
    Ready or not), sorted by name."""
    name, namespace = mpijob["metadata"]["name"], mpijob["metadata"].get("namespace", "default")
    return "#!/bin/sh\n" + "".join(f"echo {p}.{name}.{namespace}.svc\n" for p in sorted(running_pods))


def podgroup(mpijob: dict[str, Any], scheduler: str = "volcano") -> dict[str, Any]:
    """newPodGroup of VolcanoCtrl or SchedulerPluginsCtrl: minMember, minResources and (scheduler-plugins
    only: VolcanoCtrl "doesn't pass the .schedulingPolicy.scheduleTimeoutSeconds") the timeout."""
    spec = manifest_defaults(mpijob)
    policy = spec["runPolicy"].get("schedulingPolicy") or {}
    min_member = policy.get("minAvailable", _worker_replicas(spec) + 1)  # calculateMinAvailable
    group: dict[str, Any] = {"minMember": min_member, "minResources": policy.get("minResources")
                             or _min_resources(spec, min_member)}
    if scheduler == "scheduler-plugins":
        group["scheduleTimeoutSeconds"] = policy.get("scheduleTimeoutSeconds")
    return group


def _min_resources(spec: dict[str, Any], min_member: int) -> dict[str, float]:
    """calPGMinResource with equal priorities: the launcher counts, and the workers are cut to
    minMember - 1 when launcher + workers exceed minMember. Sums of each container's requests, and of
    its limits without a request (addResources), as plain numbers."""
    replicas = spec["mpiReplicaSpecs"]
    counts = {"Launcher": 1, "Worker": _worker_replicas(spec)}
    if counts["Launcher"] + counts["Worker"] > min_member and "Worker" in replicas:
        counts["Worker"] = min_member - 1
    total: dict[str, float] = {}
    for role, replica in replicas.items():
        for container in replica["template"]["spec"]["containers"]:
            resources = container.get("resources") or {}
            merged = resources.get("limits", {}) | resources.get("requests", {})
            for resource, amount in merged.items():
                total[resource] = total.get(resource, 0.0) + quantity(amount) * counts[role]
    return total


def quantity(text: Any) -> float:
    """A Kubernetes quantity as a number (what the scheduler compares)."""
    from kubernetes.utils.quantity import parse_quantity

    return float(parse_quantity(text))


def _worker_replicas(spec: dict[str, Any]) -> int:
    worker = spec["mpiReplicaSpecs"].get("Worker")
    return worker["replicas"] if worker else 0  # workerReplicas


def _setup_ssh(pod_spec: dict[str, Any], mpijob: dict[str, Any]) -> None:
    """setupSSHOnPod: mode 0600 only when the mount is /root/.ssh, else the Secret volume's default."""
    mount = manifest_defaults(mpijob)["sshAuthMountPath"]
    secret: dict[str, Any] = {"secretName": f"{mpijob['metadata']['name']}-ssh"}
    if mount == ROOT_SSH:
        secret["defaultMode"] = 0o600
    pod_spec.setdefault("volumes", []).append({"name": "ssh-auth", "secret": secret})
    pod_spec["containers"][0].setdefault("volumeMounts", []).append({"name": "ssh-auth", "mountPath": mount})
