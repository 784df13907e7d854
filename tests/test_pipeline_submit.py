"""``hvdk8s pipeline submit [--wait]``: the real ``kubernetes`` client, through a generated kubeconfig,
against a local double of the API server's argoproj.io/v1alpha1 Workflows endpoint. Create bodies are
validated with the REAL Argo CRD schema (strict, as ``fieldValidation=Strict`` makes the server); a
scripted controller walks the created Workflow's own DAG tasks through their phases. Not a real
cluster or Argo controller."""
from __future__ import annotations

import copy
import itertools
import threading
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
import yaml
from werkzeug.routing import Map, Rule
from werkzeug.serving import make_server
from werkzeug.wrappers import Request, Response

from hvdk8s.cli import main
from hvdk8s.cluster.client import connect
from hvdk8s.common.errors import UserError
from hvdk8s.pipeline import argo, load_pipeline, submit

from kube_double import ApiError, _json, _QuietHandler, answer, metadata_causes, schema_causes
from test_pipeline import EXAMPLE, argo_validator

pytestmark = pytest.mark.unit

NS = "team"
PREFIX = "/apis/argoproj.io/v1alpha1/namespaces/<ns>/workflows"
# the API server's answer for a path it serves nothing at, a CRD not installed among them (kubeerrors.NOT_SERVED)
NOT_SERVED = ("text/plain; charset=utf-8", "404 page not found\n")


class WorkflowDouble:
    """Create and get Workflows. A scripted Argo controller advances the created Workflow by one
    transition per read, so every transition is seen exactly once: ``outcome`` maps task names to
    the phase they end in (default Succeeded), ``final`` is the workflow's phase after the last."""

    def __init__(self, *, crd_installed: bool = True, outcome: dict[str, str] | None = None,
                 final: str = "Succeeded", message: str = "", not_found: tuple[str, str] = NOT_SERVED):
        self.crd_installed, self.outcome, self.final, self.message = crd_installed, outcome or {}, final, message
        self.not_found = not_found  # (content type, body) of the 404 answered without the CRD
        self.workflows: dict[tuple[str, str], dict] = {}
        self.controllers: dict[tuple[str, str], Iterator[None]] = {}
        self.ids = itertools.count(1)
        self.lock = threading.Lock()
        self.routes = Map([Rule(PREFIX, methods=["POST"], endpoint="create"),
                           Rule(f"{PREFIX}/<name>", methods=["GET"], endpoint="get")])

    def __enter__(self) -> WorkflowDouble:
        self.server = make_server("127.0.0.1", 0, self.wsgi, threaded=True, request_handler=_QuietHandler)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    def kubeconfig(self, path: Path) -> Path:
        url = f"http://127.0.0.1:{self.server.server_port}"
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "double",
            "clusters": [{"name": "double", "cluster": {"server": url}}],
            "users": [{"name": "alice", "user": {"token": "t"}}],
            "contexts": [{"name": "double", "context": {"cluster": "double", "user": "alice", "namespace": NS}}],
        }))
        return path

    @Request.application
    def wsgi(self, request: Request) -> Response:
        try:
            endpoint, params = self.routes.bind_to_environ(request.environ).match()
        except Exception:  # noqa: BLE001  (werkzeug NotFound: what the real server says for unknown paths)
            return Response("404 page not found\n", status=404, mimetype="text/plain")
        if not self.crd_installed:
            return Response(self.not_found[1], status=404, content_type=self.not_found[0])
        return answer(getattr(self, endpoint), request, **params)

    def create(self, request: Request, ns: str) -> Response:
        body = request.get_json(force=True)
        assert request.args.get("fieldValidation") == "Strict"  # so unknown fields are errors, as here
        body["metadata"].setdefault("name", f"{body['metadata'].get('generateName', 'wf-')}{next(self.ids):05d}")
        # the strict schema (unknown fields are errors), read on the first create: skips the test where it is absent
        causes = metadata_causes(body["metadata"]) + schema_causes(body, argo_validator().schema)
        if causes:
            raise ApiError(422, "Invalid", "Workflow.argoproj.io is invalid",
                           {"name": body["metadata"]["name"], "kind": "Workflow", "causes": causes})
        body["metadata"]["namespace"] = ns
        with self.lock:
            self.workflows[(ns, body["metadata"]["name"])] = body
            self.controllers[(ns, body["metadata"]["name"])] = self.transitions(body)
        return _json(body, 201)

    def get(self, request: Request, ns: str, name: str) -> Response:
        with self.lock:
            wf = self.workflows.get((ns, name))
            if wf is None:
                raise ApiError(404, "NotFound", f'workflows.argoproj.io "{name}" not found')
            next(self.controllers[(ns, name)], None)  # the controller moves on by one transition per read
            return _json(copy.deepcopy(wf))

    def transitions(self, wf: dict):
        """The entrypoint DAG's tasks in order, each Running and then its outcome; then the workflow's end."""
        name = wf["metadata"]["name"]
        entry = next(t for t in wf["spec"]["templates"] if t["name"] == wf["spec"]["entrypoint"])
        for i, task in enumerate(entry["dag"]["tasks"]):
            for phase in ("Running", self.outcome.get(task["name"], "Succeeded")):
                nodes = wf.setdefault("status", {"phase": "Running"}).setdefault("nodes", {})
                nodes[f"{name}-{i}"] = {"displayName": task["name"], "type": "Pod", "phase": phase,
                                        "startedAt": f"2026-01-01T00:00:{i:02d}Z",
                                        **({"message": "Error (exit code 1)"} if phase == "Failed" else {})}
                yield
        wf["status"] |= {"phase": self.final, **({"message": self.message} if self.message else {})}
        yield


@pytest.fixture
def api(tmp_path):
    """start(**double options) -> (double, cluster flags); the double stops after the test."""
    with ExitStack() as stack:
        def start(**options) -> tuple[WorkflowDouble, list[str]]:
            double = stack.enter_context(WorkflowDouble(**options))
            return double, ["--kubeconfig", str(double.kubeconfig(tmp_path / "kubeconfig"))]
        yield start


@pytest.fixture(autouse=True)
def _fast_polls(monkeypatch):
    monkeypatch.setattr(submit, "POLL_SECONDS", 0.02)


def run(capsys, *argv: str) -> tuple[int, list[str], str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


def test_submit_wait_follows_the_steps_and_a_failed_candidate_does_not_fail_it(api, capsys):
    double, flags = api(outcome={"train-cnn-bn": "Failed"})
    code, out, err = run(capsys, "pipeline", "submit", str(EXAMPLE), "--wait", *flags)
    assert (code, err) == (0, "")
    assert out[0] == f"workflow.argoproj.io/digits-00001 created in namespace {NS}"
    assert "workflow/digits-00001: train-cnn-bn Failed: Error (exit code 1)" in out
    assert out[-1] == "workflow/digits-00001: Succeeded"
    steps = [line.split()[1] for line in out[1:-1]]
    assert steps == [name for name in ("ingest", "train-cnn", "train-cnn-dropout", "train-cnn-bn", "select",
                                       "deploy", "loadtest") for _ in range(2)]
    created = double.workflows[(NS, "digits-00001")]
    assert created["spec"]["serviceAccountName"] == argo.service_account(load_pipeline(EXAMPLE))


def test_failed_workflow_exits_1_with_its_message(api, capsys):
    _, flags = api(outcome={"loadtest": "Failed"}, final="Failed",
                   message="child 'loadtest' failed")
    code, out, _ = run(capsys, "pipeline", "submit", str(EXAMPLE), "--wait", *flags)
    assert code == 1
    assert out[-1] == "workflow/digits-00001: Failed: child 'loadtest' failed"


def test_without_wait_it_only_creates(api, capsys):
    double, flags = api()
    code, out, _ = run(capsys, "pipeline", "submit", str(EXAMPLE), *flags, "-n", NS)
    assert (code, out) == (0, [f"workflow.argoproj.io/digits-00001 created in namespace {NS}"])
    assert list(double.workflows) == [(NS, "digits-00001")]


@pytest.mark.parametrize("not_found", [
    NOT_SERVED,  # the real API server's
    ("application/json", '{"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", '
                         '"message": "the server could not find the requested resource", "code": 404}'),
], ids=["plain-page", "status-naming-no-object"])
def test_argo_not_installed_says_how_to_install_it(api, capsys, not_found):
    _, flags = api(crd_installed=False, not_found=not_found)
    code, _, err = run(capsys, "pipeline", "submit", str(EXAMPLE), *flags)
    assert code == 2
    assert "Argo Workflows is not installed" in err and submit.INSTALL_ARGO in err


def test_a_proxys_404_page_names_the_server_not_argo(api, capsys):
    double, flags = api(crd_installed=False, not_found=("text/html", "<html><body>Not Found</body></html>\n"))
    code, _, err = run(capsys, "pipeline", "submit", str(EXAMPLE), *flags)
    host = f"http://127.0.0.1:{double.server.server_port}"
    assert (code, err) == (2, f"hvdk8s pipeline: error: the server at {host} did not answer as a Kubernetes API "
                              "server: it answered create workflows.argoproj.io in namespace \"team\" with 404 and "
                              'text/html content that is not a Kubernetes Status: "<html><body>Not Found</body></html>". '
                              "Is this the right kubeconfig context, and its server URL (path included) the cluster's "
                              "API server? Check with: kubectl cluster-info (choose one with --kubeconfig/--context)\n")


def test_an_invalid_workflow_is_refused_with_field_paths(api):
    _, flags = api()
    workflow = yaml.safe_load((EXAMPLE.parent / "digits.workflow.yaml").read_text())
    workflow["spec"]["templates"][1]["retryStrategy"]["limit"] = [2]
    with pytest.raises(UserError) as caught:
        submit.create(connect(flags[1]), workflow, NS)
    assert str(caught.value).splitlines() == [
        "the API server rejected the Workflow as invalid:",
        "  spec.templates[1].retryStrategy.limit: Invalid value: [2]: [2] is not valid under any of the given "
        "schemas",
    ]
