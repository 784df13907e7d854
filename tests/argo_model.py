"""A small model of what Argo Workflows does with the Workflow hvdk8s renders, from its source.

Argo Workflows v4.1.2 (github.com/argoproj/argo-workflows, tag v4.1.2, commit 16a52d67), the
release whose CRD the tests validate against. Only what hvdk8s depends on:

* the run's name: ``generateName`` plus 5 random characters (Kubernetes apiserver
  ``pkg/storage/names/generate.go``, SimpleNameGenerator; alphabet from apimachinery ``util/rand``);
* ``{{workflow.*}}`` filled in over the template's JSON text (``workflow/common/util.go``
  SubstituteParams -> ``util/template`` Replace);
* resource templates: ``setOwnerReference`` adds a controller reference to the Workflow
  (``workflow/controller/operator.go`` executeResource, metav1.NewControllerRef); kubectl runs
  the action (``workflow/executor/resource.go`` getKubectlArguments: ``delete`` gets
  ``--ignore-not-found``, a failed create is not retried unless transient: ExecResource); then
  WaitResource polls the object every 5 s (RESOURCE_STATE_CHECK_INTERVAL's default,
  ``cmd/argoexec/executor/init.go``) until a condition matches, with no bound of its own
  (wait.PollUntilContextCancel); conditions are label selectors (labels.Parse) over gjson paths
  (gjsonLabels); matchConditions: ANY failure requirement fails the step, ALL success
  requirements succeed it (none given: success at the first read); a deleted object fails it;
  ``delete`` takes no conditions (``cmd/argoexec/commands/resource.go``);
* every step runs in a pod (resource steps too): labels from ``spec.podMetadata`` then the
  template's ``metadata`` (operator.go addMetadata); ``activeDeadlineSeconds`` from the template,
  clamped to what is left of the workflow's own deadline except in exit-handler pods
  (``workflow/controller/workflowpod.go`` build). The kubelet ends a pod past it (phase Failed,
  reason DeadlineExceeded, ``pkg/kubelet/active_deadline.go``) and Argo fails the node with the
  pod's message (operator.go inferFailedReason);
* ``steps`` run their groups in order and stop at a failed one (``workflow/controller/steps.go``);
  the exit handler runs after the entrypoint whatever its outcome (operator.go, onExit).

The garbage collector deleting objects whose owner is gone is Kubernetes', modelled in ``Cluster``.
Containers, ``depends`` expressions, retries and artifacts are not modelled (they raise).
"""
from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

ARGO_VERSION = "v4.1.2"
POLL_SECONDS = 5  # RESOURCE_STATE_CHECK_INTERVAL default
NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # apimachinery util/rand: no vowels, no 0/1/3
MAX_GENERATED_BASE = 63 - 5  # maxGeneratedNameLength
DEADLINE_MESSAGE = "Pod was active on the node longer than the specified deadline"  # kubelet
DELETED_MESSAGE = "The resource has been deleted while its status was still being checked. Will not be retried"
HORIZON_SECONDS = 7 * 24 * 3600  # the model gives up here: a wait this long is a wait forever
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?\Z")
QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]\Z")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")


def generate_name(base: str, random: str) -> str:
    """The name the API server gives an object created with ``generateName: base``."""
    assert len(random) == 5 and set(random) <= set(NAME_ALPHABET)
    return base[:MAX_GENERATED_BASE] + random


# ------------------------------------------------------------------ label selectors over gjson


def gjson_lookup(obj: Any, path: str) -> tuple[bool, str]:
    """(exists, String()) of a dotted gjson path (keys, and indexes into arrays)."""
    for part in path.split("."):
        if isinstance(obj, dict) and part in obj:
            obj = obj[part]
        elif isinstance(obj, list) and part.isdigit() and int(part) < len(obj):
            obj = obj[int(part)]
        else:
            return False, ""
    if isinstance(obj, bool):
        return True, "true" if obj else "false"
    if obj is None:
        return True, ""
    if isinstance(obj, (dict, list)):
        return True, json.dumps(obj, separators=(",", ":"))
    return True, str(obj)


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", ">", "<", "exists", "!"
    value: str = ""

    def matches(self, obj: Any) -> bool:
        """apimachinery ``labels/selector.go`` Requirement.Matches, over gjsonLabels."""
        exists, got = gjson_lookup(obj, self.key)
        if self.op == "exists":
            return exists
        if self.op == "!":
            return not exists
        if self.op == "=":
            return exists and got == self.value
        if self.op == "!=":
            return not exists or got != self.value
        if not exists or not re.fullmatch(r"-?\d+", got):
            return False  # strconv.ParseInt fails: no match
        return int(got) > int(self.value) if self.op == ">" else int(got) < int(self.value)


def parse_selector(text: str) -> list[Requirement]:
    """``labels.Parse``: comma-separated requirements; it refuses what it cannot parse, as Argo then
    fails the step ("success condition ... failed to parse"). ``in``/``notin`` are not modelled."""
    requirements = []
    for clause in text.split(","):
        match = re.fullmatch(r"\s*(!?)\s*([^\s!=<>]+)\s*(?:(==|=|!=|>|<)\s*(\S*))?\s*", clause)
        if not match or re.search(r"\s(in|notin)\s", clause):
            raise ValueError(f"labels.Parse: cannot parse {clause!r}")
        bang, key, op, value = match.groups()
        _check_key(key)
        if bang:
            if op:
                raise ValueError(f"labels.Parse: {clause!r}")
            requirements.append(Requirement(key, "!"))
        elif not op:
            requirements.append(Requirement(key, "exists"))
        elif op in (">", "<"):
            if not re.fullmatch(r"-?\d+", value or ""):
                raise ValueError(f"labels.Parse: for '{op}' the value must be an integer, got {value!r}")
            requirements.append(Requirement(key, op, value))
        else:
            if not LABEL_VALUE.match(value) or len(value) > 63:
                raise ValueError(f"labels.Parse: invalid label value {value!r}")
            requirements.append(Requirement(key, "!=" if op == "!=" else "=", value))
    return requirements


def _check_key(key: str) -> None:
    """validation.IsQualifiedName: [prefix/]name, the name at most 63 characters."""
    prefix, _, name = key.rpartition("/")
    if (prefix and not DNS1123_SUBDOMAIN.match(prefix)) or not QUALIFIED_NAME.match(name) or len(name) > 63:
        raise ValueError(f"labels.Parse: {key!r} is not a qualified name")


def match_conditions(obj: Any, success: str | None, failure: str | None) -> str | None:
    """One read in ``matchConditions``: "Failed", "Succeeded", or None (poll again)."""
    if failure and any(r.matches(obj) for r in parse_selector(failure)):
        return "Failed"
    wanted = parse_selector(success) if success else []
    return "Succeeded" if all(r.matches(obj) for r in wanted) else None


# ------------------------------------------------------------------ the cluster the steps act on


class AlreadyExists(Exception):
    pass


StatusAt = Callable[[dict[str, Any], float], dict[str, Any]]


@dataclass
class Cluster:
    """Objects by (kind, name); ``status`` plays the controllers: the status an object has
    ``age`` seconds after it was created; ``gone_after``: when someone else deletes one. The
    garbage collector deletes the dependents of a deleted object (ownerReferences by uid)."""

    status: StatusAt = lambda obj, age: {}
    objects: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    created_at: dict[tuple[str, str], float] = field(default_factory=dict)
    gone_after: dict[tuple[str, str], float] = field(default_factory=dict)
    uids: int = 0

    def create(self, obj: dict[str, Any], now: float) -> dict[str, Any]:
        key = (obj["kind"], obj["metadata"]["name"])
        if key in self.objects:
            raise AlreadyExists(f'{obj["kind"].lower()}s "{key[1]}" already exists')
        self.uids += 1
        stored = copy.deepcopy(obj)
        stored["metadata"]["uid"] = f"uid-{self.uids}"
        self.objects[key], self.created_at[key] = stored, now
        return stored

    def read(self, kind: str, name: str, now: float) -> dict[str, Any] | None:
        key = (kind, name)
        if key not in self.objects or now >= self.gone_after.get(key, now + 1):
            return None
        return {**self.objects[key], "status": self.status(self.objects[key], now - self.created_at[key])}

    def delete(self, kind: str, name: str) -> None:
        gone = self.objects.pop((kind, name), None)
        if gone is None:
            return
        uid = gone["metadata"]["uid"]
        for key, obj in list(self.objects.items()):
            if any(ref["uid"] == uid for ref in obj["metadata"].get("ownerReferences", [])) and key in self.objects:
                self.delete(*key)

    def names(self, kind: str) -> set[str]:
        return {name for k, name in self.objects if k == kind}


# ------------------------------------------------------------------ a run of the Workflow


@dataclass(frozen=True)
class Node:
    phase: str  # Succeeded, Failed, or Running (still waiting at the model's horizon)
    message: str
    finished_at: float


@dataclass
class Pod:
    name: str
    labels: dict[str, str]
    annotations: dict[str, str]
    active_deadline_seconds: int | None


class Run:
    """One run of ``workflow`` in ``cluster``: the Workflow object is created there first (so the
    garbage collector can follow references to it), named from ``generateName`` + ``random``."""

    def __init__(self, workflow: dict[str, Any], cluster: Cluster, random: str = "bcdfg"):
        meta = workflow["metadata"]
        name = meta.get("name") or generate_name(meta["generateName"], random)
        self.workflow = cluster.create({**workflow, "metadata": {**meta, "name": name}}, 0.0)
        self.name, self.uid, self.cluster = name, self.workflow["metadata"]["uid"], cluster
        self.globals = {"workflow.name": name, "workflow.namespace": meta.get("namespace", "default"),
                        "workflow.uid": self.uid}
        self.pods: list[Pod] = []

    def template(self, name: str) -> dict[str, Any]:
        """The named template with the run's globals filled in over its JSON text."""
        (tmpl,) = [t for t in self.workflow["spec"]["templates"] if t["name"] == name]
        text = json.dumps(tmpl)
        for key, value in self.globals.items():
            text = re.sub(r"\{\{\s*" + re.escape(key) + r"\s*\}\}", json.dumps(value)[1:-1], text)
        if leftover := re.search(r"\{\{\s*workflow\.[^}]*\}\}", text):
            raise ValueError(f"template {name}: unresolved {leftover.group(0)}")
        return json.loads(text)

    def run(self, name: str, start: float = 0.0, on_exit: bool = False) -> Node:
        tmpl = self.template(name)
        if "steps" in tmpl:
            node = Node("Succeeded", "", start)
            for group in tmpl["steps"]:
                nodes = [self.run(step["template"], node.finished_at, on_exit) for step in group]
                node = max(nodes, key=lambda n: n.finished_at)
                if failed := [n for n in nodes if n.phase != "Succeeded"]:
                    return failed[0]
            return node
        if "dag" in tmpl:
            if any(task.get("depends") for task in tmpl["dag"]["tasks"]):
                raise NotImplementedError("depends expressions are not modelled")
            nodes = [self.run(task["template"], start, on_exit) for task in tmpl["dag"]["tasks"]]
            failed = [n for n in nodes if n.phase != "Succeeded"]
            return failed[0] if failed else Node("Succeeded", "", max(n.finished_at for n in nodes))
        if "resource" in tmpl:
            return self._resource(tmpl, start, self.pod(tmpl, on_exit))
        raise NotImplementedError(f"template {name}: only steps, dag and resource templates are modelled")

    def exit_handler(self, start: float) -> Node:
        return self.run(self.workflow["spec"]["onExit"], start, on_exit=True)

    def pod(self, tmpl: dict[str, Any], on_exit: bool = False) -> Pod:
        """The pod a leaf template runs in: its labels, annotations and deadline."""
        spec = self.workflow["spec"]
        labels, annotations = {}, {}
        for meta in (spec.get("podMetadata") or {}, tmpl.get("metadata") or {}):
            labels.update(meta.get("labels") or {})
            annotations.update(meta.get("annotations") or {})
        deadline = tmpl.get("activeDeadlineSeconds")
        if spec.get("activeDeadlineSeconds") is not None and not on_exit:
            deadline = min(d for d in (deadline, spec["activeDeadlineSeconds"]) if d is not None)
        pod = Pod(f"{self.name}-{tmpl['name']}", labels, annotations, deadline)
        self.pods.append(pod)
        return pod

    def _resource(self, tmpl: dict[str, Any], start: float, pod: Pod) -> Node:
        res = tmpl["resource"]
        manifest = yaml.safe_load(res["manifest"])
        if res.get("setOwnerReference"):
            refs = manifest["metadata"].setdefault("ownerReferences", [])
            refs.append({"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "name": self.name,
                         "uid": self.uid, "controller": True, "blockOwnerDeletion": True})
        kind, name = manifest["kind"], manifest["metadata"]["name"]
        success, failure = res.get("successCondition"), res.get("failureCondition")
        if res["action"] == "delete":
            assert not (success or failure), "successCondition, failureCondition are not supported for delete"
            self.cluster.delete(kind, name)  # --ignore-not-found
            return Node("Succeeded", "", start)
        if res["action"] == "create":
            try:
                self.cluster.create(manifest, start)
            except AlreadyExists as err:
                return Node("Failed", f"no more retries Error from server (AlreadyExists): {err}", start)
        elif res["action"] == "get":
            if self.cluster.read(kind, name, start) is None:
                return Node("Failed", f'Error from server (NotFound): {kind.lower()}s "{name}" not found', start)
        else:
            raise NotImplementedError(f"action {res['action']} is not modelled")
        if not (success or failure):
            return Node("Succeeded", "", start)
        now = start
        while now - start <= HORIZON_SECONDS:
            if pod.active_deadline_seconds is not None and now - start >= pod.active_deadline_seconds:
                return Node("Failed", DEADLINE_MESSAGE, start + pod.active_deadline_seconds)
            obj = self.cluster.read(kind, name, now)
            if obj is None:
                return Node("Failed", DELETED_MESSAGE, now)
            if verdict := match_conditions(obj, success, failure):
                message = f"failure condition '{failure}' evaluated true" if verdict == "Failed" else ""
                return Node(verdict, message, now)
            now += POLL_SECONDS
        return Node("Running", "still waiting", now)

    def delete(self) -> None:
        """``kubectl delete workflow``: the garbage collector takes what the Workflow owns."""
        self.cluster.delete("Workflow", self.name)

    def leaf_templates(self) -> list[dict[str, Any]]:
        """Every template that runs in a pod."""
        return [t for t in self.workflow["spec"]["templates"] if not ({"steps", "dag"} & t.keys())]
