"""The API double itself, over raw HTTP: it must be able to say no, or the CLI tests prove nothing."""
from __future__ import annotations

import copy
import json
from urllib.parse import urlencode

import pytest
import urllib3

from kube_double import Foreign, KubeDouble, crd_schema

pytestmark = pytest.mark.unit

JOBS = "/apis/kubeflow.org/v2beta1/namespaces/ns/mpijobs"
VALID = {
    "apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "metadata": {"name": "j"},
    "spec": {"mpiReplicaSpecs": {
        "Launcher": {"replicas": 1, "template": {"spec": {"containers": [{"name": "l", "image": "i"}]}}},
        "Worker": {"replicas": 2, "template": {"spec": {"containers": [
            {"name": "w", "image": "i", "ports": [{"containerPort": 22}]}]}}}}},
}


@pytest.fixture(scope="module")
def double():
    with KubeDouble() as server:
        yield server


def call(double: KubeDouble, method: str, path: str, body: dict | None = None, **query: str):
    """(status, Status/object dict) -- or the raw bytes of watches and plain-text answers."""
    url = f"{double.url}{path}?{urlencode(query)}"
    resp = urllib3.request(method, url, json=body, retries=False, headers={"Authorization": "Bearer test-token"})
    parse = resp.headers.get("Content-Type") == "application/json" and "watch" not in query
    return resp.status, (resp.json() if parse else resp.data)


def test_it_validates_with_the_real_crd():
    spec = crd_schema()["properties"]["spec"]
    assert spec["required"] == ["mpiReplicaSpecs"]
    assert spec["properties"]["mpiImplementation"]["enum"] == ["OpenMPI", "Intel", "MPICH"]


def test_schema_invalid_bodies_get_422_with_causes_and_are_not_stored(double):
    bad = copy.deepcopy(VALID)
    bad["metadata"]["name"] = "Bad_Name"
    bad["spec"]["slotsPerWorker"] = "one"
    bad["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["ports"][0] = {"protocol": "TCP"}
    code, status = call(double, "POST", JOBS, bad)
    assert code == 422 and status["reason"] == "Invalid" and status["details"]["kind"] == "MPIJob"
    assert [(c["field"], c["reason"]) for c in status["details"]["causes"]] == [
        ("metadata.name", "FieldValueInvalid"),
        ("spec.mpiReplicaSpecs[Worker].template.spec.containers[0].ports[0].containerPort", "FieldValueRequired"),
        ("spec.slotsPerWorker", "FieldValueTypeInvalid"),
    ]
    assert status["message"].startswith('MPIJob.kubeflow.org "Bad_Name" is invalid: [metadata.name: Invalid value')
    assert double.job("ns", "Bad_Name") is None
    code, status = call(double, "POST", JOBS, {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob",
                                               "metadata": {"name": "k"}, "spec": {}})
    assert (code, status["message"]) == (
        422, 'MPIJob.kubeflow.org "k" is invalid: spec.mpiReplicaSpecs: Required value')


def test_valid_body_is_pruned_defaulted_and_a_duplicate_conflicts(double):
    body = copy.deepcopy(VALID)
    body["spec"]["slotsPerWorkr"] = 4  # misspelled: silently dropped, as a real server does by default
    code, created = call(double, "POST", JOBS, body, dryRun="All")
    assert code == 201 and double.job("ns", "j") is None
    assert "slotsPerWorkr" not in created["spec"]
    assert created["spec"]["launcherCreationPolicy"] == "AtStartup"
    assert created["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["ports"] == [
        {"containerPort": 22, "protocol": "TCP"}]
    code, status = call(double, "POST", JOBS, body, fieldValidation="Strict")
    assert (code, status["message"]) == (400, 'MPIJob in version "v2beta1" cannot be handled as a MPIJob: strict '
                                              'decoding error: unknown field "spec.slotsPerWorkr"')
    assert call(double, "POST", JOBS, VALID)[0] == 201
    code, status = call(double, "POST", JOBS, VALID)
    assert (code, status["reason"], status["details"]["name"]) == (409, "AlreadyExists", "j")
    assert call(double, "DELETE", f"{JOBS}/j", propagationPolicy="Background")[0] == 200
    assert call(double, "GET", f"{JOBS}/j")[1]["reason"] == "NotFound"


def test_watch_streams_changes_after_a_version_and_expires_old_ones():
    with KubeDouble(max_watch_seconds=0.3, expire_watches=1) as double:
        code, created = call(double, "POST", JOBS, VALID)
        version = created["metadata"]["resourceVersion"]
        code, body = call(double, "GET", JOBS, watch="true", resourceVersion=version)
        assert json.loads(body)["object"]["code"] == 410  # the first resumed watch: Gone
        double.remove("ns", "j")
        code, body = call(double, "GET", JOBS, watch="true", resourceVersion=version, allowWatchBookmarks="true")
        events = [json.loads(line) for line in body.splitlines()]
        assert [e["type"] for e in events] == ["DELETED", "BOOKMARK"]


def test_crd_missing_and_forbidden():
    with KubeDouble(crd_installed=False) as double:
        assert call(double, "POST", JOBS, VALID) == (404, b"404 page not found\n")
    with KubeDouble(forbidden=[("list", "pods")]) as double:
        code, status = call(double, "GET", "/api/v1/namespaces/ns/pods", labelSelector="a=b")
        assert (code, status["message"]) == (403, 'pods is forbidden: User "alice" cannot list resource "pods" in '
                                                  'API group "" in the namespace "ns"')


def test_it_can_answer_as_some_other_server_does():
    """``Foreign``: its status and content to its verbs (a proxy's 404 page to gets here), the API to the rest."""
    page = b"<html><body>404 Not Found</body></html>"
    with KubeDouble(foreign=Foreign("text/html", page, frozenset({"get", "watch"}), status=404)) as double:
        assert call(double, "GET", f"{JOBS}/j") == (404, page)
        assert call(double, "GET", JOBS, watch="true") == (404, page)
        code, listed = call(double, "GET", JOBS)
        assert (code, listed["kind"]) == (200, "MPIJobList")
