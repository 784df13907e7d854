"""A connection to a Kubernetes cluster: kubeconfig or in-cluster service account, and the namespace to use.

The ``kubernetes`` package is imported by ``connect()``, so commands that only render manifests start fast.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from hvdk8s.common.errors import UserError

if TYPE_CHECKING:
    from kubernetes import client

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


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
    from kubernetes import config
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
        api = config.new_client_from_config(config_file=path, context=context, persist_config=False)
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
    return Cluster(client.ApiClient(cfg), namespace or "default")


def resolve_namespace(flag: str | None, manifest: str | None, context: str) -> str:
    """--namespace, else the manifest's metadata.namespace, else the context's; they may not disagree."""
    if flag and manifest and flag != manifest:
        raise UserError(f'the manifest sets metadata.namespace "{manifest}" but --namespace is "{flag}": '
                        "drop one of them")
    return flag or manifest or context
