"""The pure core of the cluster client: status lines and API-error messages, no HTTP."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from hvdk8s.cluster import jobstatus, kube, kubeerrors, watch
from hvdk8s.cluster.client import resolve_namespace
from hvdk8s.cluster.kubeerrors import MPIJOBS, Action
from hvdk8s.common.errors import UserError

pytestmark = pytest.mark.unit


def cond(type_: str, status: str = "True", reason: str = "", message: str = "") -> dict:
    return {"type": type_, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": "2026-01-01T00:00:00Z"}


CREATED = cond("Created", reason="MPIJobCreated", message="MPIJob ns/j is created.")
RUNNING = cond("Running", reason="MPIJobRunning", message="MPIJob ns/j is running.")


def test_phase_is_the_most_telling_true_condition():
    assert jobstatus.phase(None) == "Pending"
    assert jobstatus.phase({"conditions": [CREATED]}) == "Created"
    assert jobstatus.phase({"conditions": [CREATED, RUNNING]}) == "Running"
    assert jobstatus.phase({"conditions": [CREATED, RUNNING | {"status": "False"},
                                           cond("Succeeded", reason="MPIJobSucceeded")]}) == "Succeeded"
    assert jobstatus.phase({"conditions": [CREATED, cond("Suspended", reason="MPIJobSuspended")]}) == "Suspended"
    assert jobstatus.phase({"conditions": [CREATED, RUNNING, cond("Restarting")]}) == "Restarting"


def test_outcome_only_for_true_terminal_conditions():
    assert jobstatus.outcome({"conditions": [CREATED, RUNNING]}) is None
    assert jobstatus.outcome({"conditions": [cond("Failed", "False")]}) is None
    failed = jobstatus.outcome({"conditions": [CREATED, cond("Failed", reason="BackoffLimitExceeded", message="m")]})
    assert failed == jobstatus.Condition("Failed", "True", "BackoffLimitExceeded", "m")


def test_replica_line_orders_roles_and_leaves_out_zeros():
    assert jobstatus.replica_line({}) is None
    status = {"replicaStatuses": {"Worker": {"active": 2, "failed": 1}, "Launcher": {"succeeded": 1},
                                  "Horker": {}}}
    assert jobstatus.replica_line(status) == "replicas: Launcher 1 succeeded; Worker 2 active, 1 failed; Horker none"


def test_a_trainjob_runs_once_its_launcher_pod_does_and_counts_child_jobs():
    """Trainer's jobsStatus counts child Jobs, active while a pod is running or pending
    (v2.3.0 pkg/apis/trainer/v1alpha1/trainjob_types.go, JobStatus.active)."""
    status = {"jobsStatus": [{"name": "node", "active": 1, "ready": 1}, {"name": "launcher", "active": 1}]}
    assert [jobstatus.phase(status, pod) for pod in (None, "Pending", "Running")] == ["Created", "Created", "Running"]
    assert jobstatus.phase({"conditions": [cond("Complete")]} | status, "Succeeded") == "Complete"
    assert jobstatus.replica_line(status) == "child Jobs: launcher 1 active; node 1 active"


def test_transitions_report_what_changed_and_skip_running_turning_off():
    start = {"conditions": [CREATED], "replicaStatuses": {"Launcher": {}, "Worker": {}}}
    running = {"conditions": [CREATED, RUNNING], "replicaStatuses": {"Launcher": {"active": 1},
                                                                     "Worker": {"active": 2}}}
    done = {"conditions": [CREATED, RUNNING | {"status": "False"},
                           cond("Succeeded", reason="MPIJobSucceeded", message="MPIJob ns/j successfully completed.")],
            "replicaStatuses": {"Launcher": {"succeeded": 1}, "Worker": {}}}
    assert jobstatus.transitions(None, start) == ["Created: MPIJob ns/j is created. [MPIJobCreated]",
                                                  "replicas: Launcher none; Worker none"]
    assert jobstatus.transitions(start, running) == ["Running: MPIJob ns/j is running. [MPIJobRunning]",
                                                     "replicas: Launcher 1 active; Worker 2 active"]
    assert jobstatus.transitions(running, running) == []
    assert jobstatus.transitions(running, done) == [
        "Succeeded: MPIJob ns/j successfully completed. [MPIJobSucceeded]",
        "replicas: Launcher 1 succeeded; Worker none"]


def test_transitions_report_a_resume():
    suspended = {"conditions": [CREATED, cond("Suspended", reason="MPIJobSuspended", message="MPIJob suspended")]}
    resumed = {"conditions": [CREATED, cond("Suspended", "False", "MPIJobResumed", "MPIJob resumed")]}
    assert jobstatus.transitions(None, suspended)[-1] == "Suspended: MPIJob suspended [MPIJobSuspended]"
    assert jobstatus.transitions(suspended, resumed) == ["Suspended=False: MPIJob resumed [MPIJobResumed]"]


def test_summary_and_failure_message():
    job = {"metadata": {"name": "j", "namespace": "ns"},
           "status": {"conditions": [CREATED, cond("Failed", reason="MPIJobFailed", message="MPIJob ns/j has failed")],
                      "replicaStatuses": {"Launcher": {"failed": 1}}, "startTime": "t0", "completionTime": "t1"}}
    assert jobstatus.summary(job) == [
        "MPIJob ns/j: Failed",
        "  Created: MPIJob ns/j is created. [MPIJobCreated]",
        "  Failed: MPIJob ns/j has failed [MPIJobFailed]",
        "  replicas: Launcher 1 failed",
        "  started t0",
        "  completed t1",
    ]
    assert jobstatus.failure_message(job) == "MPIJob ns/j failed (MPIJobFailed): MPIJob ns/j has failed"
    assert jobstatus.summary({"metadata": {"name": "j", "namespace": "ns"}}) == [
        "MPIJob ns/j: Pending", "  no conditions yet (has the MPI Operator seen it?)"]


def status(code: int, reason: str, message: str, **details) -> str:
    return json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
                       "reason": reason, "message": message, "details": details})


CREATE = Action("create", MPIJOBS, "ns", "j")


GET = Action("get", MPIJOBS, "ns", "j")
FOUND_NOT = status(404, "NotFound", 'mpijobs.kubeflow.org "j" not found', name="j", group="kubeflow.org",
                   kind="mpijobs")


def test_404_plain_text_on_mpijobs_means_the_crd_is_missing_but_a_status_means_no_such_job():
    message = kubeerrors.api_error_message(404, "404 page not found\n", CREATE)
    assert kubeerrors.INSTALL_OPERATOR in message
    assert "raw.githubusercontent.com/kubeflow/mpi-operator/v0.8.2/deploy/v2beta1/mpi-operator.yaml" in message
    assert kubeerrors.api_error_message(404, FOUND_NOT, GET) == (
        'mpijobs.kubeflow.org "j" not found in namespace "ns" (list them: kubectl get mpijobs -n ns)')
    assert kubeerrors.names_missing_object(404, FOUND_NOT)
    assert not kubeerrors.names_missing_object(404, "404 page not found\n")


@pytest.mark.parametrize("details", [{}, {"group": "kubeflow.org", "kind": "mpijobs"}], ids=["empty", "resource"])
def test_a_404_status_that_names_no_object_means_the_resource_type_is_not_served(details):
    """apimachinery's 404 for a path nothing serves (NewGenericServerResponse, as go-restful's routes answer it)
    names no object: not the job, the kind is missing."""
    body = status(404, "NotFound", "the server could not find the requested resource", **details)
    assert kubeerrors.api_error_message(404, body, GET) == kubeerrors.crd_missing_message(MPIJOBS)
    assert not kubeerrors.names_missing_object(404, body)


@pytest.mark.parametrize("content_type, body, said", [
    ("text/plain; charset=utf-8", b"404 page not found\n", None),
    ("application/json", FOUND_NOT.encode(), None),
    ("text/html", b"<html><body><h1>404 Not Found</h1></body></html>", 'it answered get mpijobs.kubeflow.org "j" in '
     'namespace "ns" with 404 and text/html content that is not a Kubernetes Status: '
     '"<html><body><h1>404 Not Found</h1></body></html>"'),
    ("application/json", b'{"error": "no route"}', 'it answered get mpijobs.kubeflow.org "j" in namespace "ns" with '
     '404 and application/json content that is not a Kubernetes Status: "{\\"error\\": \\"no route\\"}"'),
    (None, b"", 'it answered get mpijobs.kubeflow.org "j" in namespace "ns" with 404 and content that is not a '
     "Kubernetes Status: (empty)"),
], ids=["not-served", "status", "page", "json", "empty"])
def test_a_404_is_the_api_servers_only_as_a_status_or_its_plain_page(content_type, body, said):
    assert kubeerrors.foreign_not_found(content_type, body, GET) == said


def test_409_403_401_and_others():
    taken = status(409, "AlreadyExists", 'mpijobs.kubeflow.org "j" already exists')
    assert "hvdk8s delete j -n ns" in kubeerrors.api_error_message(409, taken, CREATE)
    denied = status(403, "Forbidden", 'mpijobs.kubeflow.org is forbidden: User "bob" cannot create resource')
    assert kubeerrors.api_error_message(403, denied, CREATE) == (
        'forbidden by RBAC: you may not create mpijobs.kubeflow.org "j" in namespace "ns". The API server said: '
        'mpijobs.kubeflow.org is forbidden: User "bob" cannot create resource. Check with: kubectl auth can-i '
        "create mpijobs.kubeflow.org -n ns; ask a cluster admin for a Role and RoleBinding that grant it")
    assert "401 Unauthorized" in kubeerrors.api_error_message(401, "", CREATE)
    assert kubeerrors.api_error_message(500, status(500, "InternalError", "etcd down"), CREATE) == (
        'could not create mpijobs.kubeflow.org "j" in namespace "ns": the API server answered 500 InternalError: '
        "etcd down")


def test_422_lists_every_cause_with_its_field_path():
    body = status(422, "Invalid", "x", causes=[
        {"reason": "FieldValueRequired", "message": "Required value", "field": "spec.mpiReplicaSpecs"},
        {"reason": "FieldValueInvalid", "message": "Invalid value: 0", "field": "spec.slotsPerWorker"}])
    assert kubeerrors.api_error_message(422, body, CREATE) == (
        'the API server rejected MPIJob "j" as invalid:\n'
        "  spec.mpiReplicaSpecs: Required value\n  spec.slotsPerWorker: Invalid value: 0")


def test_unreachable_message_keeps_the_useful_part_of_urllib3s_error():
    err = ("HTTPConnectionPool(host='10.0.0.1', port=6443): Max retries exceeded with url: /apis (Caused by "
           "NewConnectionError(\"HTTPConnection(host='10.0.0.1', port=6443): Failed to establish a new connection: "
           "[Errno 111] Connection refused\"))")
    assert kubeerrors.unreachable_message("https://10.0.0.1:6443", err).startswith(
        "cannot reach the Kubernetes API server at https://10.0.0.1:6443: Failed to establish a new connection: "
        "[Errno 111] Connection refused")


def test_404_for_the_namespace_says_it_does_not_exist_not_that_the_job_is_missing():
    """NamespaceLifecycle admission refuses a create in a missing namespace with the namespace's NotFound."""
    body = status(404, "NotFound", 'namespaces "nope" not found', name="nope", kind="namespaces")
    assert kubeerrors.api_error_message(404, body, Action("create", MPIJOBS, "nope", "j")) == (
        'could not create mpijobs.kubeflow.org "j" in namespace "nope": namespace "nope" does not exist. Create it '
        "(kubectl create namespace nope) or choose an existing one (kubectl get namespaces) with -n/--namespace")
    other = status(404, "NotFound", 'secrets "ssh" not found', name="ssh", kind="secrets")
    assert kubeerrors.api_error_message(404, other, CREATE) == (
        'could not create mpijobs.kubeflow.org "j" in namespace "ns": the API server answered 404 NotFound: '
        'secrets "ssh" not found')
    pod = status(404, "NotFound", 'pods "p" not found', name="p", kind="pods")  # a subresource's own object
    assert kubeerrors.api_error_message(404, pod, Action("get", "pods/log", "ns", "p")) == (
        'pods/log "p" not found in namespace "ns"')


@pytest.mark.parametrize("content_type, body, said", [
    ("application/json", b'{"kind": "MPIJob", "apiVersion": "kubeflow.org/v2beta1", "metadata": {}}', None),
    ("application/json; charset=utf-8", b'{"kind": "Status", "apiVersion": "v1", "status": "Success"}', None),
    (None, b'{"kind": "PodList", "apiVersion": "v1", "items": []}', None),
    ("text/html", b"<html>\n<body>sign in</body>\n</html>",
     'it answered 200 with text/html content: "<html> <body>sign in</body> </html>"'),
    ("application/json", b"[1, 2]", 'it answered 200 with JSON that is not a Kubernetes object (no kind and '
                                    'apiVersion): "[1, 2]"'),
    ("application/json", b'{"kind": "MPIJob"}', 'it answered 200 with JSON that is not a Kubernetes object (no kind '
                                                'and apiVersion): "{\\"kind\\": \\"MPIJob\\"}"'),
    ("application/json", b"", "it answered 200 with content that is not JSON: (empty)"),
    ("application/json", b"\xff\xfe{", 'it answered 200 with content that is not JSON: "\ufffd\ufffd{"'),
    ("text/plain", b"x" * 100, f'it answered 200 with text/plain content: "{"x" * 80}..."'),
], ids=["object", "status", "no-type", "page", "list", "no-apiversion", "empty", "binary", "long"])
def test_a_successful_answer_must_be_a_kubernetes_object(content_type, body, said):
    assert kubeerrors.foreign_answer(200, content_type, body) == said


@pytest.mark.parametrize("name, kind, problem", [
    ("digits", kube.MPIJOB, None),
    ("a" * 54, kube.MPIJOB, None),
    ("a" * 55, kube.MPIJOB, f"its pod hostname '{'a' * 55}-worker-0' is 64 characters; a DNS-1035 label has at most 63 "
                            "(shorten the name)"),
    ("", kube.MPIJOB, "it is empty"),
    ("pi.v2", kube.MPIJOB, "it is not a DNS-1035 label (lowercase letters, digits and '-', starting with a letter)"),
    ("a" * 63, kube.TRAINJOB, None),
    ("1a", kube.TRAINJOB, "it is not a DNS-1035 label (lowercase letters, digits and '-', starting with a letter)"),
    ("bench.1", kube.TFJOB, None),  # any other kind: the API server's rule for a custom resource's name
    ("Bench", kube.TFJOB, "it is not a DNS-1123 subdomain (lowercase letters, digits, '-' and '.')"),
])
def test_job_names_follow_their_controllers_rule(name, kind, problem):
    assert kube.job_name_problem(name, kind) == problem


def test_a_namespace_used_must_be_one():
    assert resolve_namespace(None, None, "a" * 63) == "a" * 63
    for flag, manifest, context, said in [
        ("", None, "ctx", '-n/--namespace: "" is not a valid namespace: it is empty'),
        ("a.b", None, "ctx", '-n/--namespace: "a.b" is not a valid namespace: it is not a DNS-1123 label'),
        (None, "../x", "ctx", 'metadata.namespace: "../x" is not a valid namespace: it is not a DNS-1123 label'),
        (None, 5, "ctx", "metadata.namespace: 5 is not a valid namespace: it is not a string (int)"),
        (None, None, "A", "the context's namespace (kubeconfig, or the pod's service account): \"A\" is not a valid"),
    ]:
        with pytest.raises(UserError) as refused:
            resolve_namespace(flag, manifest, context)
        assert str(refused.value).startswith(said)
    assert resolve_namespace("ok", None, "Not/Used") == "ok"  # the context's is only checked when it is used


def test_namespace_precedence():
    assert resolve_namespace(None, None, "ctx") == "ctx"
    assert resolve_namespace(None, "m", "ctx") == "m"
    assert resolve_namespace("f", None, "ctx") == "f"
    assert resolve_namespace("m", "m", "ctx") == "m"
    with pytest.raises(UserError, match='metadata.namespace "m" but --namespace is "f"'):
        resolve_namespace("f", "m", "ctx")


def test_a_watch_with_an_event_starts_the_count_of_short_watches_over(monkeypatch):
    """Watches ended at once with no event are tried again SHORT_WATCH_WAITS times in a row, not in all."""
    monkeypatch.setattr(watch, "SHORT_WATCH_WAITS", (0.0, 0.0))
    job = {"metadata": {"name": "j", "resourceVersion": "1"}}
    monkeypatch.setattr(kube, "list_job", lambda *_: {"metadata": {"resourceVersion": "1"}, "items": [job]})
    answers = iter([[], [], [("BOOKMARK", job)], [], [], [("DELETED", job)], [], [], []])
    monkeypatch.setattr(kube, "watch_job", lambda *_: iter(next(answers)))
    cluster = SimpleNamespace(host="https://k8s:6443")
    assert list(watch.job_updates(cluster, "ns", "j")) == [job]
    with pytest.raises(UserError) as cut:
        list(watch.job_updates(cluster, "ns", "j"))
    assert str(cut.value).startswith('could not watch mpijobs.kubeflow.org "j" in namespace "ns": the server at '
                                     "https://k8s:6443 ended the watch 3 times in a row as soon as it began")
    assert next(answers, None) is None


def test_a_410_is_re_listed_at_once_but_one_every_time_is_said(monkeypatch):
    """client-go re-lists after 410 Gone without waiting; a server that answers 410 to every watch is counted
    like any watch that ends at once, so the follower neither spins nor waits before a list."""
    slept: list[float] = []
    monkeypatch.setattr(watch.time, "sleep", slept.append)
    job = {"metadata": {"name": "j", "resourceVersion": "1"}}
    lists = []
    monkeypatch.setattr(kube, "list_job", lambda *_: lists.append(1) or {"metadata": {"resourceVersion": "1"},
                                                                          "items": [job]})

    def expired(*_):
        raise kube.WatchExpired("too old resource version")
        yield  # a generator, as watch_job is

    monkeypatch.setattr(kube, "watch_job", expired)
    with pytest.raises(UserError, match="ended the watch 6 times in a row as soon as it began"):
        list(watch.job_updates(SimpleNamespace(host="https://k8s:6443"), "ns", "j"))
    assert (slept, len(lists)) == ([], 6)


class _Chunked:
    """An unread HTTP response as ``stream_lines`` sees it: chunks as the network cuts them."""

    def __init__(self, chunks: list[bytes]):
        self.chunks, self.closed, self.released = chunks, False, False

    def stream(self, amt=None):
        yield from self.chunks

    def close(self) -> None:
        self.closed = True

    def release_conn(self) -> None:
        self.released = True


def test_stream_lines_joins_lines_across_chunks_and_keeps_a_last_one_without_a_newline():
    snowman = "\u2603".encode()  # three bytes, cut between chunks
    answer = _Chunked([b'{"a":', b'1}\n{"b"', b':2}\n\n{"c": "' + snowman[:1], snowman[1:] + b'"}'])
    assert list(kube.stream_lines(answer)) == ['{"a":1}', '{"b":2}', "", '{"c": "\u2603"}']
    assert answer.closed and answer.released
    left = _Chunked([b"one\ntwo\n"])
    next(iter(lines := kube.stream_lines(left)))
    lines.close()  # a reader that stops early still closes the response
    assert left.closed and left.released
