"""Turn Kubernetes API failures into messages a user can act on.

Pure: takes the HTTP status and body the API server sent (a ``Status`` object,
or plain text for unknown paths) plus what hvdk8s was trying to do, and says
what went wrong and what to run next. No traceback ever reaches the user.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

MPIJOBS = "mpijobs.kubeflow.org"
TRAINJOBS = "trainjobs.trainer.kubeflow.org"
RUNTIMES = "trainingruntimes.trainer.kubeflow.org"
TFJOBS = "tfjobs.kubeflow.org"
OPERATOR_VERSION = "v0.8.2"
OPERATOR_MANIFEST = (f"https://raw.githubusercontent.com/kubeflow/mpi-operator/{OPERATOR_VERSION}"
                     "/deploy/v2beta1/mpi-operator.yaml")
INSTALL_OPERATOR = f"kubectl apply --server-side -f {OPERATOR_MANIFEST}"
TRAINER_VERSION = "v2.3.0"
INSTALL_TRAINER = ('kubectl apply --server-side -k "https://github.com/kubeflow/trainer.git/manifests/overlays/'
                   f'manager?ref={TRAINER_VERSION}"')
TRAINING_OPERATOR_VERSION = "v1.9.0"  # the last release line with TFJob (Trainer v2 has no TensorFlow runtime)
# resource -> (kind, apiVersion) of the objects hvdk8s creates
KINDS = {MPIJOBS: ("MPIJob", "kubeflow.org/v2beta1"), TRAINJOBS: ("TrainJob", "trainer.kubeflow.org/v1alpha1"),
         RUNTIMES: ("TrainingRuntime", "trainer.kubeflow.org/v1alpha1"), TFJOBS: ("TFJob", "kubeflow.org/v1")}
# Kubeflow's kubeflow-edit role (Trainer v2.3.0 manifests/overlays/kubeflow-platform/kubeflow-trainer-roles.yaml)
# lets profile users create TrainJobs but only read TrainingRuntimes.
RUNTIME_RIGHTS = ("each hvdk8s TrainJob brings its own TrainingRuntime, which Kubeflow's kubeflow-edit role does not "
                  "let profile users create: ask an admin to grant create, get, update and delete on "
                  f"{RUNTIMES} in this namespace")
ARTICLE = {"MPIJob": "an"}
# The API server's one answer that is no Status: its 404 for a path no API is served at, Go's http.NotFound text
# (k8s.io/apiserver pkg/util/notfoundhandler), which is what a custom resource whose CRD is not installed gets
# (apiextensions-apiserver's crdHandler passes requests for unknown CRDs or unserved versions on to it).
NOT_SERVED = "404 page not found"


@dataclass(frozen=True)
class Action:
    """What hvdk8s asked the API server: ``create mpijobs.kubeflow.org "x" in namespace "ns"``."""

    verb: str
    resource: str
    namespace: str
    name: str | None = None

    def __str__(self) -> str:
        named = f' "{self.name}"' if self.name else ""
        where = f' in namespace "{self.namespace}"' if self.namespace else ""  # "": cluster-scoped
        return f"{self.verb} {self.resource}{named}{where}"


def parse_status(body: str | bytes | None) -> dict:
    """The ``Status`` object of an error response, or {} when the body is not one."""
    try:
        parsed = json.loads(body or "")
    except (TypeError, ValueError):
        return {}
    return parsed if isinstance(parsed, dict) and parsed.get("kind") == "Status" else {}


def status_details(status: dict) -> dict:
    """A ``Status``'s details (what it is about: kind, name, causes), {} when it has none."""
    details = status.get("details")
    return details if isinstance(details, dict) else {}


def api_error_message(code: int, body: str | bytes | None, action: Action) -> str:
    status = parse_status(body)
    said = status.get("message") or _text(body).strip()
    kind, api_version = KINDS.get(action.resource, ("object", ""))
    if code == 404:
        return not_found_message(status, said, action)
    if code == 409 and status.get("reason") == "AlreadyExists":
        return name_taken_message(action)
    # k8s.io/apiserver admission/plugin/webhook/errors/statuserror.go ToStatusErr: a webhook denial is
    # "admission webhook \"NAME\" denied the request: ...", with code 403 unless the webhook gives one
    if code == 403 and said.startswith("admission webhook "):
        return f"{action} was refused by an admission webhook (not RBAC): {said}"
    if code == 403:
        ask = RUNTIME_RIGHTS if action.resource == RUNTIMES else "ask a cluster admin for a Role and RoleBinding that grant it"
        return (f"forbidden by RBAC: you may not {action}. The API server said: {said}. "
                f"Check with: kubectl auth can-i {action.verb} {action.resource} -n {action.namespace}; {ask}")
    if code == 401:
        return ("the API server rejected the credentials (401 Unauthorized): refresh them in the kubeconfig "
                "(log in again) or choose another --context")
    if code == 422:
        return invalid_message(status, action)
    if code == 400 and "unknown field" in said:
        return (f'the API server rejected {kind} "{action.name}": {said} (misspelled, or not a field of '
                f"{api_version} {kind}s)")
    return f"could not {action}: the API server answered {code} {status.get('reason', '')}: {said}".replace(
        "  ", " ")


def not_found_message(status: dict, said: str, action: Action) -> str:
    """What a 404 says is missing. A ``Status`` naming an object: that object (the one asked for, the namespace, or
    another the request needs). The plain ``NOT_SERVED`` page, or a ``Status`` naming none (apimachinery's "the
    server could not find the requested resource"): the resource type itself, for a job kind its CRD."""
    details = status_details(status)
    plural = action.resource.split(".")[0].split("/")[0]
    if details.get("kind") == "namespaces":
        # the NamespaceLifecycle admission plugin refuses creates in a namespace that does not exist
        # (k8s.io/apiserver plugin/namespace/lifecycle: errors.NewNotFound(v1.Resource("namespaces"), namespace))
        return namespace_missing_message(action, details.get("name") or action.namespace)
    if details.get("kind") in (None, plural) and details.get("name"):
        return f'{action.resource} "{action.name}" not found in namespace "{action.namespace}"' + (
            f' (list them: kubectl get {plural} -n {action.namespace})' if action.resource in KINDS else "")
    if action.resource in KINDS and type_not_served(status, said, plural):
        return crd_missing_message(action.resource)
    return f"could not {action}: the API server answered 404 NotFound: {said}"


def type_not_served(status: dict, said: str, plural: str) -> bool:
    """A 404 (its ``Status``, or its text when it has none) that says the resource type ``plural`` is not served:
    the plain ``NOT_SERVED`` page, or a ``Status`` naming no object (for a custom resource: no CRD, or not
    this version)."""
    details = status_details(status)
    return (bool(status) or said == NOT_SERVED) and details.get("kind") in (None, plural) and not details.get("name")


def names_missing_object(code: int, body: str | bytes | None) -> bool:
    """The answer is the API server's 404 for the object asked for: a ``Status`` that names it, so the resource
    type is served (a CRD not installed gets ``NOT_SERVED``, a proxy its own page)."""
    return code == 404 and bool(status_details(parse_status(body)).get("name"))


def namespace_missing_message(action: Action, namespace: str) -> str:
    return (f'could not {action}: namespace "{namespace}" does not exist. Create it (kubectl create namespace '
            f"{namespace}) or choose an existing one (kubectl get namespaces) with -n/--namespace")


def name_taken_message(action: Action) -> str:
    """The job's name is in use (the server's 409 AlreadyExists, or found before creating anything)."""
    kind = KINDS.get(action.resource, ("object", ""))[0]
    api = "" if action.resource == MPIJOBS else " --api trainjob"
    delete = (f"kubectl delete tfjob {action.name}" if action.resource == TFJOBS
              else f"hvdk8s delete {action.name}{api}")
    return (f'{ARTICLE.get(kind, "a")} {kind} named "{action.name}" already exists in namespace '
            f'"{action.namespace}": delete it first ({delete} -n {action.namespace}) '
            "or change metadata.name")


def invalid_message(status: dict, action: Action) -> str:
    """422 Invalid: one line per cause, each naming its field path."""
    causes = (status.get("details") or {}).get("causes") or []
    lines = [f"  {c.get('field', '?')}: {c.get('message', c.get('reason', ''))}" for c in causes]
    if not lines:
        lines = [f"  {status.get('message', 'no details given')}"]
    kind = KINDS.get(action.resource, ("object",))[0]
    return f'the API server rejected {kind} "{action.name}" as invalid:\n' + "\n".join(lines)


def crd_missing_message(resource: str = MPIJOBS) -> str:
    if resource == MPIJOBS:
        return ("the cluster does not serve kubeflow.org/v2beta1 MPIJobs: the MPI Operator is not installed "
                f"(or only the older kubeflow.org/v1 MPIJob CRD is). Install it with:\n  {INSTALL_OPERATOR}\n"
                "then check: kubectl get crd mpijobs.kubeflow.org")
    if resource == TFJOBS:
        return ("the cluster does not serve kubeflow.org/v1 TFJobs: the Kubeflow Training Operator is not installed "
                "(hvdk8s bench runs its TensorFlow strategies as TFJobs; Kubeflow Trainer v2 has no TensorFlow runtime). "
                f"Install the Training Operator {TRAINING_OPERATOR_VERSION} with TFJob alone enabled, so that its "
                "MPIJob v1 does not replace the MPI Operator's (docs/kubernetes.md, \"TFJobs\"), then check: "
                "kubectl get crd tfjobs.kubeflow.org")
    return (f"the cluster does not serve trainer.kubeflow.org/v1alpha1 {KINDS[resource][0]}s: Kubeflow Trainer is "
            f"not installed. Install it with:\n  {INSTALL_TRAINER}\nthen check: kubectl get crd {resource}")


def unreachable_message(host: str, error: BaseException | str) -> str:
    """No answer at all: say where hvdk8s looked and the low-level cause, briefly."""
    text = str(getattr(error, "reason", None) or error)
    match = re.search(r"Failed to establish a new connection: [^\"')]+|Read timed out[^\"')]*|\[Errno[^\]]*\][^\"')]*",
                      text)
    cause = match.group(0).strip() if match else text
    return (f"cannot reach the Kubernetes API server at {host}: {cause}. Is the cluster up and is this the "
            "right kubeconfig context? Check with: kubectl cluster-info (choose one with --kubeconfig/--context)")


# The media types of JSON, as the client's ApiClient.deserialize matches them (kubernetes 37.0.2 api_client.py).
JSON_MEDIA = re.compile(r"application/(json|[\w!#$&.+\-^_]+\+json)", re.IGNORECASE)


def foreign_answer(code: int, content_type: str | None, body: bytes | str | None) -> str | None:
    """What in a successful (2xx) answer to a call expecting an object shows that no Kubernetes API server sent it,
    or None. The API server answers such calls with a JSON object that names its ``kind`` and ``apiVersion`` (the
    object, its list, or a ``Status``); a web page or any other JSON is someone else's."""
    media = (content_type or "").split(";")[0].strip()
    if media and not JSON_MEDIA.fullmatch(media):
        return f"it answered {code} with {media} content: {_excerpt(body)}"
    try:
        obj = json.loads(body or b"")
    except ValueError:  # JSONDecodeError, and UnicodeDecodeError for bytes that are no text
        return f"it answered {code} with content that is not JSON: {_excerpt(body)}"
    if not isinstance(obj, dict) or not all(isinstance(obj.get(key), str) for key in ("kind", "apiVersion")):
        return (f"it answered {code} with JSON that is not a Kubernetes object (no kind and apiVersion): "
                f"{_excerpt(body)}")
    return None


def foreign_not_found(content_type: str | None, body: bytes | str | None, action: Action) -> str | None:
    """What in a 404 answer shows that no Kubernetes API server sent it, or None. The API server's 404 is a ``Status``,
    or ``NOT_SERVED`` for a path it serves nothing at; a web page or other text is a proxy's or another server's
    (the kubeconfig's server URL, or its path, is not the API server's)."""
    if parse_status(body) or _text(body).strip() == NOT_SERVED:
        return None
    media = (content_type or "").split(";")[0].strip()
    return (f"it answered {action} with 404 and {media + ' ' if media else ''}content that is not a Kubernetes "
            f"Status: {_excerpt(body)}")


def not_an_event(action: Action, line: str) -> str:
    """A line of a watch's answer that is no watch event (a JSON object with a type and an object)."""
    return f"it answered {action} with a line that is not a watch event: {_excerpt(line)}"


def watch_cut_message(host: str, action: Action, watches: int) -> str:
    """The server ended ``watches`` watches in a row within a second of their start, none with a change of the job
    (client-go's reflector calls one a "very short watch"; a 410 Gone each time is one too): an API server keeps a
    watch open until its timeout."""
    return (f"could not {action}: the server at {host} ended the watch {watches} times in a row as soon as it began, "
            "without a change of the job, where a Kubernetes API server keeps a watch open until its timeout. Is the "
            "kubeconfig's server the cluster's API server, with no proxy between that cuts streams? Check with: "
            f"kubectl get {action.resource} {action.name} -n {action.namespace} --watch")


def not_kubernetes_message(host: str, what: str) -> str:
    """The server answered, but not as a Kubernetes API server: the kubeconfig points somewhere else."""
    return (f"the server at {host} did not answer as a Kubernetes API server: {what}. Is this the right kubeconfig "
            "context, and its server URL (path included) the cluster's API server? Check with: kubectl cluster-info "
            "(choose one with --kubeconfig/--context)")


def _text(body: bytes | str | None) -> str:
    return body.decode("utf-8", "replace") if isinstance(body, bytes) else body or ""


def _excerpt(body: bytes | str | None, most: int = 80) -> str:
    text = " ".join(_text(body).split())
    return json.dumps(text[:most] + ("..." if len(text) > most else ""), ensure_ascii=False) if text else "(empty)"
