"""The rendered Workflow run through a model of Argo Workflows v4.1.2 (``argo_model``, from Argo's
source): every wait bounded, runs named apart and cleaned up by owner, no Istio sidecar in any step.

The MPIJob statuses are the MPI Operator v0.8.2's (github.com/kubeflow/mpi-operator, commit caa3c47,
``pkg/controller/mpi_job_controller.go``): ``syncHandler`` sets the Created condition first;
``updateMPIJobStatus`` writes the Worker counts from the start but the Launcher entry only once the
launcher Job exists, which under ``WaitForWorkersReady`` ``syncHandler`` creates only when every worker
pod is Ready; the launcher's success sets ``succeeded: 1``, the Succeeded condition and the Job's
``completionTime``; its failure (the launcher Job's Failed condition: backoffLimit reached or
activeDeadlineSeconds passed) ``updateMPIJobFailedStatus``: the Failed condition, with the Job's reason,
and ``completionTime``; ``failed`` is always the launcher Job's failed pod count. Running turns False at
the end (``filterOutCondition``). No Argo controller or cluster runs here.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import yaml

from hvdk8s.mpijob.files import SpecError
from hvdk8s.mpijob.validation import check_manifest
from hvdk8s.pipeline import build, load_pipeline, rbac, render_workflow
from hvdk8s.pipeline.load import from_data

from argo_model import DEADLINE_MESSAGE, DELETED_MESSAGE, Cluster, Node, Run, match_conditions, parse_selector
from test_pipeline import EXAMPLE, minimal

pytestmark = pytest.mark.unit

ISTIO = "sidecar.istio.io/inject"


CREATED = {"type": "Created", "status": "True", "reason": "MPIJobCreated"}
RUNNING = {"type": "Running", "status": "True", "reason": "MPIJobRunning"}
SUCCEEDED = {"type": "Succeeded", "status": "True", "reason": "MPIJobSucceeded"}
COMPLETION_TIME = "2026-01-01T12:00:00Z"
LAUNCHER_FAILED = "failure condition 'status.replicaStatuses.Launcher.succeeded != 1' evaluated true"


def failed(reason: str, launcher_failed: int) -> tuple[dict[str, str], dict[str, int]]:
    """The Failed condition the operator copies from the launcher Job, and the Launcher entry it writes:
    ``failed`` is the Job's failed pod count, left out when 0 (``omitempty``)."""
    return {"type": "Failed", "status": "True", "reason": reason}, {"failed": launcher_failed} if launcher_failed else {}


def operator(launcher_after: float | None, ends_after: float | None = None,
             outcome: tuple[dict[str, str], dict[str, int]] = (SUCCEEDED, {"succeeded": 1}), workers: int = 2,
             running: dict[str, int] | None = None):
    """The MPIJob's status ``age`` seconds after creation: its launcher created at ``launcher_after``
    (None: some worker never gets Ready), ending at ``ends_after`` with ``outcome`` (its terminal
    condition and Launcher entry); ``running``: the Launcher entry until then."""
    def status(obj: dict[str, Any], age: float) -> dict[str, Any]:
        if obj["kind"] != "MPIJob":
            return {}
        if launcher_after is None or age < launcher_after:
            return {"conditions": [CREATED], "replicaStatuses": {"Worker": {}}}
        if ends_after is None or age < ends_after:
            return {"conditions": [CREATED, RUNNING],
                    "replicaStatuses": {"Launcher": running or {"active": 1}, "Worker": {"active": workers}}}
        end, launcher = outcome
        return {"conditions": [CREATED, {**RUNNING, "status": "False"}, end], "completionTime": COMPLETION_TIME,
                "replicaStatuses": {"Launcher": launcher, "Worker": {}}}
    return status


def workflow_of(pipeline_data: dict[str, Any] | None = None, tmp_path=None) -> dict[str, Any]:
    pipeline = load_pipeline(EXAMPLE) if pipeline_data is None else from_data(pipeline_data, "p.yaml", tmp_path)
    return render_workflow(build(pipeline))


def launcher_container(mpijob: dict[str, Any]) -> dict[str, Any]:
    return mpijob["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]


# ------------------------------------------------------------------ the model's own rules


@pytest.mark.parametrize("condition, obj, verdict", [
    ("status.replicaStatuses.Launcher", {"status": {"replicaStatuses": {"Launcher": {}}}}, True),  # exists
    ("status.replicaStatuses.Launcher", {"status": {"replicaStatuses": {"Worker": {}}}}, False),
    ("status.a > 0", {"status": {"a": 2}}, True),
    ("status.a > 0", {"status": {"a": "x"}}, False),  # not an integer: no match
    ("status.a > 0", {}, False),
    ("status.a != x", {}, True),  # a missing key is "not x"
    ("status.phase == Loaded", {"status": {"phase": "Loaded"}}, True),
    ("status.conditions.0.type == Ready", {"status": {"conditions": [{"type": "Ready"}]}}, True),
])
def test_label_selectors_over_gjson_paths(condition, obj, verdict):
    (requirement,) = parse_selector(condition)
    assert requirement.matches(obj) is verdict


def test_conditions_are_judged_like_matchConditions():
    with pytest.raises(ValueError, match="not a qualified name"):
        parse_selector("status.conditions[0].type == Ready")
    with pytest.raises(ValueError, match="must be an integer"):
        parse_selector("status.a > b")
    running = {"status": {"a": 1, "b": 0}}
    assert match_conditions(running, None, "status.b > 0") == "Succeeded"  # only a failure condition: done at once
    assert match_conditions(running, "status.a > 0,status.b > 0", None) is None  # all must match
    assert match_conditions(running, "status.a > 0", "status.c > 0,status.a > 0") == "Failed"  # any one fails it


# ------------------------------------------------------------------ item 2: every wait is bounded


def test_a_candidate_trains_under_its_runs_name_owned_by_the_workflow():
    cluster = Cluster(status=operator(launcher_after=120, ends_after=900))
    run = Run(workflow_of(), cluster, "bcdfg")
    assert run.name == "digits-bcdfg"
    assert run.run("train-cnn") == Node("Succeeded", "", 900)
    mpijob = cluster.objects[("MPIJob", "digits-bcdfg-cnn")]
    assert mpijob["metadata"]["ownerReferences"] == [{
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "name": "digits-bcdfg", "uid": run.uid,
        "controller": True, "blockOwnerDeletion": True}]
    assert mpijob["metadata"]["labels"]["app.kubernetes.io/instance"] == "digits-bcdfg-cnn"
    container = launcher_container(mpijob)
    assert {"name": "HVDK8S_JOB_NAME", "value": "digits-bcdfg-cnn"} in container["env"]
    assert container["command"][-2:] == ["--save", "/shared/digits/runs/digits-bcdfg/candidates/cnn.keras"]
    assert check_manifest(mpijob) == []  # the operator's own rules, on the object Argo created


@pytest.mark.parametrize("scenario, deadlines, expected", [
    # a worker unschedulable, stuck pulling its image or crash-looping: no launcher, ever
    ("no launcher", {}, Node("Failed", DEADLINE_MESSAGE, 30 * 60)),
    ("no launcher", {"launcherMinutes": 5}, Node("Failed", DEADLINE_MESSAGE, 5 * 60)),
    ("training never ends", {"trainMinutes": 60}, Node("Failed", DEADLINE_MESSAGE, 60 + 60 * 60)),
    ("training never ends", {}, Node("Failed", DEADLINE_MESSAGE, 60 + 720 * 60)),
    ("launcher fails", {}, Node("Failed", LAUNCHER_FAILED, 600)),
])
def test_every_train_wait_ends(tmp_path, scenario, deadlines, expected):
    status = {"no launcher": operator(None), "training never ends": operator(60),
              "launcher fails": operator(60, 600, failed("BackoffLimitExceeded", 1))}[scenario]
    data = yaml.safe_load(EXAMPLE.read_text()) | ({"deadlines": deadlines} if deadlines else {})
    run = Run(workflow_of(data, tmp_path), Cluster(status=status))
    assert run.run("train-cnn") == expected
    assert run.exit_handler(expected.finished_at).phase == "Succeeded"
    assert run.cluster.names("MPIJob") == set()  # nothing left running


def with_backoff_limit(limit: int) -> dict[str, Any]:
    """The example's Workflow, its first candidate (cnn) given ``runPolicy.backoffLimit: limit``."""
    pipeline = load_pipeline(EXAMPLE)
    first, *others = pipeline.candidates
    job = dataclasses.replace(first.job, run_policy=dataclasses.replace(first.job.run_policy, backoff_limit=limit))
    return render_workflow(build(dataclasses.replace(pipeline, candidates=(dataclasses.replace(first, job=job),
                                                                           *others))))


@pytest.mark.parametrize("backoff_limit, outcome", [
    # restartPolicy OnFailure, the launcher's default: Kubernetes counts container restarts against
    # backoffLimit, then deletes the one pod: the Job's failed count ends at 0 (kubernetes/kubernetes#95433) or 1
    (0, failed("BackoffLimitExceeded", 0)),
    (2, failed("BackoffLimitExceeded", 1)),
    (2, failed("BackoffLimitExceeded", 0)),
    # runPolicy.activeDeadlineSeconds passed: the Job controller ends the running pod
    (0, failed("DeadlineExceeded", 0)),
    (2, failed("DeadlineExceeded", 1)),
])
def test_a_launcher_that_failed_for_good_fails_its_candidate_when_it_ends(backoff_limit, outcome):
    # restarting in its one pod until then (OnFailure): active, no failed pod
    run = Run(with_backoff_limit(backoff_limit), Cluster(status=operator(60, 600, outcome)))
    assert run.run("train-cnn") == Node("Failed", LAUNCHER_FAILED, 600)


def test_a_launcher_still_retrying_is_not_a_failure():
    # restartPolicy Never, backoffLimit 2: a failed pod, a new one running, then success
    status = operator(60, 900, running={"active": 1, "failed": 1})
    assert Run(with_backoff_limit(2), Cluster(status=status)).run("train-cnn") == Node("Succeeded", "", 900)


def test_a_deleted_mpijob_fails_its_wait():
    cluster = Cluster(status=operator(60))
    run = Run(workflow_of(), cluster)
    assert run.run("launch-cnn") == Node("Succeeded", "", 60)
    cluster.gone_after[("MPIJob", f"{run.name}-cnn")] = 300  # someone deletes it while the step waits
    assert run.run("wait-cnn", 60) == Node("Failed", DELETED_MESSAGE, 300)
    del cluster.objects[("MPIJob", f"{run.name}-cnn")]
    assert run.run("wait-cnn", 400) == Node("Failed", 'Error from server (NotFound): mpijobs "digits-bcdfg-cnn" '
                                                      "not found", 400)


def test_deadlines_are_checked_in_the_pipeline_file(tmp_path):
    with pytest.raises(SpecError) as caught:
        from_data(minimal(deadlines={"launcherMinutes": 0, "deployMinutes": -1}), "p.yaml", tmp_path)
    assert caught.value.errors == ["deadlines.launcherMinutes: must be >= 1, got 0",
                                   "deadlines.deployMinutes: must be >= 1, got -1"]


# ------------------------------------------------------------------ item 3: runs apart, cleaned up by owner


def test_overlapping_runs_do_not_collide_and_clean_up_only_their_own():
    cluster = Cluster(status=operator(60, 600))
    workflow = workflow_of()
    first, second = Run(workflow, cluster, "bcdfg"), Run(workflow, cluster, "hjklm")
    candidates = [c.name for c in load_pipeline(EXAMPLE).candidates]
    for run in (first, second):
        for c in candidates:
            assert run.run(f"train-{c}").phase == "Succeeded", (run.name, c)
    assert cluster.names("MPIJob") == {f"{r.name}-{c}" for r in (first, second) for c in candidates}
    assert first.exit_handler(700).phase == "Succeeded"
    assert cluster.names("MPIJob") == {f"digits-hjklm-{c}" for c in candidates}
    second.delete()  # kubectl delete workflow: the garbage collector follows the owner references
    assert cluster.names("MPIJob") == set() and cluster.names("Workflow") == {"digits-bcdfg"}


def test_names_fit_kubernetes_limits_at_the_longest_run_name(tmp_path):
    name = "p" * 40  # the longest pipeline name; its runs are named p...p-XXXXX (46 characters)
    # <run>-<candidate>-worker-1, the operator's longest pod hostname, is 63 characters: the limit
    data = minimal(name=name, candidates=[{"name": "c" * 7, "job": {"command": ["python", "t.py"]}}])
    run = Run(workflow_of(data, tmp_path), Cluster(status=operator(60, 600)), "zzzzz")
    assert run.run(f"train-{'c' * 7}").phase == "Succeeded"
    (mpijob,) = [o for (kind, _), o in run.cluster.objects.items() if kind == "MPIJob"]
    assert check_manifest(mpijob) == []
    assert len(f"{mpijob['metadata']['name']}-worker-1") == len(f"{mpijob['metadata']['name']}-launcher") == 63
    data = minimal(name=name, candidates=[{"name": "c" * 8, "job": {"command": ["python", "t.py"]}}])
    with pytest.raises(SpecError) as caught:
        from_data(data, "p.yaml", tmp_path)
    assert caught.value.errors == [(
        f"candidates[0].name: pod hostname '{name}-xxxxx-cccccccc-worker-1' is 64 characters; a DNS-1035 label "
        "has at most 63 (shorten the name): each Workflow run names this MPIJob <workflow name>-cccccccc, the "
        f"workflow name being '{name}-' and 5 random characters; shorten the pipeline's or the candidate's name")]


# ------------------------------------------------------------------ item 7: no sidecar in any step pod


@pytest.mark.parametrize("kserve", [False, True], ids=["tfserving", "kserve"])
def test_every_pod_the_workflow_runs_opts_out_of_istio_sidecars(kserve):
    pipeline = load_pipeline(EXAMPLE)
    pipeline = dataclasses.replace(pipeline, serving=dataclasses.replace(pipeline.serving, kserve=kserve))
    run = Run(render_workflow(build(pipeline)), Cluster())
    pods = [run.pod(t) for t in run.leaf_templates()]
    assert {p.name.removeprefix(f"{run.name}-") for p in pods} >= {
        "ingest", "launch-cnn", "wait-cnn", "select", "loadtest", "delete-cnn"}
    assert all(p.labels.get(ISTIO) == "false" and ISTIO not in p.annotations for p in pods)
    # so Argo never kills an injected sidecar, and its Role need not allow pods/exec
    role = rbac(pipeline)[1]
    assert not any("pods/exec" in rule["resources"] for rule in role["rules"])
