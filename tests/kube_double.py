"""A local HTTP double of the Kubernetes API, just the calls ``hvdk8s`` makes.

No cluster can run in CI, so the cluster client is tested against this server
through the real ``kubernetes`` client and a generated kubeconfig. It answers
the way a real API server does for: create (with ``dryRun=All``), get, list
(with ``fieldSelector=metadata.name=``), watch (chunked JSON events, bookmarks,
server-side timeouts, ``410 Gone``) and delete (Foreground/Background) of
``kubeflow.org/v2beta1`` MPIJobs and ``trainer.kubeflow.org/v1alpha1`` TrainJobs,
create/get/replace of (namespaced) TrainingRuntimes, deleted with their owner as the garbage
collector does (or orphaned), and Kubeflow Trainer's TrainJob webhook refusing a TrainJob whose
runtime is not stored (or, with ``webhook_lag``, not yet in its cache); listing pods by label selector; reading a
pod's log, following it as lines arrive. Create bodies are pruned, defaulted
and validated against the REAL CRD schema (``../shared/schemas``); invalid ones
get ``422 Invalid`` with per-field causes like the API server's. Where that CRD is
absent, the create answers 500 and the test skips, naming the file (see ``answer``).

Per test it can play: the CRD not installed (``404 page not found``), RBAC
denials (``403`` naming user, verb, resource, namespace), creates in a namespace
that does not exist (``404`` for the namespace, as NamespaceLifecycle admission
answers), a server that is not a Kubernetes API server at all (``Foreign``: 200 and a web
page or other JSON, or a proxy's 404 page, to every request or some verbs; or a watch body no API
server sends) and a scripted MPI Operator that walks an MPIJob through its conditions, replica counts
and a launcher pod that writes log lines, or leaves its worker pods Pending with the scheduler's
FailedScheduling events (listed by ``fieldSelector``, like the API server's events).
"""
from __future__ import annotations

import copy
import functools
import itertools
import json
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from werkzeug.routing import Map, Rule
from werkzeug.serving import WSGIRequestHandler, make_server
from werkzeug.wrappers import Request, Response

from conftest import shared, skip_after_call

GROUP, VERSION, PLURAL, KIND = "kubeflow.org", "v2beta1", "mpijobs", "MPIJob"
MPIJOB_CRD = "mpijob-v2beta1-crd.yaml"  # in ../shared/schemas
LAUNCHER_LABELS = ("training.kubeflow.org/operator-name", "training.kubeflow.org/job-name",
                   "training.kubeflow.org/job-role")


@dataclass(frozen=True)
class Resource:
    """A custom resource the double serves, validated with its real CRD; for jobs, how its pods are labelled."""

    group: str
    version: str
    plural: str
    kind: str
    crd: str  # file in ../shared/schemas
    namespaced: bool = True
    job_label: str = ""  # pods: names the job
    role_label: str = ""  # pods: launcher / worker role
    roles: tuple[str, str] = ("launcher", "worker")
    pod_labels: tuple[tuple[str, str], ...] = ()  # pods: fixed extra labels

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


MPIJOBS = Resource(GROUP, VERSION, PLURAL, KIND, MPIJOB_CRD, job_label=LAUNCHER_LABELS[1],
                   role_label=LAUNCHER_LABELS[2], pod_labels=((LAUNCHER_LABELS[0], "mpi-operator"),))
# Kubeflow Trainer runs a TrainJob as a JobSet of the same name; JobSet labels its pods.
TRAINJOBS = Resource("trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob", "trainer.kubeflow.org_trainjobs.yaml",
                     job_label="jobset.sigs.k8s.io/jobset-name", role_label="jobset.sigs.k8s.io/replicatedjob-name",
                     roles=("launcher", "node"))
# TrainingRuntime's CRD (Trainer v2.3.0 manifests/base/crds) differs from ClusterTrainingRuntime's only in
# its scope and description, so the ClusterTrainingRuntime schema in ../shared/schemas validates it.
RUNTIMES = Resource("trainer.kubeflow.org", "v1alpha1", "trainingruntimes", "TrainingRuntime",
                    "trainer.kubeflow.org_clustertrainingruntimes.yaml")
RESOURCES = (MPIJOBS, TRAINJOBS, RUNTIMES)
DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


@functools.cache
def crd_schema(version: str = VERSION, crd_file: str = MPIJOB_CRD) -> dict:
    """openAPIV3Schema of one version of a real CRD (the MPIJob one by default; read once: it is 9,000 lines).
    Skips the calling test where the file is absent."""
    crd = yaml.load(shared(f"schemas/{crd_file}").read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    return next(v for v in crd["spec"]["versions"] if v["name"] == version)["schema"]["openAPIV3Schema"]


# ---------------------------------------------------------------- schema: what the API server does to a body


def prune(obj: Any, schema: dict, where: str = "", dropped: list[str] | None = None) -> Any:
    """Drop fields the structural schema does not know, as the API server does; their paths go
    to ``dropped`` (``fieldValidation=Strict`` turns them into an error)."""
    dropped = [] if dropped is None else dropped
    if isinstance(obj, dict) and schema.get("type") == "object":
        if "properties" in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
            known = schema["properties"]
            dropped += [f"{where}{k}" for k in obj if k not in known]
            return {k: prune(v, known[k], f"{where}{k}.", dropped) for k, v in obj.items() if k in known}
        if isinstance(schema.get("additionalProperties"), dict):
            return {k: prune(v, schema["additionalProperties"], f"{where}{k}.", dropped) for k, v in obj.items()}
    if isinstance(obj, list) and "items" in schema:
        return [prune(v, schema["items"], f"{where.rstrip('.')}[{i}].", dropped) for i, v in enumerate(obj)]
    return obj


def apply_defaults(obj: Any, schema: dict) -> None:
    """Fill schema ``default``s into objects that exist, as structural defaulting does."""
    if isinstance(obj, dict):
        for key, sub in schema.get("properties", {}).items():
            if key not in obj and "default" in sub:
                obj[key] = copy.deepcopy(sub["default"])
            if key in obj:
                apply_defaults(obj[key], sub)
        if isinstance(schema.get("additionalProperties"), dict):
            for value in obj.values():
                apply_defaults(value, schema["additionalProperties"])
    elif isinstance(obj, list) and "items" in schema:
        for value in obj:
            apply_defaults(value, schema["items"])


def field_path(schema: dict, path: Iterable[Any]) -> str:
    """Kubernetes field path: ``spec.mpiReplicaSpecs[Worker].template.spec.containers[0]``."""
    out, node = "", schema
    for part in path:
        if isinstance(part, int):
            out, node = f"{out}[{part}]", node.get("items", {})
        elif part in node.get("properties", {}):
            out, node = f"{out}.{part}" if out else part, node["properties"][part]
        else:
            out, node = f"{out}[{part}]", node.get("additionalProperties", {})
    return out


def _go_type(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", float: "number",
            int: "integer", type(None): "null"}[type(value)]


def schema_causes(body: dict, schema: dict) -> list[dict]:
    """Validate like the API server; one StatusCause per problem, sorted by field."""
    causes = []
    for err in jsonschema.Draft4Validator(schema).iter_errors(body):
        where = field_path(schema, err.absolute_path)
        if err.validator == "required":
            missing = [p for p in err.validator_value if p not in err.instance]
            causes += [_cause("FieldValueRequired", f"{where}.{p}" if where else p, "Required value")
                       for p in missing]
        elif err.validator == "type":
            got = _go_type(err.instance)
            causes.append(_cause("FieldValueTypeInvalid", where, f'Invalid value: "{got}": {where} in body '
                                 f'must be of type {err.validator_value}: "{got}"'))
        elif err.validator == "enum":
            allowed = ", ".join(json.dumps(v) for v in err.validator_value)
            causes.append(_cause("FieldValueNotSupported", where,
                                 f"Unsupported value: {json.dumps(err.instance)}: supported values: {allowed}"))
        else:
            causes.append(_cause("FieldValueInvalid", where,
                                 f"Invalid value: {json.dumps(err.instance)}: {err.message}"))
    unique = {(c["field"], c["message"]): c for c in causes}
    return sorted(unique.values(), key=lambda c: (c["field"], c["message"]))


def _cause(reason: str, field_: str, message: str) -> dict:
    return {"reason": reason, "message": message, "field": field_}


def metadata_causes(meta: dict) -> list[dict]:
    name = meta.get("name")
    if not name and not meta.get("generateName"):
        return [_cause("FieldValueRequired", "metadata.name", "Required value: name or generateName is required")]
    if name and (not DNS1123_SUBDOMAIN.fullmatch(name) or len(name) > 253):
        return [_cause("FieldValueInvalid", "metadata.name",
                       f'Invalid value: "{name}": a lowercase RFC 1123 subdomain must consist of lower case '
                       "alphanumeric characters, '-' or '.', and must start and end with an alphanumeric "
                       "character (e.g. 'example.com', regex used for validation is "
                       "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")]
    return []


# ---------------------------------------------------------------- the scripted operator


@dataclass
class Step:
    """One thing the emulated operator does to an MPIJob, ``delay`` seconds after the previous step.

    ``condition`` is (type, status, reason, message) with ``{ns}``/``{name}`` filled in;
    ``replicas`` replaces ``status.replicaStatuses``; ``launcher`` sets the phase of the
    launcher pod (``new_launcher`` first creates a fresh one, as after a restart);
    ``logs`` are appended to the launcher's log; ``until_log_follower`` holds the job
    here until a client follows the launcher's log (so a test of live following is not a race).
    ``unschedulable`` creates the Worker pods, Pending, each with a FailedScheduling event.
    """

    condition: tuple[str, str, str, str] | None = None
    replicas: dict[str, dict[str, int]] | None = None
    launcher: str | None = None
    new_launcher: bool = False
    logs: tuple[str, ...] = ()
    until_log_follower: bool = False
    unschedulable: str | None = None  # create the worker pods Pending, with this FailedScheduling message
    workers: int = 2  # how many worker pods ``unschedulable`` creates
    launcher_unschedulable: str | None = None  # the launcher pod's FailedScheduling message
    delay: float = 0.05


def succeeding(logs: Iterable[str], workers: int = 2, live: bool = False) -> list[Step]:
    """The MPI Operator's path of a job that trains and finishes (its real reasons and messages).

    ``live``: the launcher writes its log only once someone follows it, one line every 0.05 s.
    """
    return [
        Step(condition=("Created", "True", "MPIJobCreated", "MPIJob {ns}/{name} is created."),
             replicas={"Launcher": {}, "Worker": {}}),
        Step(replicas={"Launcher": {}, "Worker": {"active": workers}}, launcher="Pending", new_launcher=True),
        Step(condition=("Running", "True", "MPIJobRunning", "MPIJob {ns}/{name} is running."),
             replicas={"Launcher": {"active": 1}, "Worker": {"active": workers}}, launcher="Running"),
        *([Step(until_log_follower=True)] if live else []),
        *[Step(logs=(line,), delay=0.05 if live else 0.02) for line in logs],
        Step(condition=("Succeeded", "True", "MPIJobSucceeded", "MPIJob {ns}/{name} successfully completed."),
             replicas={"Launcher": {"succeeded": 1}, "Worker": {}}, launcher="Succeeded"),
    ]


# Trainer v2.3.0 (pkg/apis/trainer/v1alpha1/trainjob_types.go, JobStatus) counts child Jobs, and
# "active" is a child Job "with at least 1 pod in a running or pending state": hvdk8s's runtime has
# one node Job (all nodes its pods) and one launcher Job, which JobSet creates once node is Ready.
NODES_READY = {"node": {"active": 1, "ready": 1}, "launcher": {"active": 1}}


def trainjob_succeeding(logs: Iterable[str]) -> list[Step]:
    """Kubeflow Trainer's path of a TrainJob that trains and finishes: jobsStatus per replicated
    job (no Running condition: Trainer has none; the launcher pod starting changes no count),
    then Complete (its JobSet's reason and message)."""
    return [
        Step(replicas={"node": {"active": 1}}),
        Step(replicas=NODES_READY, launcher="Pending", new_launcher=True),
        Step(launcher="Running"),
        *[Step(logs=(line,), delay=0.02) for line in logs],
        Step(condition=("Complete", "True", "AllJobsCompleted", "jobset completed successfully"),
             replicas={"node": {}, "launcher": {"succeeded": 1}}, launcher="Succeeded"),
    ]


def trainjob_launcher_unschedulable(message: str) -> list[Step]:
    """The nodes are Ready, so JobSet creates the launcher Job, whose pod the scheduler cannot
    place: the launcher Job counts as active, its pod stays Pending."""
    return [Step(replicas={"node": {"active": 1}}),
            Step(replicas=NODES_READY, launcher="Pending", new_launcher=True, launcher_unschedulable=message)]


def failing(reason: str, message: str, logs: Iterable[str] = (), workers: int = 2) -> list[Step]:
    """A job whose launcher fails for good: the operator copies the launcher Job's reason."""
    *start, _ = succeeding(logs, workers)
    return [*start, Step(condition=("Failed", "True", reason, message),
                         replicas={"Launcher": {"failed": 1}, "Worker": {}}, launcher="Failed")]


# ---------------------------------------------------------------- the server


@dataclass(frozen=True)
class Foreign:
    """A fixed answer, ``status`` with this content, to the requests of ``verbs`` (create, get, list, watch, update,
    delete), to every request when empty: what a server that is not a Kubernetes API server (a web page, some other
    JSON API, a proxy's 404 page) answers, or a watch body as no API server sends it (a last event with no newline,
    nothing at all)."""

    content_type: str
    body: bytes
    verbs: frozenset[str] = frozenset()
    status: int = 200


HTML_PAGE = Foreign("text/html; charset=utf-8", b"<!DOCTYPE html>\n<html><head><title>Sign in</title></head>\n"
                    b"<body>Please sign in</body></html>\n")
JSON_LIST = Foreign("application/json", b"[1, 2, 3]\n")  # a line: a watch drops an unterminated one


@dataclass
class Pod:
    manifest: dict
    log: list[str] = field(default_factory=list)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_body(code: int, reason: str, message: str, details: dict | None = None) -> dict:
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}
    if details:
        body["details"] = details
    return body


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: dict | None = None):
        super().__init__(message)
        self.body = status_body(code, reason, message, details)


class _QuietHandler(WSGIRequestHandler):
    def log(self, *args: object) -> None:  # tests read self.requests instead of an access log
        pass


class KubeDouble:
    """The fake API server. Use as a context manager; ``write_kubeconfig`` points the client at it.

    crd_installed: False answers every kubeflow.org/v2beta1 call with a plain ``404 page not found``;
    trainer_installed: the same for trainer.kubeflow.org (TrainJobs, TrainingRuntimes).
    forbidden: (verb, resource) pairs this user may not do, e.g. ("create", "mpijobs"), ("get", "pods/log").
    lifecycle: the steps the scripted operator takes after each (non-dry-run) create.
    max_watch_seconds: end every watch this soon (as a server's timeout), forcing the client to resume.
    expire_watches: answer this many watches that name a resourceVersion with ``410 Gone``.
    webhook_lag: Trainer's TrainJob webhook does not see a runtime created less than this many seconds ago
    (see ``_trainjob_webhook``).
    namespaces: the namespaces that exist (None: any); a create or replace elsewhere is refused as the API
    server's NamespaceLifecycle admission refuses it.
    foreign: answer as a server that is not a Kubernetes API server (see ``Foreign``); requests are still recorded.
    """

    def __init__(self, *, crd_installed: bool = True, trainer_installed: bool = True, forbidden: Iterable[tuple[str, str]] = (),
                 lifecycle: list[Step] | None = None, max_watch_seconds: float = 30.0,
                 expire_watches: int = 0, foreground_delay: float = 0.1, user: str = "alice",
                 webhook_lag: float = 0.0, namespaces: Iterable[str] | None = None, foreign: Foreign | None = None):
        self.resources = {(r.group, r.version, r.plural): r for r in RESOURCES
                          if (r.group == GROUP and crd_installed) or (r.group != GROUP and trainer_installed)}
        self.forbidden = set(forbidden)
        self.lifecycle = lifecycle
        self.max_watch_seconds = max_watch_seconds
        self.expire_watches = expire_watches
        self.foreground_delay = foreground_delay
        self.user = user
        self.webhook_lag = webhook_lag
        self.namespaces = None if namespaces is None else set(namespaces)
        self.foreign = foreign
        self.jobs: dict[tuple[str, str, str], dict] = {}  # (plural, namespace or "", name)
        self.created_at: dict[tuple[str, str, str], float] = {}  # as jobs: time.monotonic() of the create
        self.pods: dict[tuple[str, str], Pod] = {}
        self.events: list[tuple[int, str, dict]] = []
        self.kube_events: list[dict] = []  # core/v1 Events (what `kubectl get events` lists)
        self.requests: list[tuple[str, str, dict]] = []
        self.log_reads: list[tuple[str, bool, str]] = []  # (pod, follow, its phase when asked)
        self._rv = itertools.count(100)
        self._uids = itertools.count(1)
        self._cond = threading.Condition()
        self._closing = threading.Event()
        self._threads: list[threading.Thread] = []
        prefix = "/apis/<group>/<version>/namespaces/<ns>/<plural>"
        self._routes = Map([
            Rule(prefix, methods=["GET", "POST"], endpoint="jobs"),
            Rule(f"{prefix}/<name>", methods=["GET", "PUT", "DELETE"], endpoint="job"),
            Rule("/apis/<group>/<version>/<plural>", methods=["GET", "POST"], endpoint="jobs"),
            Rule("/apis/<group>/<version>/<plural>/<name>", methods=["GET", "PUT", "DELETE"], endpoint="job"),
            Rule("/api/v1/namespaces/<ns>/pods", methods=["GET"], endpoint="pods"),
            Rule("/api/v1/namespaces/<ns>/pods/<name>/log", methods=["GET"], endpoint="log"),
            Rule("/api/v1/namespaces/<ns>/events", methods=["GET"], endpoint="kube_events"),
        ])

    # ------------------------------------------------------------ lifecycle of the server

    def __enter__(self) -> KubeDouble:
        self._server = make_server("127.0.0.1", 0, self._wsgi, threaded=True, request_handler=_QuietHandler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_port}"
        self._spawn(self._server.serve_forever, 0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self._closing.set()
        with self._cond:
            self._cond.notify_all()
        self._server.shutdown()
        self._server.server_close()
        for thread in self._threads:
            thread.join(timeout=5)

    def _spawn(self, target, *args) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def write_kubeconfig(self, path: Path, namespace: str | None = None, context: str = "double") -> Path:
        """A kubeconfig whose current context points at this server (with a bearer token)."""
        ctx = {"cluster": "double", "user": self.user} | ({"namespace": namespace} if namespace else {})
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": context,
            "clusters": [{"name": "double", "cluster": {"server": self.url}}],
            "users": [{"name": self.user, "user": {"token": "test-token"}}],
            "contexts": [{"name": context, "context": ctx}],
        }))
        return path

    # ------------------------------------------------------------ state changes (hold self._cond)

    def _record(self, kind: str, obj: dict) -> None:
        obj["metadata"]["resourceVersion"] = str(next(self._rv))
        self.events.append((int(obj["metadata"]["resourceVersion"]), kind, copy.deepcopy(obj)))
        self._cond.notify_all()

    def job(self, namespace: str, name: str, res: Resource = MPIJOBS) -> dict | None:
        with self._cond:
            return copy.deepcopy(self.jobs.get((res.plural, namespace, name)))

    def remove(self, namespace: str, name: str, res: Resource = MPIJOBS) -> None:
        """Someone else deletes the job (background cascade): watchers see DELETED."""
        with self._cond:
            self._remove(res, namespace, name)

    def launcher_pods(self, namespace: str, job: str, res: Resource = MPIJOBS) -> list[dict]:
        with self._cond:
            return [copy.deepcopy(p.manifest) for (ns, _), p in self.pods.items()
                    if ns == namespace and p.manifest["metadata"]["labels"].get(res.job_label) == job
                    and p.manifest["metadata"]["labels"].get(res.role_label) == res.roles[0]]

    def put_worker(self, namespace: str, job: str, name: str, *, phase: str = "Running", ready: bool = True,
                   res: Resource = MPIJOBS) -> None:
        """A worker pod as its controller makes it (the MPI Operator re-creates a deleted one under its name)."""
        with self._cond:
            self._pod(res, {"metadata": {"namespace": namespace, "name": job}}, name, res.roles[1], "worker",
                      phase=phase, conditions=[{"type": "Ready", "status": "True" if ready else "False"}])

    def delete_pod(self, namespace: str, name: str) -> None:
        """The pod is gone (node drain, spot reclaim, ``kubectl delete pod``)."""
        with self._cond:
            del self.pods[(namespace, name)]

    # ------------------------------------------------------------ HTTP

    @Request.application
    def _wsgi(self, request: Request) -> Response:
        self.requests.append((request.method, request.path, dict(request.args)))
        if self.foreign and (not self.foreign.verbs or _verb(request) in self.foreign.verbs):
            return Response(self.foreign.body, status=self.foreign.status, content_type=self.foreign.content_type)
        adapter = self._routes.bind_to_environ(request.environ)
        try:
            endpoint, params = adapter.match()
        except Exception:  # werkzeug NotFound / MethodNotAllowed: what the real server says for unknown paths
            return Response("404 page not found\n", status=404, mimetype="text/plain")
        if endpoint in ("jobs", "job"):
            res = self.resources.get((params.pop("group"), params.pop("version"), params.pop("plural")))
            if res is None or res.namespaced != ("ns" in params):
                return Response("404 page not found\n", status=404, mimetype="text/plain")
            params = {"res": res, "ns": params.get("ns", "")} | ({"name": params["name"]} if "name" in params else {})
        return answer(getattr(self, f"_{endpoint}"), request, **params)

    def _authorize(self, verb: str, resource: str, ns: str, name: str | None = None) -> None:
        if (verb, resource) not in self.forbidden:
            return
        base, _, _ = resource.partition("/")
        group = next((r.group for r in RESOURCES if r.plural == base), "")
        what = f"{base}.{group}" if group else base
        subject = f'{what} "{name}"' if name else what
        raise ApiError(403, "Forbidden",
                       f'{subject} is forbidden: User "{self.user}" cannot {verb} resource "{resource}" '
                       f'in API group "{group}" in the namespace "{ns}"',
                       {"name": name, "group": group, "kind": base} if name else {"group": group, "kind": base})

    def _jobs(self, request: Request, res: Resource, ns: str) -> Response:
        if request.method == "POST":
            self._authorize("create", res.plural, ns)
            return self._create(request, res, ns)
        watching = request.args.get("watch") in ("true", "1")
        self._authorize("watch" if watching else "list", res.plural, ns)
        selector = _field_selector(request.args.get("fieldSelector", ""))
        match = lambda obj: obj.get("kind") == res.kind and selector(obj)  # noqa: E731
        if watching:
            return Response(self._watch(ns, match, request.args), mimetype="application/json")
        with self._cond:
            items = [copy.deepcopy(j) for (plural, n, _), j in sorted(self.jobs.items())
                     if plural == res.plural and n == ns and match(j)]
            rv = str(self.events[-1][0]) if self.events else "1"
        return _json({"apiVersion": res.api_version, "kind": f"{res.kind}List",
                      "metadata": {"resourceVersion": rv}, "items": items})

    def _admit(self, request: Request, res: Resource, ns: str) -> dict:
        """What the API server does to a create or replace body: prune, default, validate (or raise)."""
        body = request.get_json(force=True)
        meta = body.setdefault("metadata", {})
        if res.namespaced and meta.get("namespace", ns) != ns:
            raise ApiError(400, "BadRequest", "the namespace of the provided object does not match the "
                           "namespace sent on the request")
        if meta.get("generateName") and not meta.get("name"):
            meta["name"] = f"{meta['generateName']}{next(self._uids):05d}"
        body.pop("status", None)  # status is a subresource: ignored on create
        schema = crd_schema(res.version, res.crd)
        dropped: list[str] = []
        body = prune(body, schema, dropped=dropped)
        if dropped and request.args.get("fieldValidation") == "Strict":
            unknown = ", ".join(f'unknown field "{p}"' for p in dropped)
            raise ApiError(400, "BadRequest", f'{res.kind} in version "{res.version}" cannot be handled as a '
                           f"{res.kind}: strict decoding error: {unknown}")
        if self.namespaces is not None and res.namespaced and ns not in self.namespaces:
            # k8s.io/apiserver plugin/namespace/lifecycle (admission, after decoding, before validation):
            # errors.NewNotFound(v1.Resource("namespaces"), namespace)
            raise ApiError(404, "NotFound", f'namespaces "{ns}" not found', {"name": ns, "kind": "namespaces"})
        apply_defaults(body, schema)
        name = meta.get("name") or ""
        causes = metadata_causes(body["metadata"]) + schema_causes(body, schema)
        if causes:
            listed = [f"{c['field']}: {c['message']}" for c in causes]
            summary = listed[0] if len(listed) == 1 else "[" + ", ".join(listed) + "]"
            raise ApiError(422, "Invalid", f'{res.kind}.{res.group} "{name}" is invalid: {summary}',
                           {"name": name, "group": res.group, "kind": res.kind, "causes": causes})
        dry_run = request.args.get("dryRun")
        if dry_run not in (None, "All"):
            raise ApiError(400, "BadRequest", f'Invalid dry run value: "{dry_run}": supported values: "All"')
        body["metadata"] |= {"uid": f"uid-{next(self._uids)}", "generation": 1, "creationTimestamp": _now()}
        if res.namespaced:
            body["metadata"]["namespace"] = ns
        return body

    def _create(self, request: Request, res: Resource, ns: str) -> Response:
        body = self._admit(request, res, ns)
        name = body["metadata"]["name"]
        with self._cond:
            if res is TRAINJOBS:
                self._trainjob_webhook(body, ns)
            if (res.plural, ns, name) in self.jobs:
                raise ApiError(409, "AlreadyExists", f'{res.plural}.{res.group} "{name}" already exists',
                               {"name": name, "group": res.group, "kind": res.plural})
            if request.args.get("dryRun"):
                body["metadata"]["resourceVersion"] = ""
                return _json(body, 201)
            self.jobs[(res.plural, ns, name)] = body
            self.created_at[(res.plural, ns, name)] = time.monotonic()
            self._record("ADDED", body)
            created = copy.deepcopy(body)
        if self.lifecycle and res.job_label:
            self._spawn(self._operate, res, ns, name, self.lifecycle)
        return _json(created, 201)

    def _job(self, request: Request, res: Resource, ns: str, name: str) -> Response:
        verb = {"GET": "get", "PUT": "update", "DELETE": "delete"}[request.method]
        self._authorize(verb, res.plural, ns, name)
        with self._cond:
            job = self.jobs.get((res.plural, ns, name))
            if job is None:
                raise ApiError(404, "NotFound", f'{res.plural}.{res.group} "{name}" not found',
                               {"name": name, "group": res.group, "kind": res.plural})
            if verb == "get":
                return _json(job)
        if verb == "update":
            return self._replace(request, res, ns, job)
        with self._cond:
            options = request.get_json(force=True, silent=True) or {}
            policy = request.args.get("propagationPolicy") or options.get("propagationPolicy") or "Background"
            if policy == "Foreground":
                job["metadata"] |= {"deletionTimestamp": _now(), "finalizers": ["foregroundDeletion"]}
                self._record("MODIFIED", job)
                self._spawn(self._finish_delete, res, ns, name)
                return _json(job)
            self._remove(res, ns, name, orphan=policy == "Orphan")
        return _json({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                      "details": {"name": name, "group": res.group, "kind": res.plural,
                                  "uid": job["metadata"]["uid"]}})

    def _trainjob_webhook(self, job: dict, ns: str) -> None:
        """Kubeflow Trainer v2.3.0's validating webhook on TrainJob create (pkg/webhooks/trainjob_webhook.go
        ValidateCreate -> pkg/runtime/core/trainingruntime.go ValidateObjects), its first check only (not
        its plugins' custom validations): it Gets the referenced runtime and refuses a TrainJob whose runtime
        is not stored. It is registered with sideEffects: None (manifests/base/webhook/manifests.yaml), so
        the API server calls it for dryRun=All creates as well. The denial is controller-runtime v0.24's
        admission.Denied (403 Forbidden), its message prefixed by the API server (k8s.io/apiserver
        webhook/errors ToStatusErr); Go prints the runtimeRef value with %#v (pointers as addresses).

        The webhook's Get goes through the manager's client (cmd/trainer-controller-manager/main.go:142,
        runtimecore.New(ctx, mgr.GetClient(), ...)), which reads from controller-runtime's informer cache
        (v0.24.1 pkg/cluster/cluster.go:206-213): with ``webhook_lag`` a runtime created less than that many
        seconds ago is not there yet (the watch event on its way). Only creates lag: a replaced runtime was
        in the cache already, and deletions are not modelled."""
        ref = job["spec"]["runtimeRef"]
        kind = ref.get("kind", "ClusterTrainingRuntime")
        plural = f"{kind.lower()}s"
        key = (plural, ns if kind == "TrainingRuntime" else "", ref["name"])
        if key in self.jobs and time.monotonic() - self.created_at[key] >= self.webhook_lag:
            return
        value = f'v1alpha1.RuntimeRef{{Name:"{ref["name"]}", APIGroup:(*string)(0xc0004b2a40), Kind:(*string)(0xc0004b2a50)}}'
        raise ApiError(403, "Forbidden", 'admission webhook "validator.trainjob.trainer.kubeflow.org" denied the '
                       f'request: spec.runtimeRef: Invalid value: {value}: {plural}.{TRAINJOBS.group} "{ref["name"]}" '
                       "not found: specified trainingRuntime must be created before the TrainJob is created")

    def _replace(self, request: Request, res: Resource, ns: str, old: dict) -> Response:
        body = self._admit(request, res, ns)
        sent = (request.get_json(force=True).get("metadata") or {}).get("resourceVersion")
        with self._cond:
            if sent != old["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {res.plural}.{res.group} '
                               f'"{old["metadata"]["name"]}": the object has been modified')
            body["metadata"] |= {"uid": old["metadata"]["uid"], "creationTimestamp": old["metadata"]["creationTimestamp"],
                                 "generation": old["metadata"]["generation"] + 1}
            if request.args.get("dryRun"):  # validated and defaulted, not stored
                body["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
                return _json(body)
            self.jobs[(res.plural, ns, old["metadata"]["name"])] = body
            self._record("MODIFIED", body)
            return _json(copy.deepcopy(body))

    def _remove(self, res: Resource, ns: str, name: str, orphan: bool = False) -> None:
        """The object goes; the garbage collector deletes what it owned (pods with it), or with ``orphan``
        (``kubectl delete --cascade=orphan``) only takes the owner out of their ownerReferences."""
        job = self.jobs.pop((res.plural, ns, name))
        uid = job["metadata"]["uid"]
        for key in [k for k, obj in self.jobs.items()
                    if k[1] == ns and any(o.get("uid") == uid for o in obj["metadata"].get("ownerReferences", []))]:
            if orphan:
                owned = self.jobs[key]["metadata"]
                owned["ownerReferences"] = [o for o in owned["ownerReferences"] if o.get("uid") != uid]
                self._record("MODIFIED", self.jobs[key])
            else:
                self._record("DELETED", self.jobs.pop(key))
        for key in [k for k, p in self.pods.items() if not orphan
                    and k[0] == ns and p.manifest["metadata"]["labels"].get(res.job_label) == name]:
            del self.pods[key]
        self._record("DELETED", job)

    def _finish_delete(self, res: Resource, ns: str, name: str) -> None:
        """Foreground deletion: the garbage collector removes dependents first, then the owner."""
        time.sleep(self.foreground_delay)
        with self._cond:
            if (res.plural, ns, name) in self.jobs:
                self._remove(res, ns, name)

    def _watch(self, ns: str, match, args) -> Iterator[bytes]:
        rv = args.get("resourceVersion")
        deadline = time.monotonic() + min(float(args.get("timeoutSeconds", 1800)), self.max_watch_seconds)
        with self._cond:
            if rv and self.expire_watches:
                self.expire_watches -= 1
                yield _event("ERROR", status_body(410, "Expired", f"too old resource version: {rv} "
                                                  f"({self.events[-1][0] if self.events else 1})"))
                return
            if rv in (None, "", "0"):  # no version: the current state first, as ADDED events
                backlog = [("ADDED", j) for (_, n, _), j in sorted(self.jobs.items()) if n == ns and match(j)]
                seen = self.events[-1][0] if self.events else 0
            else:
                backlog, seen = [], int(rv)
        for kind, obj in backlog:
            yield _event(kind, obj)
        while not self._closing.is_set():
            with self._cond:
                fresh = [(v, k, o) for v, k, o in self.events if v > seen]
                if not fresh:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(timeout=min(left, 0.2))
                    continue
            for version, kind, obj in fresh:
                seen = version
                if obj["metadata"].get("namespace") == ns and match(obj):
                    yield _event(kind, obj)
        if args.get("allowWatchBookmarks") in ("true", "1") and not self._closing.is_set():
            yield _event("BOOKMARK", {"metadata": {"resourceVersion": str(seen)}})

    def _pods(self, request: Request, ns: str) -> Response:
        self._authorize("list", "pods", ns)
        wanted = dict(part.split("=", 1) for part in request.args.get("labelSelector", "").split(",") if part)
        with self._cond:
            items = [copy.deepcopy(p.manifest) for (n, _), p in sorted(self.pods.items())
                     if n == ns and wanted.items() <= p.manifest["metadata"]["labels"].items()]
        return _json({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1"}, "items": items})

    def _kube_events(self, request: Request, ns: str) -> Response:
        self._authorize("list", "events", ns)
        match = _field_selector(request.args.get("fieldSelector", ""))
        with self._cond:
            items = [copy.deepcopy(e) for e in self.kube_events if e["metadata"]["namespace"] == ns and match(e)]
        return _json({"apiVersion": "v1", "kind": "EventList", "metadata": {"resourceVersion": "1"}, "items": items})

    def _log(self, request: Request, ns: str, name: str) -> Response:
        self._authorize("get", "pods/log", ns, name)
        with self._cond:
            pod = self.pods.get((ns, name))
            if pod is None:
                raise ApiError(404, "NotFound", f'pods "{name}" not found', {"name": name, "kind": "pods"})
            container = pod.manifest["spec"]["containers"][0]["name"]
            if request.args.get("container", container) != container:
                raise ApiError(400, "BadRequest", f"container {request.args['container']} is not valid for "
                               f"pod {name}")
            if pod.manifest["status"]["phase"] == "Pending":
                raise ApiError(400, "BadRequest", f'container "{container}" in pod "{name}" is waiting to '
                               "start: ContainerCreating")
            follow = request.args.get("follow") in ("true", "1")
            self.log_reads.append((name, follow, pod.manifest["status"]["phase"]))
            self._cond.notify_all()
        return Response(self._log_lines(pod, follow), mimetype="text/plain")

    def _log_lines(self, pod: Pod, follow: bool) -> Iterator[bytes]:
        sent = 0
        while not self._closing.is_set():
            with self._cond:
                lines, done = pod.log[sent:], pod.manifest["status"]["phase"] in ("Succeeded", "Failed")
                if not lines and follow and not done:
                    self._cond.wait(timeout=0.2)
                    continue
            sent += len(lines)
            if lines:
                yield "".join(f"{line}\n" for line in lines).encode()
            if not follow or done and not lines:
                return

    # ------------------------------------------------------------ the emulated MPI Operator

    def _operate(self, res: Resource, ns: str, name: str, steps: list[Step]) -> None:
        launcher: tuple[str, str] | None = None
        for step in steps:
            if self._closing.wait(step.delay):
                return
            with self._cond:
                job = self.jobs.get((res.plural, ns, name))
                if job is None or "deletionTimestamp" in job["metadata"]:
                    return
                if step.until_log_follower and launcher:
                    followed = (launcher[1], True)
                    # bounded only against a hang: a slow client must make the test slower, not race it
                    self._cond.wait_for(lambda f=followed: any(r[:2] == f for r in self.log_reads)
                                        or self._closing.is_set(), timeout=120)
                if step.new_launcher:
                    launcher = self._new_launcher(res, job)
                if step.unschedulable:
                    self._unschedulable_workers(res, job, step)
                if launcher and step.launcher_unschedulable:
                    self._unschedulable(launcher, step.launcher_unschedulable)
                pod = self.pods.get(launcher) if launcher else None
                if pod and step.launcher:
                    pod.manifest["status"]["phase"] = step.launcher
                if pod and step.logs:
                    pod.log.extend(step.logs)
                    self._cond.notify_all()
                if step.condition or step.replicas is not None:
                    _set_status(res, job, step, ns, name)
                    self._record("MODIFIED", job)

    def _pod(self, res: Resource, job: dict, pod_name: str, role: str, container: str, **status: Any) -> dict:
        ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
        labels = dict(res.pod_labels) | {res.job_label: name, res.role_label: role}
        manifest = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod_name, "namespace": ns, "uid": f"uid-{next(self._uids)}", "labels": labels,
                         "creationTimestamp": _now()},
            "spec": {"containers": [{"name": container, "image": "img"}]},
            "status": {"phase": "Pending"} | status,
        }
        self.pods[(ns, pod_name)] = Pod(manifest)
        return manifest

    def _new_launcher(self, res: Resource, job: dict) -> tuple[str, str]:
        """The launcher pod: the MPIJob's Launcher container name; Trainer's containers are all "node"."""
        name = job["metadata"]["name"]
        container = (job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["name"]
                     if res is MPIJOBS else "node")
        pod = self._pod(res, job, f"{name}-launcher-{next(self._uids):05d}", res.roles[0], container)
        return pod["metadata"]["namespace"], pod["metadata"]["name"]


    def _unschedulable_workers(self, res: Resource, job: dict, step: Step) -> None:
        """The worker pods the operator creates, left Pending by the scheduler (what a full cluster does)."""
        ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
        for i in range(step.workers):
            pod_name = f"{name}-{res.roles[1]}-{i}" if res is MPIJOBS else f"{name}-{res.roles[1]}-0-{i}"
            self._pod(res, job, pod_name, res.roles[1], res.roles[1])
            self._unschedulable((ns, pod_name), step.unschedulable or "")

    def _unschedulable(self, pod: tuple[str, str], message: str) -> None:
        """The scheduler gives up on a Pending pod: its PodScheduled condition and FailedScheduling event."""
        ns, pod_name = pod
        self.pods[pod].manifest["status"]["conditions"] = [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]
        self.kube_events.append({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{pod_name}.{next(self._uids)}", "namespace": ns},
            "involvedObject": {"kind": "Pod", "namespace": ns, "name": pod_name},
            "reason": "FailedScheduling", "message": message, "type": "Warning", "count": 1,
            "source": {"component": "default-scheduler"}, "lastTimestamp": _now(),
        })


def _set_status(res: Resource, job: dict, step: Step, ns: str, name: str) -> None:
    """The operator's setCondition: replace by type; a terminal condition turns Running off.
    Replica counts go to an MPIJob's replicaStatuses, or a TrainJob's jobsStatus list."""
    status = job.setdefault("status", {})
    now = _now()
    if res is MPIJOBS:
        status.setdefault("startTime", now)
    if step.replicas is not None and res is MPIJOBS:
        status["replicaStatuses"] = copy.deepcopy(step.replicas)
    elif step.replicas is not None:
        status["jobsStatus"] = [{"name": role} | counts for role, counts in step.replicas.items()]
    if step.condition:
        ctype, cstatus, reason, message = step.condition
        conditions = [c for c in status.get("conditions", []) if c["type"] != ctype]
        if ctype in ("Succeeded", "Complete", "Failed"):
            for cond in conditions:
                if cond["type"] == "Running":
                    cond["status"] = "False"
            if res is MPIJOBS:
                status["completionTime"] = now
        conditions.append({"type": ctype, "status": cstatus, "reason": reason,
                           "message": message.format(ns=ns, name=name),
                           "lastTransitionTime": now, "lastUpdateTime": now})
        status["conditions"] = conditions


def _verb(request: Request) -> str:
    """The API server's verb for a request (k8s.io/apiserver endpoints/request RequestInfo), roughly: a GET
    of a collection is a list (a watch with ``watch=true``), of one object a get."""
    if request.method == "GET":
        if request.args.get("watch") in ("true", "1"):
            return "watch"
        collection = request.path.rstrip("/").rsplit("/", 1)[-1] in {r.plural for r in RESOURCES} | {"pods", "events"}
        return "list" if collection else "get"
    return {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(request.method, "")


FIELD_SELECTORS = {"metadata.name", "metadata.namespace", "involvedObject.name", "involvedObject.kind"}


def _field_selector(selector: str):
    wanted = dict(part.split("=", 1) for part in selector.split(",") if part)
    unknown = set(wanted) - FIELD_SELECTORS
    if unknown:
        raise ApiError(400, "BadRequest", f'"{sorted(unknown)[0]}" is not a known field selector: only '
                       + ", ".join(f'"{f}"' for f in sorted(FIELD_SELECTORS)))

    def value(obj: dict, path: str) -> Any:
        top, key = path.split(".")
        return (obj.get(top) or {}).get(key)

    return lambda obj: all(value(obj, k) == v for k, v in wanted.items())


def _event(kind: str, obj: dict) -> bytes:
    return (json.dumps({"type": kind, "object": obj}) + "\n").encode()


def answer(handler: Callable[..., Response], *args: Any, **kwargs: Any) -> Response:
    """``handler``'s response, an ``ApiError`` as the API server's Status. Test material absent here (``shared``'s
    skip, raised on this server thread, out of the test's reach) answers 500 and skips the test when it ends."""
    try:
        return handler(*args, **kwargs)
    except ApiError as err:
        return _json(err.body, err.body["code"])
    except pytest.skip.Exception as skip:
        skip_after_call(skip.msg)
        return _json(status_body(500, "InternalError", skip.msg), 500)


def _json(body: dict, code: int = 200) -> Response:
    return Response(json.dumps(body), status=code, mimetype="application/json")
