"""The Kubeflow Training Operator, branch release-1.9 (github.com/kubeflow/training-operator, commit 078ec30,
the one ../shared/schemas/tfjob-v1-crd.yaml comes from): what its TFJob controller does with a TFJob.

``pkg/apis/kubeflow.org/v1/tensorflow_defaults.go`` (SetDefaults_TFJob: cleanPodPolicy None, successPolicy "",
one replica, restartPolicy Never, the ``tfjob-port`` 2222 on the ``tensorflow`` container);
``pkg/controller.v1/tensorflow/tensorflow.go`` (genTFConfigJSONStr, genClusterSpec: TF_CONFIG);
``pkg/controller.v1/tensorflow/util.go`` (GetPortFromTFJob, isDistributed, ContainsChiefOrMasterSpec,
setRestartPolicy); ``pkg/controller.v1/tensorflow/tfjob_controller.go`` (SetClusterSpec, IsMasterRole,
UpdateJobStatus, IsWorker0Completed); ``pkg/controller.v1/common/pod.go`` (createNewPod: name, labels),
``common/service.go`` (CreateNewService: one headless Service per pod) and ``common/job.go``
(DeletePodsAndServices: cleanPodPolicy once the job has finished). Objects are plain dicts.
"""
from __future__ import annotations

import copy
import json
from typing import Any

CONTAINER, PORT_NAME, DEFAULT_PORT = "tensorflow", "tfjob-port", 2222
OPERATOR = "tfjob-controller"  # controllerName
# kubeflowv1 common_types.go label keys
OPERATOR_LABEL = "training.kubeflow.org/operator-name"
JOB_LABEL = "training.kubeflow.org/job-name"
TYPE_LABEL = "training.kubeflow.org/replica-type"
INDEX_LABEL = "training.kubeflow.org/replica-index"
ROLE_LABEL = "training.kubeflow.org/job-role"
# UpdateJobStatus walks the replica types in this order.
ORDER = ("Chief", "Evaluator", "Master", "PS", "Worker")


def defaults(tfjob: dict[str, Any]) -> dict[str, Any]:
    """SetDefaults_TFJob."""
    job = copy.deepcopy(tfjob)
    spec = job["spec"]
    spec.setdefault("runPolicy", {}).setdefault("cleanPodPolicy", "None")
    spec.setdefault("successPolicy", "")
    for replica in spec["tfReplicaSpecs"].values():
        replica.setdefault("replicas", 1)
        replica.setdefault("restartPolicy", "Never")
        container = next(c for c in replica["template"]["spec"]["containers"] if c["name"] == CONTAINER)
        if not any(p.get("name") == PORT_NAME for p in container.get("ports", [])):
            container.setdefault("ports", []).append({"name": PORT_NAME, "containerPort": DEFAULT_PORT})
    return job


def port(tfjob: dict[str, Any], rtype: str) -> int:
    """GetPortFromTFJob: the tensorflow container's tfjob-port, else 2222."""
    for container in tfjob["spec"]["tfReplicaSpecs"][rtype]["template"]["spec"]["containers"]:
        if container["name"] == CONTAINER:
            for p in container.get("ports", []):
                if p.get("name") == PORT_NAME:
                    return int(p["containerPort"])
    return DEFAULT_PORT


def cluster_spec(tfjob: dict[str, Any], cluster_domain: str = "") -> dict[str, list[str]]:
    """genClusterSpec: per replica type, lowercased, ``<job>-<type>-<i>.<namespace>.svc[.<domain>]:<port>``."""
    job = defaults(tfjob)
    name, namespace = job["metadata"]["name"], job["metadata"].get("namespace", "default")
    suffix = f".{cluster_domain}" if cluster_domain else ""
    return {rtype.lower(): [f"{name}-{rtype.lower()}-{i}.{namespace}.svc{suffix}:{port(job, rtype)}"
                            for i in range(replica["replicas"])]
            for rtype, replica in job["spec"]["tfReplicaSpecs"].items()}


def distributed(tfjob: dict[str, Any]) -> bool:
    """isDistributed: more than one task in all (a single task gets no TF_CONFIG)."""
    return sum(r["replicas"] for r in defaults(tfjob)["spec"]["tfReplicaSpecs"].values()) != 1


def tf_config(tfjob: dict[str, Any], rtype: str, index: int) -> dict[str, Any] | None:
    """genTFConfigJSONStr without enableDynamicWorker (hvdk8s never sets it); None when not distributed."""
    if not distributed(tfjob):
        return None
    return {"cluster": cluster_spec(tfjob), "task": {"type": rtype.lower(), "index": index}, "environment": "cloud"}


def master(tfjob: dict[str, Any], rtype: str, index: int) -> bool:
    """IsMasterRole: the Chief (or Master) when there is one, else worker 0."""
    replicas = tfjob["spec"]["tfReplicaSpecs"]
    if "Chief" in replicas or "Master" in replicas:
        return rtype in ("Chief", "Master")
    return rtype == "Worker" and index == 0


def pods(tfjob: dict[str, Any]) -> list[dict[str, Any]]:
    """createNewPod for every replica: name, labels, TF_CONFIG appended to the tensorflow container's env,
    the replica's restart policy (ExitCode runs as Never)."""
    job = defaults(tfjob)
    name = job["metadata"]["name"]
    out = []
    for rtype, replica in job["spec"]["tfReplicaSpecs"].items():
        rt = rtype.lower()
        for index in range(replica["replicas"]):
            pod = copy.deepcopy(replica["template"])
            meta = pod.setdefault("metadata", {})
            meta["name"] = f"{name}-{rt}-{index}"
            labels = {OPERATOR_LABEL: OPERATOR, JOB_LABEL: name, TYPE_LABEL: rt, INDEX_LABEL: str(index)}
            if master(job, rtype, index):
                labels[ROLE_LABEL] = "master"
            meta["labels"] = {**meta.get("labels", {}), **labels}
            config = tf_config(job, rtype, index)
            for container in pod["spec"]["containers"]:
                if container["name"] == CONTAINER and config is not None:
                    container["env"] = [*container.get("env", []), {"name": "TF_CONFIG", "value": json.dumps(config)}]
                    break
            policy = replica["restartPolicy"]
            pod["spec"]["restartPolicy"] = "Never" if policy == "ExitCode" else policy
            out.append(pod)
    return out


def services(tfjob: dict[str, Any]) -> list[dict[str, Any]]:
    """CreateNewService: a headless Service per pod, of the pod's name, selecting it by type and index."""
    job = defaults(tfjob)
    name = job["metadata"]["name"]
    return [{"name": f"{name}-{rtype.lower()}-{i}", "clusterIP": "None",
             "selector": {OPERATOR_LABEL: OPERATOR, JOB_LABEL: name, TYPE_LABEL: rtype.lower(), INDEX_LABEL: str(i)},
             "ports": [{"name": PORT_NAME, "port": port(job, rtype)}]}
            for rtype, replica in job["spec"]["tfReplicaSpecs"].items() for i in range(replica["replicas"])]


def status(tfjob: dict[str, Any], phases: dict[str, str]) -> str:
    """UpdateJobStatus's verdict from the pods' phases (by pod name; a succeeded pod exited 0): Succeeded,
    Failed, Running or Created. With a Chief: succeeded once every Chief has; without: once worker 0 has (the
    default success policy) or every worker has (AllWorkers). Any failed pod fails the job (restartPolicy
    Never, no dynamic workers)."""
    job = defaults(tfjob)
    replicas = job["spec"]["tfReplicaSpecs"]
    name = job["metadata"]["name"]
    verdict = "Created"
    for rtype in (r for r in ORDER if r in replicas):
        phase = [phases.get(f"{name}-{rtype.lower()}-{i}", "Pending") for i in range(replicas[rtype]["replicas"])]
        expected = len(phase) - phase.count("Succeeded")
        running = phase.count("Running")
        if "Chief" in replicas or "Master" in replicas:
            if rtype in ("Chief", "Master"):
                if running:
                    verdict = "Running"
                if expected == 0:
                    verdict = "Succeeded"
        elif rtype == "Worker":
            worker0 = phase[0] == "Succeeded"
            if expected == 0 or (worker0 and job["spec"]["successPolicy"] != "AllWorkers"):
                verdict = "Succeeded"
            elif running:
                verdict = "Running"
        if "Failed" in phase:
            verdict = "Failed"
    return verdict


def deleted_on_finish(tfjob: dict[str, Any], phases: dict[str, str]) -> list[str]:
    """DeletePodsAndServices once the job has Succeeded or Failed: None deletes nothing, Running the pods
    still Running or Pending, All every pod."""
    policy = defaults(tfjob)["spec"]["runPolicy"]["cleanPodPolicy"]
    if policy == "None":
        return []
    return [p for p, phase in phases.items() if policy == "All" or phase in ("Running", "Pending")]
