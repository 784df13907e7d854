"""Kubeflow Trainer v2.3.0 (github.com/kubeflow/trainer, tag v2.3.0, commit 658725b): its MPI plugin.

What the Trainer makes of a TrainJob and the runtime it names, as far as hvdk8s depends on it:
``pkg/runtime/framework/plugins/mpi/mpi.go`` (MPI.EnforceMLPolicy: node count, numProcPerNode,
the ssh Secret and hostfile volumes, the launcher's Open MPI variables; buildHostFileConfigMap),
``pkg/runtime/framework/plugins/jobset/jobset.go`` (IdentifyPodNetwork: pod endpoints),
``pkg/runtime/framework/plugins/jobset/builder.go`` (Builder.Trainer: where a TrainJob's ``trainer`` fields land),
``pkg/runtime/core/trainingruntime.go`` (resourcesPerNode) and ``pkg/constants/constants.go`` (names and file modes). Pods are plain dicts, named as JobSet
names them: ``<trainjob>-<replicated job>-<job index>-<pod index>``.
"""
from __future__ import annotations

import copy
from typing import Any

NODE, LAUNCHER = "node", "launcher"  # constants.Node, constants.Launcher
ANCESTOR_LABEL, ANCESTOR_TRAINER = "trainer.kubeflow.org/trainjob-ancestor-step", "trainer"
HOSTFILE_DIR = "/etc/mpi"  # constants.MPIHostfileDir
# constants.MPISSHAuthDefaultMode, MPISSHPrivateKeyFileMode, MPISSHPublicKeyFileMode (upstream change 3649).
SSH_ITEMS = {"id_rsa": 0o640, "id_rsa.pub": 0o644, "authorized_keys": 0o644}
SSH_DEFAULT_MODE = 0o400
RSH_ARGS = "-o ConnectionAttempts=10"  # constants.OpenMPIEnvDefaultValueRSHArgs
# Kubernetes' batch/v1 JobSpec.backoffLimit default: what a replicated Job gets unless its template says.
JOB_DEFAULT_BACKOFF_LIMIT = 6


def pods(trainjob: dict[str, Any], runtime: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Pods per replicated job (``node``, ``launcher``), after EnforceMLPolicy."""
    name = trainjob["metadata"]["name"]
    mpi = runtime["spec"]["mlPolicy"]["mpi"]
    trainer = trainjob["spec"].get("trainer") or {}
    as_node = bool(mpi.get("runLauncherAsNode"))
    num_nodes = trainer.get("numNodes", runtime["spec"]["mlPolicy"].get("numNodes", 1))
    counts = {NODE: max(num_nodes - 1, 1) if as_node else num_nodes, LAUNCHER: 1}
    slots = trainer.get("numProcPerNode", mpi.get("numProcPerNode", 1))
    out: dict[str, list[dict[str, Any]]] = {}
    for rjob in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        role = rjob["name"]
        template = rjob["template"]["spec"]["template"]
        out[role] = []
        for index in range(counts.get(role, 1)):
            pod = copy.deepcopy(template)
            pod.setdefault("metadata", {})["name"] = f"{name}-{role}-0-{index}"
            _apply_trainer(pod["spec"], trainer, _is_trainer_ancestor(rjob), as_node and role == NODE)
            _mount_ssh(pod["spec"], name, mpi["sshAuthMountPath"])
            if role == LAUNCHER:
                _launcher_mpi(pod["spec"], name, slots)
            out[role].append(pod)
    return out


def hostfile(trainjob: dict[str, Any], runtime: dict[str, Any]) -> str:
    """buildHostFileConfigMap (OpenMPI): every node endpoint, and the launcher's with runLauncherAsNode."""
    name = trainjob["metadata"]["name"]
    mpi = runtime["spec"]["mlPolicy"]["mpi"]
    slots = (trainjob["spec"].get("trainer") or {}).get("numProcPerNode", mpi.get("numProcPerNode", 1))
    built = pods(trainjob, runtime)
    roles = [LAUNCHER, NODE] if mpi.get("runLauncherAsNode") else [NODE]
    return "".join(f"{pod['metadata']['name']}.{name} slots={slots}\n" for role in roles for pod in built[role])


def job_backoff_limit(runtime: dict[str, Any], role: str) -> int:
    """Retries of a replicated Job: its template's backoffLimit, else Kubernetes' default."""
    rjob = next(r for r in runtime["spec"]["template"]["spec"]["replicatedJobs"] if r["name"] == role)
    return rjob["template"]["spec"].get("backoffLimit", JOB_DEFAULT_BACKOFF_LIMIT)


def key_mode(pod: dict[str, Any]) -> int:
    """The private key's file mode in the pod."""
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "mpi-ssh-auth")
    return next(i["mode"] for i in volume["secret"]["items"] if i["path"] == "id_rsa")


def openssh_uses_key(mode: int, key_uid: int, user_uid: int) -> bool:
    """OpenSSH's sshkey_perm_ok (authfile.c): a key owned by the user that group or others may read
    is refused ("UNPROTECTED PRIVATE KEY FILE"). Secret volume files are owned by root."""
    return not (key_uid == user_uid and mode & 0o077)


def _is_trainer_ancestor(rjob: dict[str, Any]) -> bool:
    return (rjob["template"].get("metadata") or {}).get("labels", {}).get(ANCESTOR_LABEL) == ANCESTOR_TRAINER


def _apply_trainer(pod_spec: dict[str, Any], trainer: dict[str, Any], ancestor: bool, launcher_as_node: bool) -> None:
    """A TrainJob's ``trainer`` fields in its ``node`` containers. Image, command and args go to the
    trainer-ancestor job only (builder.go Builder.Trainer, v2.3.0 lines 126-138); env (lines 142-151,
    apply.UpsertEnvVars) and resourcesPerNode (trainingruntime.go lines 198-203, merged over the template's)
    go there and, with runLauncherAsNode, to the ``node`` job as well."""
    if not (ancestor or launcher_as_node):
        return
    for container in pod_spec["containers"]:
        if container["name"] != NODE:
            continue
        if ancestor:
            container.update({k: trainer[k] for k in ("image", "command", "args") if k in trainer})
        if env := trainer.get("env"):
            names = {e["name"] for e in env}
            container["env"] = [e for e in container.get("env", []) if e["name"] not in names] + copy.deepcopy(env)
        if resources := trainer.get("resourcesPerNode"):
            merged = container.setdefault("resources", {})
            for kind in ("limits", "requests"):
                if kind in resources:
                    merged[kind] = {**merged.get(kind, {}), **resources[kind]}


def _mount_ssh(pod_spec: dict[str, Any], trainjob: str, mount_path: str) -> None:
    items = [{"key": "ssh-privatekey" if path == "id_rsa" else "ssh-publickey", "path": path, "mode": mode}
             for path, mode in SSH_ITEMS.items()]
    pod_spec.setdefault("volumes", []).append({"name": "mpi-ssh-auth", "secret": {
        "secretName": f"{trainjob}-mpi-ssh-auth", "defaultMode": SSH_DEFAULT_MODE, "items": items}})
    for container in pod_spec["containers"]:
        if container["name"] == NODE:  # only containers named node get the mount
            container.setdefault("volumeMounts", []).append({"name": "mpi-ssh-auth", "mountPath": mount_path})


def _launcher_mpi(pod_spec: dict[str, Any], trainjob: str, slots: int) -> None:
    pod_spec["volumes"].append({"name": "mpi-hostfile", "configMap": {"name": f"{trainjob}-mpi-hostfile"}})
    env = {"OMPI_MCA_orte_default_hostfile": f"{HOSTFILE_DIR}/hostfile", "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
           "OMPI_MCA_orte_set_default_slots": str(slots), "OMPI_MCA_plm_rsh_args": RSH_ARGS}
    for container in pod_spec["containers"]:
        if container["name"] == NODE:
            container["volumeMounts"].append({"name": "mpi-hostfile", "mountPath": HOSTFILE_DIR})
            # apply.UpsertEnvVars: the plugin's values replace the template's of the same name.
            kept = [e for e in container.get("env", []) if e["name"] not in env]
            container["env"] = kept + [{"name": k, "value": v} for k, v in env.items()]
