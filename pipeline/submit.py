"""``hvdk8s pipeline submit``: create the Workflow with the ``kubernetes`` client and follow it.

Argo's controller runs it; hvdk8s only creates the object (``fieldValidation=Strict``,
so a field the CRD does not know is refused rather than dropped) and, with
``--wait``, reads its status until it ends: each step's phase as it changes,
then the workflow's phase and message, exit 0 when it Succeeded.
"""
from __future__ import annotations

import copy
import sys
import time
from typing import Any, TextIO, cast

from kubernetes import client

from hvdk8s.cluster import kube
from hvdk8s.cluster.client import Cluster, connect, resolve_namespace
from hvdk8s.cluster.kubeerrors import Action, invalid_message, parse_status, type_not_served
from hvdk8s.common.errors import UserError

GROUP, VERSION, PLURAL = "argoproj.io", "v1alpha1", "workflows"
WORKFLOWS = f"{PLURAL}.{GROUP}"
ARGO_VERSION = "v4.1.2"  # the release whose CRD the tests validate against
INSTALL_ARGO = ("kubectl create namespace argo && kubectl apply --server-side -n argo -f "
                f"https://github.com/argoproj/argo-workflows/releases/download/{ARGO_VERSION}/install.yaml")
FINISHED = ("Succeeded", "Failed", "Error")
POLL_SECONDS = 5.0
# Node types that are steps of the pipeline (not the DAG/retry groups around them).
STEP_NODES = ("Pod", "Resource", "Skipped", "Suspend")


def submit(workflow: dict[str, Any], kubeconfig: str | None, context: str | None, namespace: str | None, *,
           wait: bool, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    cluster = connect(kubeconfig, context)
    ns = resolve_namespace(namespace, workflow["metadata"].get("namespace"), cluster.namespace)
    name = create(cluster, workflow, ns)["metadata"]["name"]
    print(f"workflow.argoproj.io/{name} created in namespace {ns}", file=out, flush=True)
    return follow(cluster, ns, name, out) if wait else 0


def create(cluster: Cluster, workflow: dict[str, Any], namespace: str) -> dict[str, Any]:
    body = copy.deepcopy(workflow)
    body["metadata"]["namespace"] = namespace
    action = Action("create", WORKFLOWS, namespace, body["metadata"].get("name"))
    with kube.translate(cluster, action):
        try:
            return cast(dict[str, Any], cluster.custom.create_namespaced_custom_object(  # the client types it object
                GROUP, VERSION, namespace, PLURAL, body, field_validation="Strict",
                _request_timeout=kube.REQUEST_TIMEOUT))
        except client.ApiException as err:
            _explain(err, action)
            raise


def follow(cluster: Cluster, namespace: str, name: str, out: TextIO) -> int:
    """Print step phases as they change until the workflow ends; 0 if it Succeeded, else 1."""
    seen: dict[str, str] = {}
    while True:
        with kube.translate(cluster, Action("get", WORKFLOWS, namespace, name)):
            wf = cast(dict[str, Any], cluster.custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, _request_timeout=kube.REQUEST_TIMEOUT))
        status = wf.get("status") or {}
        for node in sorted((status.get("nodes") or {}).values(), key=lambda n: n.get("startedAt") or ""):
            key, phase = node.get("displayName") or node.get("name", "?"), node.get("phase", "Pending")
            if node.get("type") in STEP_NODES and seen.get(key) != phase:
                seen[key] = phase
                detail = f": {node['message']}" if node.get("message") and phase in FINISHED else ""
                print(f"workflow/{name}: {key} {phase}{detail}", file=out, flush=True)
        phase = status.get("phase")
        if phase in FINISHED:
            message = f": {status['message']}" if status.get("message") else ""
            print(f"workflow/{name}: {phase}{message}", file=out, flush=True)
            return 0 if phase == "Succeeded" else 1
        time.sleep(POLL_SECONDS)


def _explain(err: client.ApiException, action: Action) -> None:
    """The messages kubeerrors cannot give for Workflows: Argo not installed, an invalid Workflow."""
    status = parse_status(err.body)
    if err.status == 404 and type_not_served(status, (err.body or "").strip(), PLURAL):
        raise UserError("the cluster does not serve argoproj.io/v1alpha1 Workflows: Argo Workflows is not "
                        f"installed. Install it with:\n  {INSTALL_ARGO}\nthen check: kubectl get crd "
                        "workflows.argoproj.io") from None
    if err.status == 422:
        causes = invalid_message(status, action).split("\n", 1)[1]
        raise UserError(f"the API server rejected the Workflow as invalid:\n{causes}") from None
