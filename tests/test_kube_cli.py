"""``hvdk8s submit/status/logs/delete`` end to end: the real ``kubernetes`` client, through a
generated kubeconfig, against the local API double (tests/kube_double.py), which validates
create bodies with the real MPIJob CRD schema and plays the MPI Operator. Not a real cluster."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import pytest
import yaml

from hvdk8s import mpijob
from hvdk8s.cli import main
from hvdk8s.cluster import jobstatus, kube, kubeerrors, watch
from hvdk8s.cluster.client import connect
from hvdk8s.common.errors import UserError

from kube_double import (
    HTML_PAGE,
    JSON_LIST,
    MPIJOBS,
    RUNTIMES,
    TRAINJOBS,
    Foreign,
    KubeDouble,
    Step,
    failing,
    succeeding,
    trainjob_launcher_unschedulable,
    trainjob_succeeding,
)

pytestmark = pytest.mark.unit

NS = "team"
WATCH = f"/apis/kubeflow.org/v2beta1/namespaces/{NS}/mpijobs"
TRAINING_LOG = [f"epoch {i}/6 loss={1 / i:.3f}" for i in range(1, 7)]

PI = {
    "apiVersion": "kubeflow.org/v2beta1",
    "kind": "MPIJob",
    "metadata": {"name": "pi"},
    "spec": {
        "slotsPerWorker": 1,
        "runPolicy": {"cleanPodPolicy": "Running"},
        "mpiReplicaSpecs": {
            "Launcher": {"replicas": 1, "template": {"spec": {"containers": [
                {"name": "mpi-launcher", "image": "hvdk8s:cpu",
                 "command": ["mpirun", "-np", "2", "python", "/app/train.py"]}]}}},
            "Worker": {"replicas": 2, "template": {"spec": {"containers": [
                {"name": "mpi-worker", "image": "hvdk8s:cpu"}]}}},
        },
    },
}


@pytest.fixture(autouse=True)
def _fast_pod_polls(monkeypatch):
    monkeypatch.setattr(watch, "POD_POLL_SECONDS", 0.05)


@pytest.fixture
def api(tmp_path):
    """start(**double options) -> (double, cluster flags); the double stops after the test."""
    with ExitStack() as stack:
        def start(namespace: str | None = NS, **options) -> tuple[KubeDouble, list[str]]:
            double = stack.enter_context(KubeDouble(**options))
            config = double.write_kubeconfig(tmp_path / "kubeconfig", namespace=namespace)
            return double, ["--kubeconfig", str(config)]
        yield start


@pytest.fixture
def manifest(tmp_path) -> Path:
    path = tmp_path / "pi.yaml"
    path.write_text(yaml.safe_dump(PI))
    return path


def run(capsys, *argv: str) -> tuple[int, list[str], str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


def status_lines(out: list[str]) -> list[str]:
    return [line.removeprefix("mpijob/pi: ") for line in out if line.startswith("mpijob/pi: ")]


def test_submit_follow_reports_each_transition_streams_logs_and_exits_0(api, manifest, capsys):
    # watches end every 0.2 s and the first resumed one gets 410 Gone: the client must
    # resume / re-list without losing or repeating a transition
    double, flags = api(lifecycle=succeeding(TRAINING_LOG, live=True), max_watch_seconds=0.2, expire_watches=1)

    code, out, err = run(capsys, "submit", str(manifest), "--follow", *flags)

    assert (code, err) == (0, "")
    assert out[0] == "mpijob.kubeflow.org/pi created in namespace team"
    said = status_lines(out)
    assert [s for s in said if not s.startswith(("replicas:", "logs of"))] == [
        "Created: MPIJob team/pi is created. [MPIJobCreated]",
        "Running: MPIJob team/pi is running. [MPIJobRunning]",
        "Succeeded: MPIJob team/pi successfully completed. [MPIJobSucceeded]",
    ]
    assert "replicas: Launcher 1 active; Worker 2 active" in said
    assert said[-1] == "replicas: Launcher 1 succeeded; Worker none"
    pod = double.launcher_pods(NS, "pi")[0]["metadata"]["name"]
    start = out.index(f"mpijob/pi: logs of launcher pod {pod}:")
    assert out[start + 1:start + 1 + len(TRAINING_LOG)] == TRAINING_LOG
    assert out.index("mpijob/pi: Succeeded: MPIJob team/pi successfully completed. [MPIJobSucceeded]") > start
    # followed live: the log was opened with follow=true while the launcher was still running
    assert double.log_reads[0] == (pod, True, "Running")
    watches = [q for m, p, q in double.requests if p == WATCH and q.get("watch") == "true"]
    lists = [q for m, p, q in double.requests if p == WATCH and m == "GET" and "watch" not in q]
    assert len(watches) >= 3 and len(lists) >= 2  # resumed after timeouts, re-listed after 410


def test_submit_wait_on_a_failing_job_exits_1_with_the_operators_reason(api, manifest, capsys):
    _, flags = api(lifecycle=failing("BackoffLimitExceeded", "Job has reached the specified backoff limit"))

    code, out, err = run(capsys, "submit", str(manifest), "--wait", *flags)

    assert code == 1
    assert status_lines(out)[-2:] == [
        "Failed: Job has reached the specified backoff limit [BackoffLimitExceeded]",
        "replicas: Launcher 1 failed; Worker none"]
    assert err == ("hvdk8s: MPIJob team/pi failed (BackoffLimitExceeded): "
                   "Job has reached the specified backoff limit\n")
    assert not any("logs of" in line for line in out)  # --wait alone streams no logs


def test_submit_without_wait_creates_and_returns(api, manifest, capsys):
    double, flags = api()
    assert run(capsys, "submit", str(manifest), *flags) == (
        0, ["mpijob.kubeflow.org/pi created in namespace team"], "")
    stored = double.job(NS, "pi")
    assert stored["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 2
    assert stored["spec"]["launcherCreationPolicy"] == "AtStartup"  # the CRD's default, applied by the double


def test_dry_run_prints_what_the_server_accepted_and_creates_nothing(api, manifest, capsys):
    double, flags = api()
    code, out, err = run(capsys, "submit", str(manifest), "--dry-run=server", *flags)

    assert (code, err) == (0, "")
    assert out[0] == "# mpijob.kubeflow.org/pi accepted by the API server (dry run: nothing was created)"
    accepted = yaml.safe_load("\n".join(out[1:]))
    assert accepted["metadata"]["namespace"] == NS
    assert accepted["spec"]["mpiImplementation"] == "OpenMPI"  # server-side defaulting shows
    assert accepted["spec"]["mpiReplicaSpecs"] == PI["spec"]["mpiReplicaSpecs"]
    assert double.job(NS, "pi") is None
    assert [q.get("dryRun") for m, p, q in double.requests if m == "POST"] == ["All"]
    assert run(capsys, "status", "pi", *flags)[0] == 2  # really not there


EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "mpijob" / "examples").glob("*.yaml"))


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_checked_in_examples_are_accepted_by_the_crd_schema(api, example, capsys):
    """hvdk8s job specs (rendered by hvdk8s.mpijob) and MPIJob files pass the server's real-schema check."""
    _, flags = api()
    code, out, err = run(capsys, "submit", str(example), "--dry-run=server", *flags)
    assert (code, err) == (0, "")
    assert yaml.safe_load("\n".join(out[1:]))["kind"] == "MPIJob"


def test_dry_run_with_wait_is_refused(api, manifest, capsys):
    _, flags = api()
    code, _, err = run(capsys, "submit", str(manifest), "--dry-run=server", "--wait", *flags)
    assert code == 2 and "cannot be combined with --dry-run=server" in err


def test_name_taken_says_so_and_how_to_free_it(api, manifest, capsys):
    _, flags = api()
    assert run(capsys, "submit", str(manifest), *flags)[0] == 0
    code, _, err = run(capsys, "submit", str(manifest), *flags)
    assert code == 2
    assert err == ('hvdk8s submit: error: an MPIJob named "pi" already exists in namespace "team": delete it first '
                   "(hvdk8s delete pi -n team) or change metadata.name\n")


def test_forbidden_names_verb_resource_namespace_and_the_check(api, manifest, capsys):
    double, flags = api(forbidden=[("create", "mpijobs")])
    code, _, err = run(capsys, "submit", str(manifest), *flags)
    assert code == 2
    assert 'forbidden by RBAC: you may not create mpijobs.kubeflow.org "pi" in namespace "team"' in err
    assert 'User "alice" cannot create resource "mpijobs" in API group "kubeflow.org"' in err
    assert "kubectl auth can-i create mpijobs.kubeflow.org -n team" in err
    assert "Traceback" not in err and double.job(NS, "pi") is None


def test_forbidden_logs_name_the_pod_log_resource(api, manifest, capsys):
    _, flags = api(lifecycle=succeeding(["hello"]), forbidden=[("get", "pods/log")])
    assert run(capsys, "submit", str(manifest), "--wait", *flags)[0] == 0
    code, _, err = run(capsys, "logs", "pi", *flags)
    assert code == 2 and "you may not get pods/log" in err and "kubectl auth can-i get pods/log -n team" in err


def test_crd_not_installed_says_how_to_install_the_operator(api, manifest, capsys):
    _, flags = api(crd_installed=False)
    for argv in (("submit", str(manifest)), ("status", "pi"), ("delete", "pi")):
        code, _, err = run(capsys, *argv, *flags)
        assert code == 2
        assert "the MPI Operator is not installed" in err
        assert kubeerrors.INSTALL_OPERATOR in err


def test_invalid_spec_prints_the_servers_causes_with_field_paths(api, capsys):
    _, flags = api()
    cluster = connect(flags[1])
    bad = yaml.safe_load(yaml.safe_dump(PI))
    bad["spec"]["slotsPerWorker"] = "two"
    bad["spec"]["mpiImplementation"] = "OpenMP"
    bad["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] = "2"
    with pytest.raises(UserError) as raised:
        kube.create_job(cluster, bad, NS)
    assert str(raised.value) == "\n".join([
        'the API server rejected MPIJob "pi" as invalid:',
        '  spec.mpiImplementation: Unsupported value: "OpenMP": supported values: "OpenMPI", "Intel", "MPICH"',
        '  spec.mpiReplicaSpecs[Worker].replicas: Invalid value: "string": spec.mpiReplicaSpecs[Worker].replicas '
        'in body must be of type integer: "string"',
        '  spec.slotsPerWorker: Invalid value: "string": spec.slotsPerWorker in body must be of type integer: '
        '"string"',
    ])


def test_misspelled_field_is_refused_not_silently_dropped(api):
    double, flags = api()
    typo = yaml.safe_load(yaml.safe_dump(PI))
    typo["spec"]["slotsPerWorkr"] = typo["spec"].pop("slotsPerWorker")
    with pytest.raises(UserError) as raised:
        kube.create_job(connect(flags[1]), typo, NS)
    assert str(raised.value) == (
        'the API server rejected MPIJob "pi": MPIJob in version "v2beta1" cannot be handled as a MPIJob: strict '
        'decoding error: unknown field "spec.slotsPerWorkr" (misspelled, or not a field of kubeflow.org/v2beta1 '
        "MPIJobs)")
    assert double.job(NS, "pi") is None


def test_invalid_spec_through_the_cli_is_exit_2_without_traceback(api, manifest, capsys, monkeypatch):
    _, flags = api()
    bad = yaml.safe_load(yaml.safe_dump(PI))
    del bad["spec"]["mpiReplicaSpecs"]
    monkeypatch.setattr(mpijob, "objects_from_file", lambda path, api: [bad])
    code, _, err = run(capsys, "submit", str(manifest), *flags)
    assert (code, err) == (2, 'hvdk8s submit: error: the API server rejected MPIJob "pi" as invalid:\n'
                              "  spec.mpiReplicaSpecs: Required value\n")


def test_unreachable_cluster(tmp_path, manifest, capsys):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = tmp_path / "kubeconfig"
    config.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "gone",
        "clusters": [{"name": "gone", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "gone", "context": {"cluster": "gone", "user": "u"}}]}))
    code, _, err = run(capsys, "submit", str(manifest), "--kubeconfig", str(config))
    assert code == 2
    assert err.startswith(f"hvdk8s submit: error: cannot reach the Kubernetes API server at http://127.0.0.1:{port}: "
                          "Failed to establish a new connection: [Errno 111] Connection refused")
    assert "kubectl cluster-info" in err


def test_no_kubeconfig_anywhere(tmp_path, manifest, capsys, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    code, _, err = run(capsys, "submit", str(manifest))
    assert code == 2
    assert f"no cluster configured: no kubeconfig at {tmp_path}/.kube/config" in err


@pytest.mark.parametrize("text, reason", [
    ("apiVersion: v1\nkind: Config\nclusters: 5\ncontexts: []\nusers: []\n", "'int' object is not iterable"),
    ("apiVersion: v1\nclusters: [\n  - {name: x\n", "while parsing a flow node expected the node content, but "
                                                    "found '-' in \"{path}\", line 3, column 3"),
], ids=["wrong-type", "invalid-yaml"])
def test_a_malformed_kubeconfig_is_named_in_one_line(tmp_path, capsys, text, reason):
    config = tmp_path / "kc"
    config.write_text(text)
    code, _, err = run(capsys, "status", "foo", "--kubeconfig", str(config))
    assert (code, err) == (2, f"hvdk8s status: error: kubeconfig {config} is not a valid kubeconfig: "
                              f"{reason.format(path=config)}\n")


def test_unknown_context_lists_the_known_ones(api, manifest, capsys):
    _, flags = api()
    code, _, err = run(capsys, "status", "pi", "--context", "prod", *flags)
    assert code == 2 and "has no context 'prod' (it has: double); choose with --context" in err


def test_namespace_comes_from_manifest_then_context_and_may_not_conflict(api, tmp_path, capsys):
    double, flags = api(namespace=None)  # context without a namespace: "default"
    path = tmp_path / "pi.yaml"
    path.write_text(yaml.safe_dump(PI))
    assert run(capsys, "submit", str(path), *flags)[1] == ["mpijob.kubeflow.org/pi created in namespace default"]
    path.write_text(yaml.safe_dump(PI | {"metadata": {"name": "pi", "namespace": "research"}}))
    assert run(capsys, "submit", str(path), *flags)[1] == ["mpijob.kubeflow.org/pi created in namespace research"]
    assert double.job("default", "pi") and double.job("research", "pi")
    code, _, err = run(capsys, "submit", str(path), "-n", "other", *flags)
    assert code == 2 and 'metadata.namespace "research" but --namespace is "other"' in err


def test_job_spec_without_namespace_goes_to_the_flag_or_the_context(api, tmp_path, capsys):
    double, flags = api()  # the context's namespace is "team"
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({"name": "pi", "image": "img:1", "command": ["python", "t.py"]}))
    assert run(capsys, "submit", str(spec), *flags)[1] == ["mpijob.kubeflow.org/pi created in namespace team"]
    assert run(capsys, "submit", str(spec), "-n", "research", *flags)[1] == [
        "mpijob.kubeflow.org/pi created in namespace research"
    ]
    assert double.job("team", "pi") and double.job("research", "pi")


def test_status_summarises_conditions_and_replicas(api, manifest, capsys):
    _, flags = api(lifecycle=succeeding(["done"]))
    assert run(capsys, "submit", str(manifest), "--wait", *flags)[0] == 0
    code, out, err = run(capsys, "status", "pi", *flags)
    assert (code, err) == (0, "")
    assert out[:5] == [
        "MPIJob team/pi: Succeeded",
        "  Created: MPIJob team/pi is created. [MPIJobCreated]",
        "  Running=False: MPIJob team/pi is running. [MPIJobRunning]",
        "  Succeeded: MPIJob team/pi successfully completed. [MPIJobSucceeded]",
        "  replicas: Launcher 1 succeeded; Worker none",
    ]
    assert len(out) == 7 and out[5].startswith("  started 20") and out[6].startswith("  completed 20")


def test_status_of_a_missing_job(api, capsys):
    _, flags = api()
    code, _, err = run(capsys, "status", "nope", *flags)
    assert (code, err) == (2, 'hvdk8s status: error: mpijobs.kubeflow.org "nope" not found in namespace "team" '
                              "(list them: kubectl get mpijobs -n team)\n")


def test_logs_after_the_job_and_follow_while_it_runs(api, manifest, capsys):
    lines = ["step 1", "step 2", "step 3"]
    double, flags = api(lifecycle=succeeding(lines, live=True))
    assert run(capsys, "submit", str(manifest), *flags)[0] == 0
    assert run(capsys, "logs", "pi", "--follow", *flags) == (0, lines, "")  # waits for the launcher, follows
    assert double.log_reads[0][1:] == (True, "Running")
    assert run(capsys, "logs", "pi", *flags) == (0, lines, "")


def test_logs_before_the_launcher_exists(api, manifest, capsys):
    _, flags = api()  # no operator: nothing ever happens to the job
    assert run(capsys, "submit", str(manifest), *flags)[0] == 0
    code, _, err = run(capsys, "logs", "pi", *flags)
    assert code == 2 and "MPIJob team/pi (Pending) has no launcher pod" in err


def test_delete_is_foreground_and_waits_until_gone(api, manifest, capsys):
    double, flags = api(lifecycle=succeeding(["x"]), foreground_delay=0.3)
    assert run(capsys, "submit", str(manifest), "--wait", *flags)[0] == 0
    code, out, err = run(capsys, "delete", "pi", "--wait", *flags)
    assert (code, err) == (0, "")
    assert out == ["mpijob.kubeflow.org/pi deletion requested (foreground: removed once its pods, services and "
                   "secrets are gone)", "mpijob.kubeflow.org/pi deleted"]
    assert double.job(NS, "pi") is None and double.launcher_pods(NS, "pi") == []
    assert [q.get("propagationPolicy") for m, p, q in double.requests if m == "DELETE"] == ["Foreground"]
    assert run(capsys, "submit", str(manifest), *flags)[0] == 0  # the name is free again


def test_delete_missing_job(api, capsys):
    _, flags = api()
    code, _, err = run(capsys, "delete", "nope", *flags)
    assert code == 2 and 'mpijobs.kubeflow.org "nope" not found in namespace "team"' in err


def delete_once_said(double: KubeDouble, monkeypatch: pytest.MonkeyPatch, said: str, job: str = "pi",
                     res=MPIJOBS) -> None:
    """Delete the job (ending the wait) once --wait has printed a status line containing ``said``, its last
    explanation: the first pod listing can take seconds while the client builds its models, and an explanation
    printed after the wait has ended is dropped, so waiting for the request alone would race the printing."""
    printed = threading.Event()
    status = watch.Printer.status

    def watched(printer: watch.Printer, line: str) -> None:
        status(printer, line)
        if said in line:
            printed.set()

    monkeypatch.setattr(watch.Printer, "status", watched)

    def delete() -> None:
        printed.wait(60)  # never hang: the assertions then say what was missing
        time.sleep(0.5)  # any repeat of an explanation would come in this time
        double.remove(NS, job, res)

    threading.Thread(target=delete, daemon=True).start()


def test_wait_hints_at_a_missing_operator_and_notices_deletion(api, manifest, capsys, monkeypatch):
    monkeypatch.setattr(watch, "EXPLAIN_SECONDS", 0.1)
    double, flags = api(max_watch_seconds=0.2)  # no operator answers
    delete_once_said(double, monkeypatch, "waiting: no status yet")
    code, out, err = run(capsys, "submit", str(manifest), "--wait", *flags)
    assert code == 1
    assert "mpijob/pi: waiting: no status yet: is the MPI Operator running?" in out[1]
    assert err == "hvdk8s: MPIJob team/pi was deleted before it finished\n"


def test_wait_explains_unschedulable_pods_from_their_events(api, manifest, capsys, monkeypatch):
    """Created, but the scheduler cannot place the workers: --wait says so, with the scheduler's words."""
    monkeypatch.setattr(watch, "EXPLAIN_SECONDS", 0.2)
    full = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available."
    double, flags = api(max_watch_seconds=0.3, lifecycle=[
        Step(condition=("Created", "True", "MPIJobCreated", "MPIJob {ns}/{name} is created."), unschedulable=full)])
    delete_once_said(double, monkeypatch, "waiting: pod pi-worker-1 is unschedulable")
    code, out, err = run(capsys, "submit", str(manifest), "--wait", *flags)
    assert code == 1 and err == "hvdk8s: MPIJob team/pi was deleted before it finished\n"
    assert [line for line in status_lines(out) if line.startswith("waiting:")] == [
        f"waiting: pod pi-worker-0 is unschedulable: {full}",
        f"waiting: pod pi-worker-1 is unschedulable: {full}"]  # each said once, not every poll


def test_an_explainer_stopped_while_its_request_fails_says_nothing(capsys, monkeypatch):
    """The API failing under a running explainer is said; after the wait has ended (stop) it is not: a request
    in flight then would otherwise print into whatever runs next."""
    monkeypatch.setattr(watch, "EXPLAIN_SECONDS", 0.01)
    for stop_first in (False, True):
        explainer = watch.Explainer(None, NS, "pi", watch.Printer("pi"), kube.MPIJOB)

        def reasons(explainer=explainer, stop_first=stop_first) -> list[str]:
            if stop_first:
                explainer.stop()
            raise UserError("cannot reach the Kubernetes API server")

        explainer.reasons = reasons
        explainer.start()
        explainer.join(5)
        assert not explainer.is_alive()
        expected = "" if stop_first else "hvdk8s: cannot tell why the job waits: cannot reach the Kubernetes API server\n"
        assert capsys.readouterr().err == expected


def test_a_log_streamer_stopped_while_its_request_fails_says_nothing(capsys, monkeypatch):
    """The same for the launcher's log streamer, which wait_for_job stops (not only finishes) when it returns."""
    raised: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda hook: raised.append(hook.exc_value))
    for stop_first in (False, True):
        logs = watch.LauncherLogs(None, NS, "pi", watch.Printer("pi"), kube.MPIJOB)

        def launcher_pod(*_, logs=logs, stop_first=stop_first):
            if stop_first:
                logs.stop()
            raise UserError("cannot reach the Kubernetes API server")

        monkeypatch.setattr(kube, "launcher_pod", launcher_pod)
        logs.start()
        logs.join(5)
        assert not logs.is_alive()
        expected = "" if stop_first else "hvdk8s: cannot stream the launcher's logs: cannot reach the Kubernetes API server\n"
        assert (capsys.readouterr().err, raised) == (expected, [])


def test_wait_explains_a_suspended_queued_job_and_an_operator_refusal():
    job = {"metadata": {"name": "pi", "namespace": NS, "labels": {"kueue.x-k8s.io/queue-name": "gpus"}},
           "spec": {"runPolicy": {"suspend": True}}}
    assert jobstatus.waiting_reasons(job, [], {}) == [
        "suspended: waiting for Kueue to admit it from LocalQueue 'gpus' (kubectl get workloads -n team; "
        "its quota or admission checks hold it)"]
    refused = {"metadata": {"name": "pi", "namespace": NS}, "spec": {}}
    event = {"type": "Warning", "reason": "ValidationError", "message": "Found validation errors: spec.x"}
    assert jobstatus.waiting_reasons(refused, [], {"pi": [event]}) == [
        "the MPI Operator did not start it: ValidationError: Found validation errors: spec.x"]
    trainjob = {"kind": "TrainJob", "metadata": {"name": "pi", "namespace": NS}, "spec": {"suspend": True}}
    assert jobstatus.waiting_reasons(trainjob, [], {}) == ["suspended (suspend: true): nothing runs until it is resumed"]
    del trainjob["spec"]["suspend"]
    assert jobstatus.waiting_reasons(trainjob, [], {}) == [
        "no pods and no status yet: is Kubeflow Trainer running? Check: kubectl get pods -n kubeflow-system"]


def test_installed_entry_point_exit_codes(api, manifest):
    """The console script, as a user runs it: exit status and output, no traceback."""
    _, flags = api(lifecycle=failing("MPIJobFailed", "MPIJob team/pi has failed", logs=["boom"]))
    hvdk8s = str(Path(sys.executable).parent / "hvdk8s")
    proc = subprocess.run([hvdk8s, "submit", str(manifest), "--follow", *flags],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "boom" in proc.stdout.splitlines()
    assert proc.stderr == "hvdk8s: MPIJob team/pi failed (MPIJobFailed): MPIJob team/pi has failed\n"


# ---- Kubeflow Trainer TrainJobs (--api trainjob) ---------------------------------------------


@pytest.fixture
def job_spec(tmp_path) -> Path:
    path = tmp_path / "digits.yaml"
    path.write_text(yaml.safe_dump({"name": "digits", "image": "hvdk8s:cpu", "command": ["python", "/app/train.py"]}))
    return path


def test_trainjob_submit_follow_status_logs_delete(api, job_spec, capsys):
    """The runtime and TrainJob pass the real Trainer CRD schemas (the double validates creates with them)."""
    double, flags = api(lifecycle=trainjob_succeeding(TRAINING_LOG))
    code, out, err = run(capsys, "submit", str(job_spec), "--api", "trainjob", "--follow", *flags)
    assert (code, err) == (0, "")
    assert out[0] == "trainjob.trainer.kubeflow.org/digits created in namespace team on runtime hvdk8s-digits"
    said = [line.removeprefix("trainjob/digits: ") for line in out if line.startswith("trainjob/digits: ")]
    assert said[-2:] == ["Complete: jobset completed successfully [AllJobsCompleted]",
                         "child Jobs: launcher 1 succeeded; node none"]
    assert [line for line in out if line in TRAINING_LOG] == TRAINING_LOG
    # its own TrainingRuntime in the job's namespace, owned by the TrainJob
    runtime, trainjob = double.job(NS, "hvdk8s-digits", RUNTIMES), double.job(NS, "digits", TRAINJOBS)
    assert runtime["spec"]["mlPolicy"]["mpi"]["numProcPerNode"] == 1
    assert trainjob["spec"]["runtimeRef"] == {"name": "hvdk8s-digits", "apiGroup": "trainer.kubeflow.org",
                                              "kind": "TrainingRuntime"}
    assert runtime["metadata"]["ownerReferences"] == [{"apiVersion": "trainer.kubeflow.org/v1alpha1",
                                                       "kind": "TrainJob", "name": "digits",
                                                       "uid": trainjob["metadata"]["uid"]}]

    code, out, _ = run(capsys, "status", "digits", "--api", "trainjob", *flags)
    assert code == 0 and out[0] == "TrainJob team/digits: Complete"
    code, out, _ = run(capsys, "logs", "digits", "--api", "trainjob", *flags)
    assert (code, out) == (0, TRAINING_LOG)
    code, out, _ = run(capsys, "delete", "digits", "--api", "trainjob", "--wait", *flags)
    assert code == 0 and out[-1] == "trainjob.trainer.kubeflow.org/digits deleted"
    # the garbage collector took the runtime with its owner: nothing is left, nothing was cluster-scoped
    assert double.job(NS, "digits", TRAINJOBS) is None and double.job(NS, "hvdk8s-digits", RUNTIMES) is None
    assert not double.jobs

    # the same job name in another namespace gets a runtime of its own, and this one's stays as it was
    code, out, _ = run(capsys, "submit", str(job_spec), "--api", "trainjob", *flags)
    assert code == 0
    mine = double.job(NS, "hvdk8s-digits", RUNTIMES)
    code, out, _ = run(capsys, "submit", str(job_spec), "--api", "trainjob", "-n", "other", *flags)
    assert code == 0 and out[0].endswith("in namespace other on runtime hvdk8s-digits")
    assert double.job(NS, "hvdk8s-digits", RUNTIMES) == mine
    assert double.job("other", "hvdk8s-digits", RUNTIMES)["metadata"]["ownerReferences"][0]["uid"] == double.job(
        "other", "digits", TRAINJOBS)["metadata"]["uid"]


def test_trainjob_name_taken_leaves_the_running_jobs_runtime_alone(api, job_spec, capsys):
    """Finding 1 of the review: the runtime of a job still running under that name stays as it is, owned by it."""
    double, flags = api()
    assert run(capsys, "submit", str(job_spec), "--api", "trainjob", *flags)[0] == 0
    first = double.job(NS, "hvdk8s-digits", RUNTIMES)
    job_spec.write_text(yaml.safe_dump(yaml.safe_load(job_spec.read_text()) | {"workers": 3}))
    code, _, err = run(capsys, "submit", str(job_spec), "--api", "trainjob", *flags)
    assert code == 2
    assert err == ('hvdk8s submit: error: a TrainJob named "digits" already exists in namespace "team": delete it '
                   "first (hvdk8s delete digits --api trainjob -n team) or change metadata.name\n")
    assert double.job(NS, "hvdk8s-digits", RUNTIMES) == first
    assert first["metadata"]["ownerReferences"][0]["uid"] == double.job(NS, "digits", TRAINJOBS)["metadata"]["uid"]


def test_trainjob_refused_leaves_no_runtime_and_a_left_over_one_is_taken_over(api, job_spec, capsys):
    double, flags = api(forbidden=[("create", "trainjobs")])
    code, _, err = run(capsys, "submit", str(job_spec), "--api", "trainjob", *flags)
    assert code == 2 and 'you may not create trainjobs.trainer.kubeflow.org "digits"' in err
    assert err.endswith("\nThe TrainingRuntime hvdk8s-digits created for it is deleted again.\n")
    assert double.jobs == {}  # the runtime it had created first is deleted again
    assert posted(double) == ["trainingruntimes", "trainjobs"]  # RBAC's refusal is not tried again

    # a job deleted with --cascade=orphan leaves its runtime, unowned: a resubmission replaces and owns it
    double.forbidden.clear()
    assert run(capsys, "submit", str(job_spec), "--api", "trainjob", *flags)[0] == 0
    connect(flags[1]).custom.delete_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", NS, "trainjobs", "digits", propagation_policy="Orphan")
    assert double.job(NS, "hvdk8s-digits", RUNTIMES)["metadata"].get("ownerReferences") == []
    job_spec.write_text(yaml.safe_dump(yaml.safe_load(job_spec.read_text()) | {"workers": 3}))
    assert run(capsys, "submit", str(job_spec), "--api", "trainjob", *flags)[0] == 0
    runtime = double.job(NS, "hvdk8s-digits", RUNTIMES)
    assert runtime["spec"]["mlPolicy"]["numNodes"] == 3
    assert runtime["metadata"]["ownerReferences"][0]["uid"] == double.job(NS, "digits", TRAINJOBS)["metadata"]["uid"]


def posted(double: KubeDouble) -> list[str]:
    """The resources of the creates the double was sent, in order."""
    return [path.rsplit("/", 1)[1] for method, path, _ in double.requests if method == "POST"]


def test_trainjob_submit_tries_again_until_trainers_webhook_sees_the_new_runtime(api, job_spec, capsys):
    """Trainer's webhook reads runtimes from its controller's cache, a watch event behind the API server (the
    double's webhook_lag): a TrainJob sent right after its runtime is refused as if there were none, so submit
    tries it again, and keeps the runtime it created (deleting it would make every resubmission race again)."""
    double, flags = api(webhook_lag=0.3)
    code, out, err = run(capsys, "submit", str(job_spec), "--api", "trainjob", *flags)
    assert (code, out, err) == (0, ["trainjob.trainer.kubeflow.org/digits created in namespace team on runtime "
                                    "hvdk8s-digits"], "")
    runtime_create, *job_creates = posted(double)
    assert runtime_create == "trainingruntimes" and len(job_creates) > 1 and set(job_creates) == {"trainjobs"}
    assert not [path for method, path, _ in double.requests if method == "DELETE"]
    assert double.job(NS, "hvdk8s-digits", RUNTIMES)["metadata"]["ownerReferences"][0]["uid"] == double.job(
        NS, "digits", TRAINJOBS)["metadata"]["uid"]


def test_trainjob_submit_gives_up_when_trainers_webhook_never_sees_the_runtime(api, job_spec, capsys, monkeypatch):
    monkeypatch.setattr(kube, "RUNTIME_CACHE_WAITS", (0.01, 0.02))
    double, flags = api(webhook_lag=3600)
    code, _, err = run(capsys, "submit", str(job_spec), "--api", "trainjob", *flags)
    assert code == 2
    assert err == (
        'hvdk8s submit: error: create trainjobs.trainer.kubeflow.org "digits" in namespace "team" was refused by '
        "Kubeflow Trainer's TrainJob webhook 3 times over 0.03 s after hvdk8s created the TrainingRuntime "
        "hvdk8s-digits it runs on: the webhook looks runtimes up in the Trainer controller's cache, which had not "
        "caught up with the API server. Check that the controller is healthy (kubectl -n kubeflow-system logs "
        "deploy/kubeflow-trainer-controller-manager), then submit again. The webhook said: admission webhook "
        '"validator.trainjob.trainer.kubeflow.org" denied the request: spec.runtimeRef: Invalid value: '
        'v1alpha1.RuntimeRef{Name:"hvdk8s-digits", APIGroup:(*string)(0xc0004b2a40), Kind:(*string)(0xc0004b2a50)}: '
        'trainingruntimes.trainer.kubeflow.org "hvdk8s-digits" not found: specified trainingRuntime must be '
        "created before the TrainJob is created\n"
        "The TrainingRuntime hvdk8s-digits created for it is deleted again.\n")
    assert posted(double) == ["trainingruntimes", "trainjobs", "trainjobs", "trainjobs"]
    assert double.jobs == {}


def test_trainjob_dry_run_checks_what_trainers_webhook_lets_the_server_check(api, job_spec, capsys):
    """Trainer's TrainJob webhook (modelled by the double) refuses a TrainJob whose runtime is not stored, dry run
    or not: the server checks the runtime, and the TrainJob only once that very runtime is stored."""
    double, flags = api()
    dry_run = ("submit", str(job_spec), "--api", "trainjob", "--dry-run=server", *flags)
    code, out, err = run(capsys, *dry_run)
    assert (code, err) == (0, "")
    headers = [line for line in out if line.startswith("#")]
    assert headers == [
        "# trainingruntime.trainer.kubeflow.org/hvdk8s-digits accepted by the API server (dry run: nothing was created)",
        "# trainjob.trainer.kubeflow.org/digits not checked by the API server: Kubeflow Trainer's webhook validates a "
        "TrainJob against its TrainingRuntime as stored, and hvdk8s-digits is not stored as rendered until submit "
        "(dry run: nothing was created)"]
    runtime, trainjob = yaml.safe_load_all("\n".join(out))
    assert runtime["metadata"]["namespace"] == NS and runtime["spec"]["mlPolicy"]["mpi"]["numProcPerNode"] == 1
    sent = mpijob.objects_from_file(job_spec, "trainjob")[1]
    sent["metadata"]["namespace"] = NS
    assert trainjob == sent  # as rendered, into the namespace
    assert double.jobs == {} and [(m, q.get("dryRun")) for m, _, q in double.requests if m != "GET"] == [("POST", "All")]

    # the same runtime stored (left by a job deleted with --cascade=orphan): the server checks the TrainJob too
    assert run(capsys, "submit", str(job_spec), "--api", "trainjob", *flags)[0] == 0
    connect(flags[1]).custom.delete_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", NS, "trainjobs", "digits", propagation_policy="Orphan")
    stored = double.job(NS, "hvdk8s-digits", RUNTIMES)
    double.requests.clear()
    code, out, err = run(capsys, *dry_run)
    assert (code, err) == (0, "")
    assert [line for line in out if line.startswith("#")][1] == (
        "# trainjob.trainer.kubeflow.org/digits accepted by the API server (dry run: nothing was created)")
    assert next(yaml.safe_load_all("\n".join(out)))["spec"] == stored["spec"]
    assert [(m, q.get("dryRun")) for m, _, q in double.requests if m != "GET"] == [
        ("POST", "All"), ("PUT", "All"), ("POST", "All")]  # runtime: 409 then a dry-run replace; the TrainJob
    assert double.job(NS, "hvdk8s-digits", RUNTIMES) == stored and double.job(NS, "digits", TRAINJOBS) is None

    # a different spec: the stored runtime is not this job's, so the TrainJob is not sent
    job_spec.write_text(yaml.safe_dump(yaml.safe_load(job_spec.read_text()) | {"workers": 3}))
    code, out, _ = run(capsys, *dry_run)
    assert code == 0 and "not checked by the API server" in [line for line in out if line.startswith("#")][1]
    assert double.job(NS, "hvdk8s-digits", RUNTIMES) == stored


def test_trainjob_webhook_of_the_double_refuses_a_job_without_its_runtime(api, job_spec):
    """The model itself: what the old dry run (runtime dry-run created, so not stored, then the TrainJob) got."""
    double, flags = api()
    _, job = mpijob.objects_from_file(job_spec, "trainjob")
    with pytest.raises(UserError) as refused:
        kube.create_job(connect(flags[1]), job, NS, dry_run=True)
    assert str(refused.value).startswith(
        'create trainjobs.trainer.kubeflow.org "digits" in namespace "team" was refused by an admission webhook '
        '(not RBAC): admission webhook "validator.trainjob.trainer.kubeflow.org" denied the request: ')
    assert ('admission webhook "validator.trainjob.trainer.kubeflow.org" denied the request: spec.runtimeRef: '
            "Invalid value: v1alpha1.RuntimeRef{Name:\"hvdk8s-digits\"") in str(refused.value)
    assert ('trainingruntimes.trainer.kubeflow.org "hvdk8s-digits" not found: specified trainingRuntime must be '
            "created before the TrainJob is created") in str(refused.value)


def test_trainjob_with_an_unschedulable_launcher_is_not_running_and_wait_says_why(api, job_spec, capsys, monkeypatch):
    """Trainer counts the launcher's child Job active while its pod is only Pending (v2.3.0
    trainjob_types.go, JobStatus.active): the TrainJob runs once that pod does, not before."""
    monkeypatch.setattr(watch, "EXPLAIN_SECONDS", 0.2)
    full = "0/3 nodes are available: 3 Insufficient cpu. preemption: 0/3 nodes are available."
    double, flags = api(max_watch_seconds=0.3, lifecycle=trainjob_launcher_unschedulable(full))
    assert run(capsys, "submit", str(job_spec), "--api", "trainjob", *flags)[0] == 0
    deadline = time.monotonic() + 10
    while not double.launcher_pods(NS, "digits", TRAINJOBS) and time.monotonic() < deadline:
        time.sleep(0.02)
    launcher = double.launcher_pods(NS, "digits", TRAINJOBS)[0]["metadata"]["name"]
    code, out, _ = run(capsys, "status", "digits", "--api", "trainjob", *flags)
    assert (code, out) == (0, ["TrainJob team/digits: Created", "  no conditions yet",
                               "  child Jobs: launcher 1 active; node 1 active"])

    delete_once_said(double, monkeypatch, f"waiting: pod {launcher} is unschedulable", "digits", TRAINJOBS)
    code = watch.wait_for_job(connect(flags[1]), NS, "digits", follow_logs=False, kind=kube.TRAINJOB)
    out = capsys.readouterr().out.splitlines()
    assert code == 1
    assert [line for line in out if "waiting:" in line] == [
        f"trainjob/digits: waiting: pod {launcher} is unschedulable: {full}"]


def test_trainjob_runtime_rights_missing_says_what_to_ask_for(api, job_spec, capsys):
    """Kubeflow's kubeflow-edit role lets profile users create TrainJobs but only read TrainingRuntimes."""
    _, flags = api(forbidden=[("create", "trainingruntimes")])
    code, _, err = run(capsys, "submit", str(job_spec), "--api", "trainjob", *flags)
    assert code == 2 and 'you may not create trainingruntimes.trainer.kubeflow.org "hvdk8s-digits" in namespace "team"' in err
    assert "ask an admin to grant create, get, update and delete on trainingruntimes.trainer.kubeflow.org" in err


def test_trainjob_without_trainer_installed_says_how_to_install_it(api, job_spec, capsys):
    _, flags = api(trainer_installed=False)
    code, _, err = run(capsys, "submit", str(job_spec), "--api", "trainjob", *flags)
    assert code == 2 and "Kubeflow Trainer is not installed" in err and kubeerrors.INSTALL_TRAINER in err
    code, _, err = run(capsys, "status", "digits", "--api", "trainjob", *flags)
    assert code == 2 and "Kubeflow Trainer is not installed" in err


# ---------------------------------------------------------------- names, namespaces and servers no request may trust

DNS1035 = "is not a DNS-1035 label (lowercase letters, digits and '-', starting with a letter)"
DNS1123 = "is not a DNS-1123 label (lowercase letters, digits and '-', starting with a letter or digit)"
LONG = "a" * 55  # Trainer's limit is 63, the MPI Operator's (55 + "-worker-0" = 64) 54


@pytest.mark.parametrize("command", ["status", "logs", "delete"])
@pytest.mark.parametrize("name, api_kind, problem", [
    ("", "mpijob", "it is empty"),
    ("../x", "mpijob", f"it {DNS1035}"),
    ("a/b", "mpijob", f"it {DNS1035}"),
    ("Pi", "mpijob", f"it {DNS1035}"),
    ("pi.v2", "mpijob", f"it {DNS1035}"),  # a DNS-1123 subdomain the API server takes, the operator does not
    (LONG, "mpijob", f"its pod hostname '{LONG}-worker-0' is 64 characters; a DNS-1035 label has at most 63 "
                     "(shorten the name)"),
    ("", "trainjob", "it is empty"),
    ("9digits", "trainjob", f"it {DNS1035}"),
    ("a" * 64, "trainjob", "it is 64 characters; a DNS-1035 label has at most 63 (shorten the name)"),
], ids=["empty", "dotdot", "slash", "upper", "dotted", "long", "trainjob-empty", "trainjob-digit", "trainjob-long"])
def test_a_name_no_job_can_have_is_refused_before_any_request(api, capsys, command, name, api_kind, problem):
    """The sweep's finding 1: ``delete ""`` sent ``DELETE .../mpijobs/`` (on a real server a delete of every MPIJob
    in the namespace) and said "deletion requested"; ``status ""`` printed the collection as ``MPIJobList ?/?``."""
    double, flags = api()
    code, out, err = run(capsys, command, name, "--api", api_kind, *flags)
    kind = "MPIJob" if api_kind == "mpijob" else "TrainJob"
    shown = '""' if not name else f'"{name}"'
    assert (code, out, err) == (2, [], f"hvdk8s {command}: error: NAME: {shown} is not a valid {kind} name: "
                                       f"{problem}\n")
    assert double.requests == []


def test_each_kind_has_its_controllers_name_rule(api, capsys):
    """A 55-character name is a TrainJob's (Trainer: at most 63) but no MPIJob's: asked for, not refused."""
    double, flags = api()
    code, _, err = run(capsys, "status", LONG, "--api", "trainjob", *flags)
    assert (code, err) == (2, f'hvdk8s status: error: trainjobs.trainer.kubeflow.org "{LONG}" not found in namespace '
                              f'"team" (list them: kubectl get trainjobs -n team)\n')
    assert [p for _, p, _ in double.requests] == [
        f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/team/trainjobs/{LONG}"]


def test_delete_without_a_name_deletes_nothing_at_any_layer(api, manifest, capsys):
    double, flags = api()
    assert run(capsys, "submit", str(manifest), *flags)[0] == 0
    code, out, err = run(capsys, "delete", "", "--wait", *flags)
    assert (code, out) == (2, []) and "deletion requested" not in err
    assert double.job(NS, "pi") is not None
    # below the CLI, the functions that build the calls refuse a name or namespace that would change the path
    cluster = connect(flags[1])
    runtime = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "metadata": {"name": ""}}
    for call, said in [
        (lambda: kube.delete_job(cluster, NS, ""), "no request sent: the mpijobs.kubeflow.org name '' is empty"),
        (lambda: kube.delete_job(cluster, NS, "../pi"),
         "no request sent: the mpijobs.kubeflow.org name '../pi' is not a DNS-1123 subdomain (lowercase letters, "
         "digits, '-' and '.')"),
        (lambda: kube.delete_job(cluster, "", "pi", kube.TRAINJOB), "no request sent: the namespace '' is empty"),
        (lambda: kube.delete_job(cluster, "a/b", "pi"), f"no request sent: the namespace 'a/b' {DNS1123}"),
        (lambda: kube.delete_runtime(cluster, runtime, NS),
         "no request sent: the trainingruntimes.trainer.kubeflow.org name '' is empty"),
        (lambda: kube.get_job(cluster, NS, ""), "no request sent: the mpijobs.kubeflow.org name '' is empty"),
        (lambda: list(kube.watch_job(cluster, NS, "", "1", 1)),
         "no request sent: the mpijobs.kubeflow.org name '' is empty"),
    ]:
        with pytest.raises(UserError) as refused:
            call()
        assert str(refused.value) == said
    assert [m for m, _, _ in double.requests] == ["POST"]  # the submit's create, nothing since


@pytest.mark.parametrize("namespace, problem", [
    ("", "it is empty"),
    ("../x", f"it {DNS1123}"),
    ("Team", f"it {DNS1123}"),
    ("a" * 64, "it is 64 characters; a DNS-1123 label has at most 63 (shorten the name)"),
], ids=["empty", "dotdot", "upper", "long"])
@pytest.mark.parametrize("command", ["status", "logs", "delete", "submit"])
def test_a_namespace_flag_that_names_no_namespace_is_refused_before_any_request(api, manifest, capsys, command,
                                                                                namespace, problem):
    double, flags = api()
    target = str(manifest) if command == "submit" else "pi"
    code, out, err = run(capsys, command, target, "-n", namespace, *flags)
    shown = f'"{namespace}"'
    assert (code, out, err) == (2, [], f"hvdk8s {command}: error: -n/--namespace: {shown} is not a valid namespace: "
                                       f"{problem}\n")
    assert double.requests == []


def test_the_namespace_used_is_checked_wherever_it_comes_from(api, tmp_path, capsys):
    double, flags = api(namespace="Team")  # the kubeconfig context's
    code, _, err = run(capsys, "status", "pi", *flags)
    assert (code, err) == (2, "hvdk8s status: error: the context's namespace (kubeconfig, or the pod's service "
                              f'account): "Team" is not a valid namespace: it {DNS1123}\n')
    assert double.requests == []
    assert run(capsys, "status", "pi", "-n", NS, *flags)[0] == 2 and len(double.requests) == 1  # not used: not checked
    path = tmp_path / "pi.yaml"
    path.write_text(yaml.safe_dump(PI | {"metadata": {"name": "pi", "namespace": "../x"}}))
    code, _, err = run(capsys, "submit", str(path), "-n", NS, *flags)
    assert (code, err) == (2, 'hvdk8s submit: error: metadata.namespace: "../x" is not a valid namespace: '
                              f"it {DNS1123}\n")
    assert len(double.requests) == 1


def not_kubernetes(double: KubeDouble, what: str) -> str:
    return (f"the server at {double.url} did not answer as a Kubernetes API server: {what}. Is this the right "
            "kubeconfig context, and its server URL (path included) the cluster's API server? Check with: kubectl "
            "cluster-info (choose one with --kubeconfig/--context)")


PAGE_SAID = ('it answered 200 with text/html content: "<!DOCTYPE html> <html><head><title>Sign in</title></head> '
             '<body>Please sign in</..."')
LIST_SAID = 'it answered 200 with JSON that is not a Kubernetes object (no kind and apiVersion): "[1, 2, 3]"'


@pytest.mark.parametrize("foreign, said", [(HTML_PAGE, PAGE_SAID), (JSON_LIST, LIST_SAID)], ids=["page", "list"])
@pytest.mark.parametrize("command", ["status", "logs", "delete", "submit", "submit-dry-run"])
def test_a_server_that_is_no_kubernetes_api_server_is_named_in_one_line(api, manifest, capsys, command, foreign, said):
    """The sweep's finding 2: a kubeconfig whose server answers 200 with a web page or other JSON made ``status``
    and ``submit`` crash, ``logs`` fail with pydantic's ValidationError and ``delete`` report success."""
    double, flags = api(foreign=foreign)
    argv = {"submit": ["submit", str(manifest)], "submit-dry-run": ["submit", str(manifest), "--dry-run=server"]}.get(
        command, [command, "pi"])
    code, out, err = run(capsys, *argv, *flags)
    assert (code, out, err) == (2, [], f"hvdk8s {argv[0]}: error: {not_kubernetes(double, said)}\n")
    assert len(double.requests) == 1  # its first answer gives it away


def test_a_typed_answer_that_is_no_kubernetes_object_is_named_too(api, manifest, capsys):
    """The pod list (a typed call: the client's pydantic models) answered by a page: ``logs`` said ValidationError."""
    double, flags = api()
    assert run(capsys, "submit", str(manifest), *flags)[0] == 0
    double.foreign = Foreign(HTML_PAGE.content_type, HTML_PAGE.body, frozenset({"list"}))
    code, _, err = run(capsys, "logs", "pi", *flags)
    assert (code, err) == (2, f"hvdk8s logs: error: {not_kubernetes(double, PAGE_SAID)}\n")
    assert double.requests[-1][1] == f"/api/v1/namespaces/{NS}/pods"


WATCHED = 'watch mpijobs.kubeflow.org "pi" in namespace "team"'


def watches(double: KubeDouble) -> int:
    return sum(1 for _, path, query in double.requests if path == WATCH and query.get("watch") == "true")


@pytest.mark.parametrize("foreign, line", [
    (HTML_PAGE, '"<!DOCTYPE html>"'),
    (JSON_LIST, '"[1, 2, 3]"'),
    (Foreign("text/html", b"<html><body>Please sign in</body></html>"), '"<html><body>Please sign in</body></html>"'),
], ids=["page", "list", "page-without-newline"])
def test_a_watch_answered_by_something_else_is_named_too(api, manifest, capsys, foreign, line):
    """A body without a final newline was dropped whole by the client, and the wait watched again and again."""
    double, flags = api()
    double.foreign = Foreign(foreign.content_type, foreign.body, frozenset({"watch"}))
    code, out, err = run(capsys, "submit", str(manifest), "--wait", *flags)
    assert code == 2 and out == ["mpijob.kubeflow.org/pi created in namespace team"]
    said = f"it answered {WATCHED} with a line that is not a watch event: {line}"
    assert err == f"hvdk8s submit: error: {not_kubernetes(double, said)}\n"
    assert watches(double) == 1


def test_a_last_watch_event_without_a_newline_is_read(api, manifest, capsys):
    """client-go decodes a stream of JSON objects, not of lines: an event the body ends without a newline counts."""
    double, flags = api()
    done = {"metadata": {"name": "pi", "namespace": NS, "resourceVersion": "999"}, "status": {"conditions": [
        {"type": "Succeeded", "status": "True", "reason": "MPIJobSucceeded", "message": "MPIJob team/pi done."}]}}
    body = b'{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "998"}}}\n' + json.dumps(
        {"type": "MODIFIED", "object": done}).encode()
    double.foreign = Foreign("application/json", body, frozenset({"watch"}))
    code, out, err = run(capsys, "submit", str(manifest), "--wait", *flags)
    assert (code, err) == (0, "")
    assert status_lines(out) == ["Succeeded: MPIJob team/pi done. [MPIJobSucceeded]"]
    assert watches(double) == 1


def test_watches_that_end_at_once_with_nothing_are_tried_a_few_times_then_said(api, manifest, capsys, monkeypatch):
    """An empty 200 to every watch made the wait watch again at once, forever (hundreds of requests a second)."""
    monkeypatch.setattr(watch, "SHORT_WATCH_WAITS", (0.01, 0.02, 0.04))
    double, flags = api()
    double.foreign = Foreign("application/json", b"", frozenset({"watch"}))
    code, out, err = run(capsys, "submit", str(manifest), "--wait", *flags)
    assert code == 2 and out == ["mpijob.kubeflow.org/pi created in namespace team"]
    assert err == (f"hvdk8s submit: error: could not {WATCHED}: the server at {double.url} ended the watch 4 times in "
                   "a row as soon as it began, without a change of the job, where a Kubernetes API server keeps a watch "
                   "open until its timeout. Is the kubeconfig's server the cluster's API server, with no proxy "
                   "between that cuts streams? Check with: kubectl get mpijobs.kubeflow.org pi -n team --watch\n")
    assert watches(double) == 4


PROXY_404 = Foreign("text/html", b"<html><head><title>404 Not Found</title></head><body>nginx</body></html>\n",
                    status=404)


@pytest.mark.parametrize("argv, asked", [
    (["status", "pi"], 'get mpijobs.kubeflow.org "pi" in namespace "team"'),
    (["delete", "pi"], 'delete mpijobs.kubeflow.org "pi" in namespace "team"'),
    (["submit", "MANIFEST"], 'create mpijobs.kubeflow.org "pi" in namespace "team"'),
    (["submit", "JOB_SPEC", "--api", "trainjob"], 'get trainjobs.trainer.kubeflow.org "digits" in namespace "team"'),
], ids=["status", "delete", "submit", "submit-trainjob"])
def test_a_404_page_that_is_no_kubernetes_status_names_the_server_not_the_operator(api, manifest, job_spec, capsys,
                                                                                 argv, asked):
    """Only the API server's own "404 page not found" means no CRD serves the kind; a proxy's page is no answer
    of the API server at all (the kubeconfig's server URL, or its path, is not the API server's)."""
    double, flags = api(foreign=PROXY_404)
    argv = [{"MANIFEST": str(manifest), "JOB_SPEC": str(job_spec)}.get(arg, arg) for arg in argv]
    code, out, err = run(capsys, *argv, *flags)
    said = (f"it answered {asked} with 404 and text/html content that is not a Kubernetes Status: "
            '"<html><head><title>404 Not Found</title></head><body>nginx</body></html>"')
    assert (code, out, err) == (2, [], f"hvdk8s {argv[0]}: error: {not_kubernetes(double, said)}\n")
    assert len(double.requests) == 1  # a TrainJob's runtime is not written after its name check got the page


def test_a_followed_log_keeps_its_last_line_without_a_newline(api):
    """The client's line splitter dropped a followed log's last line when no newline ended it (a process that died
    mid-line); kubectl logs -f prints it, as does the log read whole."""
    double, flags = api()
    double.foreign = Foreign("text/plain", b"epoch 1\n\nTraceback: killed", frozenset({"get"}))
    pod = kube.LauncherPod("pi-launcher", "uid-1", "Running", "mpi-launcher")
    cluster = connect(flags[1])
    for follow in (True, False):
        assert list(kube.log_lines(cluster, NS, pod, follow=follow)) == ["epoch 1", "", "Traceback: killed"]


def test_every_caller_of_connect_gets_the_check(api):
    """``pipeline submit`` creates its Workflow through ``connect()``'s client too (it crashed on the create's None)."""
    from hvdk8s.pipeline import submit as pipeline_submit

    double, flags = api(foreign=HTML_PAGE)
    workflow = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "metadata": {"name": "w"}, "spec": {}}
    with pytest.raises(UserError) as refused:
        pipeline_submit.create(connect(flags[1]), workflow, NS)
    assert str(refused.value) == not_kubernetes(double, PAGE_SAID)


def test_creating_in_a_namespace_that_does_not_exist_says_so(api, manifest, job_spec, capsys):
    """The sweep's finding 3: NamespaceLifecycle's ``namespaces "nope" not found`` was reported as the job not found."""
    double, flags = api(namespaces={NS})
    for extra in ([], ["--dry-run=server"]):
        code, out, err = run(capsys, "submit", str(manifest), "-n", "nope", *extra, *flags)
        assert (code, out, err) == (2, [], 'hvdk8s submit: error: could not create mpijobs.kubeflow.org "pi" in '
                                           'namespace "nope": namespace "nope" does not exist. Create it (kubectl '
                                           "create namespace nope) or choose an existing one (kubectl get namespaces) "
                                           "with -n/--namespace\n")
    code, _, err = run(capsys, "submit", str(job_spec), "--api", "trainjob", "-n", "nope", *flags)
    assert code == 2 and err.startswith('hvdk8s submit: error: could not create trainingruntimes.trainer.kubeflow.org '
                                        '"hvdk8s-digits" in namespace "nope": namespace "nope" does not exist.')
    assert double.jobs == {}
    assert run(capsys, "submit", str(manifest), *flags)[0] == 0  # the namespace that exists still takes it
