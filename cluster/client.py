"""A connection to a Kubernetes cluster: kubeconfig or in-cluster service account, and the namespace to use.

The ``kubernetes`` package is imported by ``connect()``, so commands that only render manifests start fast.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hvdk8s.cluster.kubeerrors import foreign_answer, not_kubernetes_message
from hvdk8s.common import fields
from hvdk8s.common.errors import UserError

if TYPE_CHECKING:
    from kubernetes import client

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
# Response types of the client's calls whose answer is not a Kubernetes object (a pod's log is text).
RAW_ANSWERS = (None, "str", "bytes", "bytearray", "file")


@dataclass
class Cluster:
    api: client.ApiClient
    namespace: str  # the context's (or service account's) namespace, the default for commands

    @property
    def host(self) -> str:
        return self.api.configuration.host

    @cached_property
    def custom(self) -> client.CustomObjectsApi:
        from kubernetes import client

        return client.CustomObjectsApi(self.api)

    @cached_property
    def core(self) -> client.CoreV1Api:
        from kubernetes import client

        return client.CoreV1Api(self.api)


def connect(kubeconfig: str | None = None, context: str | None = None) -> Cluster:
    """A client for the kubeconfig (``--kubeconfig``, else $KUBECONFIG, else ~/.kube/config), or,
    with none of those inside a pod, the in-cluster service account."""
    import yaml
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

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
        cfg = client.Configuration()  # as config.new_client_from_config, with the checking ApiClient
        config.load_kube_config(config_file=path, context=context, client_configuration=cfg, persist_config=False)
        api = api_client(cfg)
    except ConfigException as err:
        raise UserError(f"cannot use kubeconfig {path}: {err}") from None
    except (yaml.YAMLError, TypeError, AttributeError, KeyError, IndexError, ValueError) as err:
        # kubernetes (37.0.2) config/kube_config.py reads the file with yaml.safe_load and walks it without checking types
        # (KubeConfigMerger, KubeConfigLoader): YAML errors, or TypeError & co. for a field of the wrong
        # type; ValueError covers a file that is not UTF-8 and certificate data that is not base64.
        reason = " ".join(str(err).split())
        raise UserError(f"kubeconfig {path} is not a valid kubeconfig: {reason}") from None
    return Cluster(api, (chosen.get("context") or {}).get("namespace") or "default")


def _in_cluster() -> Cluster:
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    cfg = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=cfg)
    except ConfigException as err:
        raise UserError(f"cannot use the in-cluster service account: {err}") from None
    namespace = SERVICE_ACCOUNT_NAMESPACE.read_text().strip() if SERVICE_ACCOUNT_NAMESPACE.is_file() else ""
    return Cluster(api_client(cfg), namespace or "default")


def api_client(configuration: client.Configuration) -> client.ApiClient:
    """An ApiClient that refuses answers no Kubernetes API server gives (see :func:`_checking_api_client`)."""
    return _checking_api_client()(configuration)


@cache
def _checking_api_client() -> type[client.ApiClient]:
    """The client's ApiClient, but a successful answer to a call that expects a Kubernetes object must be one.

    A kubeconfig whose server is some other web server (a proxy's or dashboard's page, a JSON API) gets 200
    answers the client takes as they come: a page or a JSON list as the "object" a custom-objects call returns,
    None for a create answered 200 where the API documents 201, or pydantic's ValidationError for a typed call
    (a PodList). Every caller of :func:`connect` then fails with one line naming the server instead.
    Defined on first use: the ``kubernetes`` package loads with ``connect``.
    """
    from kubernetes import client

    class KubernetesAnswers(client.ApiClient):
        def response_deserialize(self, response_data: Any, response_types_map: Any = None) -> Any:
            types = dict(response_types_map or {})
            code = response_data.status
            if isinstance(code, int) and 200 <= code <= 299:
                expected = types.get(str(code)) or next(
                    (t for c, t in types.items() if c.startswith("2") and t), None)
                if expected not in RAW_ANSWERS:
                    what = foreign_answer(code, response_data.headers.get("content-type"), response_data.data)
                    if what:
                        raise UserError(not_kubernetes_message(self.configuration.host, what))
                    types[str(code)] = expected  # e.g. a create answered 200: still the object it sent
            return super().response_deserialize(response_data, types)

    return KubernetesAnswers


def resolve_namespace(flag: str | None, manifest: str | None, context: str) -> str:
    """--namespace, else the manifest's metadata.namespace, else the context's; they may not disagree, and the
    one used must be a namespace's name (checked before any request puts it in a path)."""
    if flag is not None:
        check_namespace(flag, "-n/--namespace")
    if manifest is not None:
        check_namespace(manifest, "metadata.namespace")
    if flag and manifest and flag != manifest:
        raise UserError(f'the manifest sets metadata.namespace "{manifest}" but --namespace is "{flag}": '
                        "drop one of them")
    if not (flag or manifest):
        check_namespace(context, "the context's namespace (kubeconfig, or the pod's service account)")
    return flag or manifest or context


def namespace_problem(namespace: Any) -> str | None:
    """Why ``namespace`` cannot name a namespace (a DNS-1123 label, apimachinery's ValidateNamespaceName), or None."""
    if not isinstance(namespace, str):
        return f"is not a string ({type(namespace).__name__})"
    return "is empty" if not namespace else fields.name_problem(namespace, "DNS-1123 label")


def check_namespace(namespace: Any, source: str) -> str:
    """``namespace``, or a UserError naming where it came from (``-n/--namespace``, ``metadata.namespace``)."""
    if problem := namespace_problem(namespace):
        shown = json.dumps(namespace, ensure_ascii=False) if isinstance(namespace, str) else repr(namespace)
        raise UserError(f"{source}: {shown} is not a valid namespace: it {problem}")
    return namespace
