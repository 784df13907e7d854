"""Rendered TFJobs (kubeflow.org/v1) against the Training Operator's real CRD and pod schema, and through a
model of its TFJob controller (tests/controllers/training_operator.py: TF_CONFIG, Services, success, clean-up)."""
from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any

import jsonschema
import pytest

from hvdk8s.cluster.kubeerrors import TFJOBS, Action, api_error_message
from hvdk8s.common.fields import SpecError
from hvdk8s.mpijob import load_spec
from hvdk8s.mpijob.tfjob import checked_render_tfjob, render_tfjob, tfjob_problems

from conftest import shared
from controllers import training_operator as operator
from kube_double import crd_schema
from test_mpijob_schema import strict_validator, template_errors

pytestmark = pytest.mark.unit

CRD = "tfjob-v1-crd.yaml"
BASE = {"name": "bench", "image": "img:1", "command": ["python", "-m", "main"], "workers": 2}
SERVE = ["python", "-m", "main", "--server"]


def tfjob_crd_errors(manifest: dict[str, Any], strict: bool = True) -> list[str]:
    shared(f"schemas/{CRD}")
    schema = crd_schema("v1", CRD)
    validator = strict_validator(schema) if strict else jsonschema.Draft7Validator(schema)
    return sorted(f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(manifest))


def ps_job(fields: dict[str, Any] | None = None) -> dict[str, Any]:
    manifest = render_tfjob(load_spec(BASE | (fields or {})), chief=True, ps=1, serve_command=SERVE)
    manifest["metadata"]["namespace"] = "team-a"
    return manifest


def mwms_job(fields: dict[str, Any] | None = None) -> dict[str, Any]:
    manifest = render_tfjob(load_spec(BASE | (fields or {})))
    manifest["metadata"]["namespace"] = "team-a"
    return manifest


def container(pod: dict[str, Any]) -> dict[str, Any]:
    (only,) = pod["spec"]["containers"]
    return only


def env(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container(pod)["env"] if "value" in e}


def templates(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {rtype: replica["template"] for rtype, replica in manifest["spec"]["tfReplicaSpecs"].items()}


VARIANTS = {
    "cpu": {},
    "gpu-queue-rdma": {"gpu": True, "queue": "team-a", "hostNetwork": True, "capabilities": ["IPC_LOCK"],
                       "resources": {"worker": {"cpu": "8", "memory": "32Gi",
                                                "extra": {"rdma/hca_shared_devices_a": "1"}}},
                       "scheduling": {"gpuProduct": "NVIDIA-H100-80GB-HBM3", "priorityClassName": "bench",
                                      "nodeSelector": {"pool": "gpu"},
                                      "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                                                       "effect": "NoSchedule"}]}},
    "user-volume-deadline": {"user": {"uid": 1000}, "sharedVolume": {"claimName": "data"},
                             "runPolicy": {"activeDeadlineSeconds": 3600, "suspend": True}},
}


@pytest.mark.parametrize("fields", VARIANTS.values(), ids=VARIANTS.keys())
@pytest.mark.parametrize("layout", [ps_job, mwms_job], ids=["ps", "mwms"])
def test_rendered_tfjobs_fit_the_crd_and_the_pod_schema(layout, fields: dict[str, Any]):
    manifest = layout(fields)
    assert template_errors(templates(manifest)) == []
    assert tfjob_crd_errors(manifest) == []


def test_the_crd_check_can_fail():
    manifest = ps_job()
    manifest["spec"]["tfReplicaSpecs"]["Worker"]["replicas"] = "2"
    manifest["spec"]["successPolicies"] = "AllWorkers"
    assert tfjob_crd_errors(manifest) == [
        "spec.tfReplicaSpecs.Worker.replicas: '2' is not of type 'integer'",
        "spec: Additional properties are not allowed ('successPolicies' was unexpected)",
    ]


def test_replicas_commands_and_the_container_the_operator_looks_for():
    manifest = ps_job({"gpu": True, "queue": "team-a"})
    replicas = manifest["spec"]["tfReplicaSpecs"]
    assert {r: (s["replicas"], s["restartPolicy"]) for r, s in replicas.items()} == {
        "Chief": (1, "Never"), "Worker": (2, "Never"), "PS": (1, "Never")}
    commands = {r: container(t)["command"] for r, t in templates(manifest).items()}
    assert commands == {"Chief": BASE["command"], "Worker": SERVE, "PS": SERVE}
    for rtype, template in templates(manifest).items():
        c = container(template)
        assert c["name"] == "tensorflow" and c["ports"][0] == {"name": "tfjob-port", "containerPort": 2222}
        assert "readinessProbe" not in c and not any(p["name"] == "ssh" for p in c["ports"])
        gpus = c["resources"]["limits"].get("nvidia.com/gpu")
        assert gpus == (1 if rtype == "Worker" else None), rtype  # parameter servers hold variables, the Chief coordinates
        assert template["metadata"]["labels"]["app.kubernetes.io/component"] == rtype.lower()
    assert manifest["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    # the job file's runPolicy: clean up the pods still running when the chief is done, no retries; a gang
    # (when the operator runs with one) of every TF task, not the MPIJob's launcher + workers
    assert manifest["spec"]["runPolicy"] == {"cleanPodPolicy": "Running", "backoffLimit": 0,
                                             "ttlSecondsAfterFinished": 86400, "schedulingPolicy": {"minAvailable": 4}}
    assert "successPolicy" not in manifest["spec"]  # the default: the Chief's (or worker 0's) success
    mwms = mwms_job()["spec"]
    assert list(mwms["tfReplicaSpecs"]) == ["Worker"] and mwms["runPolicy"]["schedulingPolicy"] == {"minAvailable": 2}
    assert container(mwms["tfReplicaSpecs"]["Worker"]["template"])["command"] == BASE["command"]


def test_tf_config_in_every_pod_names_every_task_by_its_service():
    manifest = ps_job()
    pods = {p["metadata"]["name"]: p for p in operator.pods(manifest)}
    assert list(pods) == ["bench-chief-0", "bench-worker-0", "bench-worker-1", "bench-ps-0"]
    cluster = {"chief": ["bench-chief-0.team-a.svc:2222"],
               "worker": ["bench-worker-0.team-a.svc:2222", "bench-worker-1.team-a.svc:2222"],
               "ps": ["bench-ps-0.team-a.svc:2222"]}
    for name, pod in pods.items():
        config = json.loads(env(pod)["TF_CONFIG"])
        _, rtype, index = name.rsplit("-", 2)
        assert config == {"cluster": cluster, "task": {"type": rtype, "index": int(index)}, "environment": "cloud"}
    # each address is a headless Service of the pod's own name on the container's tfjob-port
    services = {s["name"]: s for s in operator.services(manifest)}
    assert sorted(services) == sorted(pods)
    for address in sum(cluster.values(), []):
        host, port = address.split(":")
        service = services[host.split(".")[0]]
        assert service["clusterIP"] == "None" and service["ports"] == [{"name": "tfjob-port", "port": int(port)}]
        assert service["selector"].items() <= pods[service["name"]]["metadata"]["labels"].items()
    assert [n for n, p in pods.items() if p["metadata"]["labels"].get(operator.ROLE_LABEL) == "master"] == [
        "bench-chief-0"]
    mwms = {p["metadata"]["name"]: p for p in operator.pods(mwms_job())}
    assert [n for n, p in mwms.items() if p["metadata"]["labels"].get(operator.ROLE_LABEL) == "master"] == [
        "bench-worker-0"]
    assert json.loads(env(mwms["bench-worker-1"])["TF_CONFIG"])["cluster"] == {
        "worker": ["bench-worker-0.team-a.svc:2222", "bench-worker-1.team-a.svc:2222"]}


def test_a_single_task_gets_no_tf_config():
    (pod,) = operator.pods(mwms_job({"workers": 1}))
    assert "TF_CONFIG" not in env(pod)


def test_the_job_ends_when_the_chief_does_and_its_servers_are_cleaned_up():
    """Parameter servers (and PS-strategy workers) serve until killed: the job must still succeed, and the pods
    still running must go, while the chief's pod (and its log) stays."""
    manifest = ps_job()
    serving = {"bench-chief-0": "Running", "bench-worker-0": "Running", "bench-worker-1": "Running",
               "bench-ps-0": "Running"}
    assert operator.status(manifest, serving) == "Running"
    done = serving | {"bench-chief-0": "Succeeded"}
    assert operator.status(manifest, done) == "Succeeded"
    assert sorted(operator.deleted_on_finish(manifest, done)) == ["bench-ps-0", "bench-worker-0", "bench-worker-1"]
    assert operator.status(manifest, serving | {"bench-ps-0": "Failed"}) == "Failed"
    # the TFJob's own default would keep them running (holding their nodes) until the job is deleted
    unset = copy.deepcopy(manifest)
    del unset["spec"]["runPolicy"]["cleanPodPolicy"]
    assert operator.deleted_on_finish(unset, done) == []


def test_without_a_chief_the_job_ends_with_worker_0():
    manifest = mwms_job()
    assert operator.status(manifest, {"bench-worker-0": "Running", "bench-worker-1": "Running"}) == "Running"
    assert operator.status(manifest, {"bench-worker-0": "Succeeded", "bench-worker-1": "Running"}) == "Succeeded"
    allworkers = copy.deepcopy(manifest) | {"spec": manifest["spec"] | {"successPolicy": "AllWorkers"}}
    assert operator.status(allworkers, {"bench-worker-0": "Succeeded", "bench-worker-1": "Running"}) == "Running"


def test_what_a_tfjob_cannot_express_is_refused_by_field():
    spec = dataclasses.replace(load_spec(BASE | {"elastic": {"minWorkers": 1, "maxWorkers": 2}}), name="x" * 55)
    assert [(e.path, e.detail.split(":")[0]) for e in tfjob_problems(spec, chief=True, ps=1)] == [
        ("elastic", "a TFJob's cluster is fixed when its pods start (TF_CONFIG)"),
        ("name", f"Service '{'x' * 55}-worker-1' is 64 characters; a DNS-1035 label has at most 63 (shorten the name)"),
    ]
    with pytest.raises(SpecError) as info:
        checked_render_tfjob(load_spec(BASE | {"runLauncherAsWorker": True, "workers": 0}), "bench.yaml")
    assert [e.path for e in info.value.field_errors] == ["runLauncherAsWorker", "workers"]
    managed = load_spec(BASE | {"runPolicy": {"managedBy": "kubeflow.org/mpi-operator"}})
    assert [e.path for e in tfjob_problems(managed)] == ["runPolicy.managedBy"]


def test_a_cluster_without_the_training_operator_is_told_what_to_install():
    """The API server answers a plain 404 page for a kind no CRD serves (see kube_double); the user reads why."""
    said = api_error_message(404, "404 page not found\n", Action("create", TFJOBS, "team-a", "bench-tf-ps-n2-r0"))
    assert said.startswith("the cluster does not serve kubeflow.org/v1 TFJobs: the Kubeflow Training Operator is not "
                           "installed")
    assert "v1.9.0 with TFJob alone enabled" in said and "kubectl get crd tfjobs.kubeflow.org" in said
