"""The Kubernetes edge of hvdk8s: MPIJob, TrainJob (and the benchmark's TFJob) create/get/list/watch/delete, the
TrainingRuntime a TrainJob runs on (owned by it), launcher pods and logs, pods' events
(connecting is ``hvdk8s.cluster.client.connect``).

Every call goes through :func:`translate`, which turns API and connection
failures into :class:`~hvdk8s.common.errors.UserError` messages (see ``kubeerrors``),
so the CLI prints an actionable line instead of a traceback.
"""
from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, cast

import urllib3
from kubernetes import client

from hvdk8s.cluster.client import Cluster, namespace_problem
from hvdk8s.cluster.kubeerrors import (
    Action,
    api_error_message,
    foreign_not_found,
    name_taken_message,
    names_missing_object,
    not_an_event,
    not_kubernetes_message,
    parse_status,
    unreachable_message,
)
from hvdk8s.common import fields
from hvdk8s.common.errors import UserError
from hvdk8s.mpijob.validation import pod_hostname_problem


@dataclass(frozen=True)
class JobKind:
    """A kind of training job hvdk8s submits, and how its controller labels the job's pods."""

    kind: str
    group: str
    version: str
    plural: str
    job_label: str  # on every pod of the job, naming it
    launcher_labels: tuple[tuple[str, str], ...]  # with job_label: the launcher's pods

    @property
    def resource(self) -> str:
        return f"{self.plural}.{self.group}"

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


MPIJOB = JobKind("MPIJob", "kubeflow.org", "v2beta1", "mpijobs", "training.kubeflow.org/job-name",
                 (("training.kubeflow.org/operator-name", "mpi-operator"), ("training.kubeflow.org/job-role", "launcher")))
# Trainer runs a TrainJob as a JobSet of the same name; JobSet labels the pods.
TRAINJOB = JobKind("TrainJob", "trainer.kubeflow.org", "v1alpha1", "trainjobs", "jobset.sigs.k8s.io/jobset-name",
                   (("jobset.sigs.k8s.io/replicatedjob-name", "launcher"),))
# The Training Operator (release-1.9) labels a TFJob's pods like the MPI Operator; its job-role "master" is the
# Chief, or worker 0 without one (tfjob_controller.go IsMasterRole): the task whose log holds the result.
TFJOB = JobKind("TFJob", "kubeflow.org", "v1", "tfjobs", "training.kubeflow.org/job-name",
                (("training.kubeflow.org/operator-name", "tfjob-controller"), ("training.kubeflow.org/job-role", "master")))
KINDS = {k.kind: k for k in (MPIJOB, TRAINJOB, TFJOB)}
RUNTIMES = "trainingruntimes"
REQUEST_TIMEOUT = (10, 60)  # connect, read (seconds) for calls that are not streams
# Foreground: the MPIJob stays (with a deletionTimestamp) until the garbage collector has removed
# its pods, services and secrets, so a resubmission under the same name cannot collide with
# worker pods of the old job that are still terminating.
PROPAGATION = "Foreground"
# Trainer v2.3.0's TrainJob webhook looks the runtime up with the manager's client
# (cmd/trainer-controller-manager/main.go:142, runtimecore.New(ctx, mgr.GetClient(), ...)), which reads from
# the informer cache (controller-runtime v0.24.1 pkg/cluster/cluster.go:206-213): a runtime created a moment
# before can still be missing there. Seconds to wait before each new try of a TrainJob so refused.
RUNTIME_CACHE_WAITS = (0.1, 0.2, 0.4, 0.8, 1.6)
TRAINJOB_WEBHOOK = 'admission webhook "validator.trainjob.trainer.kubeflow.org"'
RUNTIME_MISSING = "specified trainingRuntime must be created before the TrainJob is created"


class WatchExpired(Exception):
    """The watch's resourceVersion is too old (410 Gone): list again, then watch from there."""


@dataclass(frozen=True)
class LauncherPod:
    name: str
    uid: str
    phase: str
    container: str


@contextmanager
def translate(cluster: Cluster, action: Action) -> Iterator[None]:
    """API errors and unreachable servers become UserErrors naming the action and the fix; a 404 no API server
    would send names the server instead."""
    try:
        yield
    except client.ApiException as err:
        if err.status == 0:  # the client's own wrapper for TLS failures
            raise UserError(unreachable_message(cluster.host, err.reason or "TLS error")) from None
        if err.status == 404 and (what := foreign_not_found((err.headers or {}).get("content-type"), err.body, action)):
            raise UserError(not_kubernetes_message(cluster.host, what)) from None
        raise UserError(api_error_message(err.status, err.body, action)) from None
    except urllib3.exceptions.HTTPError as err:
        raise UserError(unreachable_message(cluster.host, err)) from None


def job_name_problem(name: str, kind: JobKind) -> str | None:
    """Why no job of ``kind`` can be called ``name``, or None: the rule its controller holds job names to.

    An MPIJob's is the MPI Operator's (v0.8.2 validateMPIJobName, which hvdk8s renders by:
    ``mpijob.validation.pod_hostname_problem``): its pods' hostnames ``<name>-worker-<i>`` are DNS-1035 labels,
    and the API server makes every name a DNS-1123 subdomain, so the name is a DNS-1035 label short enough for
    ``-worker-0``. A TrainJob's is Trainer's (v2.3.0 CRD, x-kubernetes-validations on metadata.name: an RFC 1035
    label of at most 63 characters). Any other kind's: the API server's rule for a custom resource's name.
    """
    if not name:
        return "it is empty"
    if kind is MPIJOB:
        problem = fields.name_problem(name, "DNS-1035 label") or pod_hostname_problem(name, 1)
        return problem and f"{'it' if problem.startswith('is ') else 'its'} {problem}"
    problem = fields.name_problem(name, "DNS-1035 label" if kind is TRAINJOB else "DNS-1123 subdomain")
    return problem and f"it {problem}"


def check_target(namespace: str, name: str | None, resource: str) -> None:
    """Refuse a request whose path the namespace or name would not end where meant: a GET or DELETE without a
    name is one on the whole collection (a DELETE of a collection deletes every object in it), and a name with
    a '/' or '..' is another path. The callers' own rules are stricter (:func:`job_name_problem`); this is the
    API server's, which every stored object's name and namespace meet."""
    if problem := namespace_problem(namespace):
        raise UserError(f"no request sent: the namespace {namespace!r} {problem}")
    if name is not None and (problem := "is empty" if not name else fields.name_problem(name, "DNS-1123 subdomain")):
        raise UserError(f"no request sent: the {resource} name {name!r} {problem}")


def _job_call(cluster: Cluster, kind: JobKind, verb: str, namespace: str,
              name: str | None = None) -> AbstractContextManager[None]:
    if verb != "create":  # a create names its object in the body, which the API server checks
        check_target(namespace, name, kind.resource)
    return translate(cluster, Action(verb, kind.resource, namespace, name))


def _json(answer: object) -> dict:
    """A custom-objects call's answer: the server's JSON object (the client types it ``object``)."""
    return cast(dict, answer)


def kind_of(manifest: dict) -> JobKind:
    return KINDS[manifest["kind"]]


def create_job(cluster: Cluster, manifest: dict, namespace: str, dry_run: bool = False) -> dict:
    """Create the job (MPIJob or TrainJob, by its ``kind``); with ``dry_run`` the server validates
    and defaults it but stores nothing.

    ``fieldValidation=Strict``: the CRDs have no ``additionalProperties: false``, so by default the
    server prunes a misspelled field and only warns (its default, fieldValidation=Warn); strict makes it
    refuse the job instead.
    """
    kind = kind_of(manifest)
    with _job_call(cluster, kind, "create", namespace, manifest.get("metadata", {}).get("name")):
        return _create(cluster, manifest, namespace, dry_run)


def in_namespace(obj: dict, namespace: str) -> dict:
    """A copy of ``obj`` placed in ``namespace``: the body sent to the API server."""
    body = copy.deepcopy(obj)
    body.setdefault("metadata", {})["namespace"] = namespace
    return body


def _create(cluster: Cluster, manifest: dict, namespace: str, dry_run: bool = False) -> dict:
    kind = kind_of(manifest)
    body = in_namespace(manifest, namespace)
    return _json(cluster.custom.create_namespaced_custom_object(
        kind.group, kind.version, namespace, kind.plural, body, dry_run="All" if dry_run else None,
        field_validation="Strict", _request_timeout=REQUEST_TIMEOUT))


def runtime_not_seen(err: client.ApiException) -> bool:
    """Trainer's TrainJob webhook refused the job because its runtime was not found (Trainer v2.3.0
    pkg/runtime/core/trainingruntime.go ValidateObjects; the API server prefixes the webhook's name)."""
    said = parse_status(err.body).get("message", "")
    return err.status == 403 and said.startswith(TRAINJOB_WEBHOOK) and RUNTIME_MISSING in said


def create_trainjob(cluster: Cluster, job: dict, namespace: str) -> dict:
    """Create a TrainJob whose runtime was just created, trying again while Trainer's webhook does not see
    that runtime yet (see ``RUNTIME_CACHE_WAITS``); a refusal that outlasts them says so."""
    action = Action("create", TRAINJOB.resource, namespace, job["metadata"]["name"])
    waits = iter(RUNTIME_CACHE_WAITS)
    with translate(cluster, action):
        while True:
            try:
                return _create(cluster, job, namespace)
            except client.ApiException as err:
                if not runtime_not_seen(err):
                    raise
                wait = next(waits, None)
                if wait is None:
                    raise UserError(_runtime_not_seen_message(action, job, parse_status(err.body)["message"])) from None
                time.sleep(wait)


def _runtime_not_seen_message(action: Action, job: dict, said: str) -> str:
    return (f"{action} was refused by Kubeflow Trainer's TrainJob webhook {len(RUNTIME_CACHE_WAITS) + 1} times over "
            f"{sum(RUNTIME_CACHE_WAITS):g} s after hvdk8s created the TrainingRuntime "
            f"{job['spec']['runtimeRef']['name']} it runs on: the webhook looks runtimes up in the Trainer "
            "controller's cache, which had not caught up with the API server. Check that the controller is "
            "healthy (kubectl -n kubeflow-system logs deploy/kubeflow-trainer-controller-manager), then submit "
            f"again. The webhook said: {said}")


def refuse_taken_name(cluster: Cluster, manifest: dict, namespace: str) -> None:
    """Refuse a job name already in use, as the create's 409 would, before anything of the job is written:
    a TrainJob's runtime ``hvdk8s-<name>`` must not be rewritten under a job that still runs on it."""
    kind, name = kind_of(manifest), manifest["metadata"]["name"]
    with _job_call(cluster, kind, "get", namespace, name):
        try:
            cluster.custom.get_namespaced_custom_object(kind.group, kind.version, namespace, kind.plural, name,
                                                        _request_timeout=REQUEST_TIMEOUT)
        except client.ApiException as err:
            if names_missing_object(err.status, err.body):  # any other 404: no CRD, or no API server
                return
            raise
    raise UserError(name_taken_message(Action("create", kind.resource, namespace, name)))


def apply_runtime(cluster: Cluster, runtime: dict, namespace: str, dry_run: bool = False) -> tuple[dict, dict | None]:
    """Create the job's TrainingRuntime in its namespace, or replace one an earlier job of that name left there
    (call :func:`refuse_taken_name` first: a live job's runtime must stay as it is). Returns the runtime as the
    server stored it (dry run: would store it) and the one it replaced, None when it created it."""
    group, version = runtime["apiVersion"].split("/")
    name = runtime["metadata"]["name"]
    dry = "All" if dry_run else None
    body = in_namespace(runtime, namespace)
    with translate(cluster, Action("create", f"{RUNTIMES}.{group}", namespace, name)):
        try:
            return _json(cluster.custom.create_namespaced_custom_object(group, version, namespace, RUNTIMES, body,
                                                                        dry_run=dry, field_validation="Strict",
                                                                        _request_timeout=REQUEST_TIMEOUT)), None
        except client.ApiException as err:
            if err.status != 409:
                raise
        current = _json(cluster.custom.get_namespaced_custom_object(group, version, namespace, RUNTIMES, name,
                                                                    _request_timeout=REQUEST_TIMEOUT))
        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        return _json(cluster.custom.replace_namespaced_custom_object(group, version, namespace, RUNTIMES, name,
                                                                     body, dry_run=dry, field_validation="Strict",
                                                                     _request_timeout=REQUEST_TIMEOUT)), current


def delete_runtime(cluster: Cluster, runtime: dict, namespace: str) -> None:
    group, version = runtime["apiVersion"].split("/")
    name = runtime["metadata"]["name"]
    check_target(namespace, name, f"{RUNTIMES}.{group}")
    with translate(cluster, Action("delete", f"{RUNTIMES}.{group}", namespace, name)):
        cluster.custom.delete_namespaced_custom_object(group, version, namespace, RUNTIMES, name,
                                                       _request_timeout=REQUEST_TIMEOUT)


def submit_trainjob(cluster: Cluster, runtime: dict, job: dict, namespace: str) -> dict:
    """Create a TrainJob on its own runtime, in the only order that leaves nothing wrong behind: refuse a taken
    name, create (or replace a left-over) runtime, create the job (Trainer's webhook needs the runtime stored,
    and seen by its cache: :func:`create_trainjob`), make the job the runtime's owner. A runtime this call
    created goes again when the job create fails."""
    refuse_taken_name(cluster, job, namespace)
    _, replaced = apply_runtime(cluster, runtime, namespace)
    try:
        created = create_trainjob(cluster, job, namespace)
    except UserError as refused:
        if replaced is None:
            try:
                delete_runtime(cluster, runtime, namespace)
            except UserError as err:
                raise UserError(f"{refused}\nand the TrainingRuntime {runtime['metadata']['name']} created for it "
                                f"is left behind: {err}") from None
            raise UserError(f"{refused}\nThe TrainingRuntime {runtime['metadata']['name']} created for it is "
                            "deleted again.") from None
        raise
    own_runtime(cluster, runtime, created)
    return created


def dry_run_trainjob(cluster: Cluster, runtime: dict, job: dict, namespace: str) -> tuple[dict, dict | None]:
    """The runtime and the TrainJob as the API server would store them (dry run); the TrainJob None when the
    server cannot check it. Trainer v2.3.0's TrainJob webhook (pkg/webhooks/trainjob_webhook.go, called for dry
    runs too) validates a TrainJob against its runtime as stored (pkg/runtime/core/trainingruntime.go
    ValidateObjects) and refuses it while there is none, so its answer is only true of this job when a stored
    runtime of that name has the spec just rendered."""
    refuse_taken_name(cluster, job, namespace)
    accepted, stored = apply_runtime(cluster, runtime, namespace, dry_run=True)
    if stored is None or stored["spec"] != accepted["spec"]:
        return accepted, None
    return accepted, create_job(cluster, job, namespace, dry_run=True)


def own_runtime(cluster: Cluster, runtime: dict, job: dict) -> dict:
    """Make the created TrainJob the owner of its runtime: the garbage collector then deletes the
    runtime with the job (``hvdk8s delete`` or ``kubectl delete``), leaving nothing behind."""
    group, version = runtime["apiVersion"].split("/")
    namespace, name = job["metadata"]["namespace"], runtime["metadata"]["name"]
    owner = {"apiVersion": job["apiVersion"], "kind": job["kind"], "name": job["metadata"]["name"],
             "uid": job["metadata"]["uid"]}
    with translate(cluster, Action("update", f"{RUNTIMES}.{group}", namespace, name)):
        current = _json(cluster.custom.get_namespaced_custom_object(group, version, namespace, RUNTIMES, name,
                                                                    _request_timeout=REQUEST_TIMEOUT))
        current["metadata"]["ownerReferences"] = [owner]
        return _json(cluster.custom.replace_namespaced_custom_object(group, version, namespace, RUNTIMES, name,
                                                                     current, _request_timeout=REQUEST_TIMEOUT))


def get_job(cluster: Cluster, namespace: str, name: str, kind: JobKind = MPIJOB) -> dict:
    with _job_call(cluster, kind, "get", namespace, name):
        return _json(cluster.custom.get_namespaced_custom_object(kind.group, kind.version, namespace, kind.plural,
                                                                 name, _request_timeout=REQUEST_TIMEOUT))


def list_job(cluster: Cluster, namespace: str, name: str, kind: JobKind = MPIJOB) -> dict:
    """The job as a one-item list: its ``metadata.resourceVersion`` is where a watch starts."""
    with _job_call(cluster, kind, "list", namespace, name):
        return _json(cluster.custom.list_namespaced_custom_object(
            kind.group, kind.version, namespace, kind.plural, field_selector=f"metadata.name={name}",
            _request_timeout=REQUEST_TIMEOUT))


def watch_job(cluster: Cluster, namespace: str, name: str, resource_version: str,
              seconds: int, kind: JobKind = MPIJOB) -> Iterator[tuple[str, dict]]:
    """(event type, object) for changes after ``resource_version``, for at most ``seconds``.

    Ends quietly when the server closes the watch (its timeout) or the connection stalls;
    raises :class:`WatchExpired` when the version is too old (410 Gone), a UserError for any other
    ERROR event and for a line that is no watch event (a server that is not the API server).
    """
    with _job_call(cluster, kind, "watch", namespace, name):
        action = Action("watch", kind.resource, namespace, name)
        try:
            answer = cluster.custom.list_namespaced_custom_object(
                kind.group, kind.version, namespace, kind.plural, field_selector=f"metadata.name={name}",
                resource_version=resource_version, allow_watch_bookmarks=True, timeout_seconds=seconds, watch=True,
                _preload_content=False, _request_timeout=(REQUEST_TIMEOUT[0], seconds + 10))
            for line in stream_lines(answer):
                if line.strip():
                    yield _watch_event(cluster, action, line)
        except client.ApiException as err:
            if err.status == 410:
                raise WatchExpired(str(err.body)) from None
            raise
        except (urllib3.exceptions.ReadTimeoutError, urllib3.exceptions.ProtocolError):
            return


def _watch_event(cluster: Cluster, action: Action, line: str) -> tuple[str, dict]:
    """A watch's line as (event type, object); an ERROR event (its object a ``Status``: 410 Gone for a version
    too old) raised as the ApiException it stands for."""
    try:
        event = json.loads(line)
    except ValueError:
        event = None
    if not (isinstance(event, dict) and isinstance(event.get("type"), str) and isinstance(event.get("object"), dict)):
        raise UserError(not_kubernetes_message(cluster.host, not_an_event(action, line)))
    if event["type"] == "ERROR":
        raise client.ApiException(status=event["object"].get("code", 500), body=json.dumps(event["object"]))
    return event["type"], event["object"]


def stream_lines(answer: object) -> Iterator[str]:
    """The lines of a call's answer with ``_preload_content=False`` (the unread HTTP response, which the client
    types as the object it would have read) as they arrive, the last one too when no newline ends it (the
    client's ``watch.iter_resp_lines`` drops it); closes the response when done or left."""
    response = cast(urllib3.BaseHTTPResponse, answer)
    pending = bytearray()
    try:
        for chunk in response.stream(amt=None):
            pending += chunk
            if b"\n" in chunk:
                *lines, rest = pending.split(b"\n")
                yield from (line.decode("utf-8", "replace") for line in lines)
                pending = bytearray(rest)
        if pending:
            yield pending.decode("utf-8", "replace")
    finally:
        response.close()
        response.release_conn()


def delete_job(cluster: Cluster, namespace: str, name: str, kind: JobKind = MPIJOB) -> dict:
    with _job_call(cluster, kind, "delete", namespace, name):
        return _json(cluster.custom.delete_namespaced_custom_object(
            kind.group, kind.version, namespace, kind.plural, name, propagation_policy=PROPAGATION,
            _request_timeout=REQUEST_TIMEOUT))


def launcher_pod(cluster: Cluster, namespace: str, job: str, kind: JobKind = MPIJOB) -> LauncherPod | None:
    """The newest launcher pod of a job (after a restart there can be several), or None."""
    selector = ",".join(f"{k}={v}" for k, v in (dict(kind.launcher_labels) | {kind.job_label: job}).items())
    with translate(cluster, Action("list", "pods", namespace)):
        # Any: the client's models type every field optional; a listed pod always has metadata and spec
        pods: list[Any] = cluster.core.list_namespaced_pod(namespace, label_selector=selector,
                                                           _request_timeout=REQUEST_TIMEOUT).items
    if not pods:
        return None
    newest = max(pods, key=lambda p: (p.metadata.creation_timestamp.timestamp()
                                      if p.metadata.creation_timestamp else 0.0, p.metadata.name))
    return LauncherPod(newest.metadata.name, newest.metadata.uid, (newest.status.phase if newest.status else None)
                       or "Pending", newest.spec.containers[0].name)


def log_lines(cluster: Cluster, namespace: str, pod: LauncherPod, follow: bool) -> Iterator[str]:
    """The launcher container's log; with ``follow``, lines as they are written until it exits."""
    with translate(cluster, Action("get", "pods/log", namespace, pod.name)):
        if not follow:
            text = cluster.core.read_namespaced_pod_log(pod.name, namespace, container=pod.container,
                                                        _request_timeout=REQUEST_TIMEOUT)
            yield from (text or "").splitlines()
            return
        yield from stream_lines(cluster.core.read_namespaced_pod_log(pod.name, namespace, container=pod.container,
                                                                     follow=True, _preload_content=False))


def job_pods(cluster: Cluster, namespace: str, job: str, kind: JobKind = MPIJOB) -> list[dict]:
    """Every pod of a job (launcher and workers), as plain dicts: name, phase, conditions."""
    with translate(cluster, Action("list", "pods", namespace)):
        pods = cluster.core.list_namespaced_pod(namespace, label_selector=f"{kind.job_label}={job}",
                                                _request_timeout=REQUEST_TIMEOUT).items
    return [cluster.api.sanitize_for_serialization(p) for p in pods]


def events_about(cluster: Cluster, namespace: str, name: str) -> list[dict]:
    """Events whose involved object is ``name`` (the job, or one of its pods), oldest first."""
    with translate(cluster, Action("list", "events", namespace)):
        events = cluster.core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}",
                                                    _request_timeout=REQUEST_TIMEOUT).items
    return [cluster.api.sanitize_for_serialization(e) for e in events]
