"""Rendered MPIJobs against the REAL schemas: the MPI Operator's v2beta1 CRD
(``../shared/schemas``) and the Kubernetes pod schema (kubernetes-validate's
offline copy of the API's OpenAPI, strict: unknown fields are errors).

The API server prunes fields a CRD schema does not declare instead of
rejecting them, so the CRD check is run on a "strict" copy of the schema that
forbids undeclared properties wherever the server would prune them. Where
the CRD is absent (no ../shared beside the checkout), a test skips at its CRD
check, naming the file, after the checks that need no peer material.
"""
from __future__ import annotations

import copy
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from hvdk8s.mpijob import load_spec, render, render_podmonitor

from kube_double import crd_schema

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((REPO / "mpijob" / "examples").glob("*.mpijob.yaml"))
# Oldest and newest Kubernetes versions whose pod schema the manifests must fit.
KUBE_VERSIONS = ("1.29", kubernetes_validate.latest_version())


@cache
def crd_validator(strict: bool) -> jsonschema.protocols.Validator:
    schema = crd_schema()  # cached: the CRD is 9,000 lines
    if strict:
        schema = _forbid_pruned(copy.deepcopy(schema))
    # OpenAPI v3 schemas of CRDs are (structural) JSON Schema draft-4/7 subsets.
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def _forbid_pruned(schema: Any) -> Any:
    """additionalProperties: false wherever the API server would prune unknown keys."""
    if isinstance(schema, dict):
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema["additionalProperties"] = False
        for value in schema.values():
            _forbid_pruned(value)
    elif isinstance(schema, list):
        for item in schema:
            _forbid_pruned(item)
    return schema


def strict_validator(schema: dict[str, Any]) -> jsonschema.protocols.Validator:
    """A validator that also fails on fields the API server would prune."""
    return jsonschema.Draft7Validator(_forbid_pruned(copy.deepcopy(schema)))


def crd_errors(manifest: dict[str, Any], strict: bool = True) -> list[str]:
    errors = crd_validator(strict).iter_errors(manifest)
    return sorted(f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in errors)


def pod_errors(manifest: dict[str, Any]) -> list[str]:
    return template_errors({role: replica["template"] for role, replica in manifest["spec"]["mpiReplicaSpecs"].items()})


def template_errors(templates: dict[str, dict[str, Any]]) -> list[str]:
    """Pod templates against the Kubernetes pod schema, strictly, at both ends of the supported versions."""
    found = []
    for role, pod_template in templates.items():
        template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": role.lower()}, "template": pod_template}
        for version in KUBE_VERSIONS:
            try:
                kubernetes_validate.validate(template, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                found.append(f"{role} (Kubernetes {version}): {'.'.join(map(str, exc.path))}: {exc.message}")
    return found


def test_examples_exist():
    assert [p.name for p in EXAMPLES] == ["cpu.mpijob.yaml", "elastic.mpijob.yaml", "gpu.mpijob.yaml",
                                          "kueue.mpijob.yaml", "rdma.mpijob.yaml", "volcano.mpijob.yaml"]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_checked_in_manifests_fit_crd_and_pod_schema(path: Path):
    manifest = yaml.safe_load(path.read_text())
    assert pod_errors(manifest) == []
    assert crd_errors(manifest) == []


def _variants() -> list[dict[str, Any]]:
    base = {"name": "v", "image": "img:1", "command": ["python", "t.py"]}
    return [
        base,
        base | {"gpu": True, "slotsPerWorker": 8, "workers": 3, "shmSize": None},
        base | {"user": {"uid": 1234, "name": "trainer"}, "metrics": {"enabled": False}},
        base | {"elastic": {"minWorkers": 1, "maxWorkers": 3}, "runPolicy": {"schedulingPolicy": {
            "minAvailable": 2, "queue": "q", "priorityClass": "p", "scheduleTimeoutSeconds": 60,
            "minResources": {"cpu": "4", "memory": "8Gi"}}}},
        base | {"scheduling": {"nodeSelector": {"pool": "a"}, "tolerations": [
            {"key": "spot", "operator": "Equal", "value": "true", "effect": "NoExecute", "tolerationSeconds": 30}]},
            "sharedVolume": {"claimName": "data", "mountPath": "/data", "readOnly": True},
            "runPolicy": {"ttlSecondsAfterFinished": None, "activeDeadlineSeconds": 600}},
    ]  # fmt: skip


@pytest.mark.parametrize("fields", _variants(), ids=["defaults", "gpu", "nonroot-nometrics", "elastic-gang", "nodes-volume"])
def test_rendered_variants_fit_crd_and_pod_schema(fields: dict[str, Any]):
    manifest = render(load_spec(fields))
    assert pod_errors(manifest) == []
    assert crd_errors(manifest) == []


def test_broken_manifests_fail_both_schemas():
    """The checks can fail: wrong types and misspelled fields are caught."""
    manifest = render(load_spec({"name": "v", "image": "img:1", "command": ["python", "t.py"], "gpu": True}))

    wrong_type = copy.deepcopy(manifest)
    wrong_type["spec"]["slotsPerWorker"] = "1"
    wrong_type["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] = 2.5
    worker = wrong_type["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    worker["containers"][0]["ports"][0]["containerPort"] = "2222"

    misspelled = copy.deepcopy(manifest)
    misspelled["spec"]["slotPerWorker"] = 4
    misspelled["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["resource"] = {}
    assert [e.split(":")[0] for e in pod_errors(misspelled)] == [f"Worker (Kubernetes {v})" for v in KUBE_VERSIONS]

    assert crd_errors(wrong_type, strict=False) == [
        "spec.mpiReplicaSpecs.Worker.replicas: 2.5 is not of type 'integer'",
        "spec.mpiReplicaSpecs.Worker.template.spec.containers.0.ports.0.containerPort: '2222' is not of type 'integer'",
        "spec.slotsPerWorker: '1' is not of type 'integer'",
    ]
    assert crd_errors(misspelled, strict=False) == []  # what the API server would accept (and prune)
    assert crd_errors(misspelled) == [
        "spec.mpiReplicaSpecs.Worker.template.spec.containers.0: Additional properties are not allowed ('resource' was unexpected)",
        "spec: Additional properties are not allowed ('slotPerWorker' was unexpected)",
    ]

    bad_enum = copy.deepcopy(manifest)
    bad_enum["spec"]["mpiImplementation"] = "OpenMpi"
    assert crd_errors(bad_enum) == ["spec.mpiImplementation: 'OpenMpi' is not one of ['OpenMPI', 'Intel', 'MPICH']"]


def test_podmonitor_shape():
    """No prometheus-operator schema is available offline: the PodMonitor is checked exactly."""
    spec = load_spec({"name": "pm", "image": "img:1", "command": ["python", "t.py"], "slotsPerWorker": 2,
                      "metrics": {"port": 9400, "path": "/m"}})  # fmt: skip
    assert render_podmonitor(spec) == {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {"name": "pm",
                     "labels": {"app.kubernetes.io/name": "hvdk8s", "app.kubernetes.io/instance": "pm"}},
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": "hvdk8s", "app.kubernetes.io/instance": "pm",
                                         "app.kubernetes.io/component": "worker"}},
            "podMetricsEndpoints": [{"port": "metrics-0", "path": "/m"}, {"port": "metrics-1", "path": "/m"}],
        },
    }  # fmt: skip
    worker = render(spec)["spec"]["mpiReplicaSpecs"]["Worker"]["template"]
    selected = render_podmonitor(spec)["spec"]["selector"]["matchLabels"]
    assert selected.items() <= worker["metadata"]["labels"].items()
    port_names = {p["name"] for p in worker["spec"]["containers"][0]["ports"]}
    assert {e["port"] for e in render_podmonitor(spec)["spec"]["podMetricsEndpoints"]} <= port_names
