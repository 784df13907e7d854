"""The Kubernetes edge of hvdk8s: config, MPIJob create/get/list/watch/delete, launcher pods and logs.

Every call goes through :func:`translate`, which turns API and connection
failures into :class:`~hvdk8s.errors.UserError` messages (see ``kubeerrors``),
so the CLI prints an actionable line instead of a traceback.
"""
from __future__ import annotations

import copy
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import urllib3
from kubernetes import client, config, watch
from kubernetes.config.config_exception import ConfigException

from hvdk8s.errors import UserError
from hvdk8s.launcher.kubeerrors import MPIJOBS, Action, api_error_message, unreachable_message

GROUP, VERSION, PLURAL = "kubeflow.org", "v2beta1", "mpijobs"
# The labels the MPI Operator (v2beta1) puts on the launcher's pods.
LAUNCHER_LABELS = {"training.kubeflow.org/operator-name": "mpi-operator",
                   "training.kubeflow.org/job-role": "launcher"}
JOB_NAME_LABEL = "training.kubeflow.org/job-name"
REQUEST_TIMEOUT = (10, 60)  # connect, read (seconds) for calls that are not streams
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
# Foreground: the MPIJob stays (with a deletionTimestamp) until the garbage collector has removed
# its pods, services and secrets, so a resubmission under the same name cannot collide with
# worker pods (<name>-worker-N) of the old job that are still terminating.
PROPAGATION = "Foreground"


class WatchExpired(Exception):
    """The watch's resourceVersion is too old (410 Gone): list again, then watch from there."""


@dataclass
class Cluster:
    api: client.ApiClient
    namespace: str  # the context's (or service account's) namespace, the default for commands

    @property
    def host(self) -> str:
        return self.api.configuration.host

    @cached_property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    @cached_property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)


@dataclass(frozen=True)
class LauncherPod:
    name: str
    uid: str
    phase: str
    container: str


def connect(kubeconfig: str | None = None, context: str | None = None) -> Cluster:
    """A client for the kubeconfig (``--kubeconfig``, else $KUBECONFIG, else ~/.kube/config), or,
    with none of those inside a pod, the in-cluster service account."""
    path = kubeconfig or os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
    present = any(Path(p).expanduser().is_file() for p in path.split(os.pathsep) if p)
    if not present and not kubeconfig and "KUBERNETES_SERVICE_HOST" in os.environ:
        return _in_cluster()
    if not present:
        raise UserError(f"no cluster configured: no kubeconfig at {path}. Point --kubeconfig (or KUBECONFIG) at "
                        "one, e.g. the file your cluster's setup wrote, or run hvdk8s inside a pod")
    try:
        contexts, current = config.list_kube_config_contexts(config_file=path)
        chosen = next((c for c in contexts if c["name"] == context), None) if context else current
        if chosen is None:
            names = ", ".join(c["name"] for c in contexts) or "none"
            raise UserError(f"kubeconfig {path} has no context {context!r} (it has: {names}); choose with --context"
                            if context else f"kubeconfig {path} sets no current-context; choose one with --context")
        api = config.new_client_from_config(config_file=path, context=context, persist_config=False)
    except ConfigException as err:
        raise UserError(f"cannot use kubeconfig {path}: {err}") from None
    return Cluster(api, (chosen.get("context") or {}).get("namespace") or "default")


def _in_cluster() -> Cluster:
    cfg = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=cfg)
    except ConfigException as err:
        raise UserError(f"cannot use the in-cluster service account: {err}") from None
    namespace = SERVICE_ACCOUNT_NAMESPACE.read_text().strip() if SERVICE_ACCOUNT_NAMESPACE.is_file() else ""
    return Cluster(client.ApiClient(cfg), namespace or "default")


def resolve_namespace(flag: str | None, manifest: str | None, context: str) -> str:
    """--namespace, else the manifest's metadata.namespace, else the context's; they may not disagree."""
    if flag and manifest and flag != manifest:
        raise UserError(f'the manifest sets metadata.namespace "{manifest}" but --namespace is "{flag}": '
                        "drop one of them")
    return flag or manifest or context


@contextmanager
def translate(cluster: Cluster, action: Action) -> Iterator[None]:
    """API errors and unreachable servers become UserErrors naming the action and the fix."""
    try:
        yield
    except client.ApiException as err:
        if err.status == 0:  # the client's own wrapper for TLS failures
            raise UserError(unreachable_message(cluster.host, err.reason or "TLS error")) from None
        raise UserError(api_error_message(err.status, err.body, action)) from None
    except urllib3.exceptions.HTTPError as err:
        raise UserError(unreachable_message(cluster.host, err)) from None


def _mpijob_call(cluster: Cluster, verb: str, namespace: str,
                 name: str | None = None) -> AbstractContextManager[None]:
    return translate(cluster, Action(verb, MPIJOBS, namespace, name))


def create_job(cluster: Cluster, manifest: dict, namespace: str, dry_run: bool = False) -> dict:
    """Create the MPIJob; with ``dry_run`` the server validates and defaults it but stores nothing.

    ``fieldValidation=Strict``: the CRD has no ``additionalProperties: false``, so by default the
    server drops a misspelled field silently; strict makes it refuse the job instead.
    """
    body = copy.deepcopy(manifest)
    body.setdefault("metadata", {})["namespace"] = namespace
    with _mpijob_call(cluster, "create", namespace, body["metadata"].get("name")):
        return cluster.custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, body, dry_run="All" if dry_run else None,
            field_validation="Strict", _request_timeout=REQUEST_TIMEOUT)


def get_job(cluster: Cluster, namespace: str, name: str) -> dict:
    with _mpijob_call(cluster, "get", namespace, name):
        return cluster.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name,
                                                           _request_timeout=REQUEST_TIMEOUT)


def list_job(cluster: Cluster, namespace: str, name: str) -> dict:
    """The job as a one-item list: its ``metadata.resourceVersion`` is where a watch starts."""
    with _mpijob_call(cluster, "list", namespace, name):
        return cluster.custom.list_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, field_selector=f"metadata.name={name}",
            _request_timeout=REQUEST_TIMEOUT)


def watch_job(cluster: Cluster, namespace: str, name: str, resource_version: str,
              seconds: int) -> Iterator[tuple[str, dict]]:
    """(event type, object) for changes after ``resource_version``, for at most ``seconds``.

    Ends quietly when the server closes the watch (its timeout) or the connection stalls;
    raises :class:`WatchExpired` when the version is too old (410 Gone).
    """
    stream = watch.Watch().stream(
        cluster.custom.list_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL,
        field_selector=f"metadata.name={name}", resource_version=resource_version,
        allow_watch_bookmarks=True, timeout_seconds=seconds, _request_timeout=(REQUEST_TIMEOUT[0], seconds + 10))
    try:
        with _mpijob_call(cluster, "watch", namespace, name):
            try:
                for event in stream:
                    yield event["type"], event["raw_object"]
            except client.ApiException as err:
                if err.status == 410:
                    raise WatchExpired(str(err.reason)) from None
                raise
            except (urllib3.exceptions.ReadTimeoutError, urllib3.exceptions.ProtocolError):
                return
    finally:
        stream.close()


def delete_job(cluster: Cluster, namespace: str, name: str) -> dict:
    with _mpijob_call(cluster, "delete", namespace, name):
        return cluster.custom.delete_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name, propagation_policy=PROPAGATION,
            _request_timeout=REQUEST_TIMEOUT)


def launcher_pod(cluster: Cluster, namespace: str, job: str) -> LauncherPod | None:
    """The newest launcher pod of a job (after a restart there can be several), or None."""
    selector = ",".join(f"{k}={v}" for k, v in (LAUNCHER_LABELS | {JOB_NAME_LABEL: job}).items())
    with translate(cluster, Action("list", "pods", namespace)):
        pods = cluster.core.list_namespaced_pod(namespace, label_selector=selector,
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
        yield from watch.Watch().stream(cluster.core.read_namespaced_pod_log, name=pod.name,
                                        namespace=namespace, container=pod.container)
