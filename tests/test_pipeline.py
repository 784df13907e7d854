"""``hvdk8s pipeline``: the strict pipeline file, the one DAG, the Argo Workflow and its embedded
objects against the REAL CRDs in ../shared/schemas, and a real local run with a broken candidate.

No Argo controller runs here: the Workflow is checked against the Argo CRD's full schema and its
``depends`` expressions are read back into the DAG's edges; the MPIJob success/failure conditions
are run through a model of Argo in ``tests/test_pipeline_argo.py``.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import numpy as np
import pytest
import yaml

from hvdk8s.cli import main
from hvdk8s.mpijob.files import SpecError
from hvdk8s.pipeline import argo, build, dag as d, load_pipeline, local, rbac, render_workflow
from hvdk8s.pipeline.load import from_data
from hvdk8s.serving.kube.options import TF_SERVING_VERSION

from conftest import REPO, shared
from test_mpijob_schema import crd_errors as mpijob_crd_errors
from test_serving_manifests import KSERVE_CRD, crd_validator

EXAMPLE = REPO / "pipeline" / "examples" / "digits.yaml"
KUBE_VERSION = kubernetes_validate.latest_version()
TRAIN = str(REPO / "examples" / "train_digits.py")


@functools.cache
def argo_validator():
    return crd_validator(shared("schemas/argoproj.io_workflows.yaml"), "v1alpha1")


def argo_errors(workflow: dict[str, Any]) -> list[str]:
    """The Argo CRD's verdict, strict: fields the API server would silently prune are errors too."""
    return sorted(f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in argo_validator().iter_errors(workflow))


def minimal(**changes: Any) -> dict[str, Any]:
    data = {
        "name": "tiny", "image": "img:1", "sharedVolume": {"claimName": "shared"},
        "candidates": [{"name": "cnn", "job": {"command": ["python", TRAIN, "--epochs", 1]}}],
        "serving": {"modelName": "digits"},
    }
    return data | changes


def templates(workflow: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in workflow["spec"]["templates"]}


# ------------------------------------------------------------------ the pipeline file


def test_example_pipeline_loads_with_three_candidates():
    pipeline = load_pipeline(EXAMPLE)
    assert [c.name for c in pipeline.candidates] == ["cnn", "cnn-dropout", "cnn-bn"]
    job = pipeline.candidates[0].job
    assert (job.name, job.image, job.np, job.shared_volume.claim_name) == (
        "digits-cnn", pipeline.image, 2, "hvdk8s-shared")
    assert pipeline.load_test.max_error_rate == 0.01 and pipeline.load_test.max_p99_ms == 1000.0


def test_every_problem_is_reported_at_once_with_its_field_path(tmp_path):
    data = minimal(
        nmae="x",
        data={"source": "folder"},
        candidates=[
            {"name": "cnn", "job": {"command": ["python", "t.py"], "workerz": 2, "name": "mine"}},
            {"name": "cnn", "jobFile": "job.yaml", "job": {"command": ["x"]}},
            {"name": "gpu", "job": {"command": ["python", "t.py"], "gpu": True, "slotsPerWorker": 2,
                                    "workers": 0}},
        ],
        serving={"modelName": "digits", "autoscaling": {"minReplicas": 0}},
        loadTest={"maxErrorRate": 2, "maxP99Ms": "fast"},
        local={"ranks": "two"},
        sharedVolume={"claimName": "shared", "readOnly": True},
    )
    with pytest.raises(SpecError) as caught:
        from_data(data, "p.yaml", tmp_path)
    # Every section is checked (issue #28): the candidates' jobs and the serving options too.
    assert caught.value.errors == [
        "nmae: unknown field (did you mean 'name'?)",
        "local.ranks: must be an integer, got string 'two'",
        "candidates[1].name: 'cnn' is used by another candidate",
        "candidates[1]: give exactly one of job (an inline job spec) or jobFile",
        "sharedVolume.readOnly: must be false: the steps write candidates and serving versions to it",
        "data.source: 'folder' is not one of digits, imageFolder, tfds",
        "loadTest.maxP99Ms: must be a number, got 'fast'",
        "loadTest.maxErrorRate: must be between 0 and 1, got 2",
        ("candidates[0].job.name: set by the pipeline (each Workflow run's <workflow name>-<candidate>); "
         "remove it here"),
        "candidates[0].job.workerz: unknown field (did you mean 'workers'?)",
        "candidates[2].job.workers: must be >= 1, got 0",
        "serving.autoscaling.minReplicas: 0 must be at least 1 (only KServe scales to zero)",
    ]
    # A required field missing or refused: the rest is still checked, what derives from it is not.
    data = minimal(candidates=[{"name": "cnn", "job": {"command": ["python", "t.py"], "workers": 0}}],
                   serving={"modelName": "digits", "autoscaling": {"minReplicas": 0}}, name="Bad_Name",
                   sharedVolume={"claimNme": "shared"})
    del data["image"]
    with pytest.raises(SpecError) as caught:
        from_data(data, "p.yaml", tmp_path)
    assert caught.value.errors == [
        "sharedVolume.claimNme: unknown field (did you mean 'claimName'?)",
        "sharedVolume.claimName: required",
        "image: required",
        "name: 'Bad_Name' is not a DNS-1035 label (lowercase letters, digits and '-', starting with a letter)",
        "candidates[0].job.workers: must be >= 1, got 0",
        "serving.autoscaling.minReplicas: 0 must be at least 1 (only KServe scales to zero)",
    ]


def test_every_serving_problem_is_reported_under_serving_in_the_files_keys(tmp_path):
    # The serving options' own validator, run under the prefix "serving" with the file's spelling:
    # all its problems, other options named as the file names them too (modelName for the options' name).
    data = minimal(serving={
        "modelName": "m" * 60, "kserve": True, "tfServingVersion": "latest", "loggerMode": "some",
        "resources": {"memoryRequest": "4Gi"},
        "autoscaling": {"minReplicas": 3, "maxReplicas": 2, "scaleMetric": "gpu"},
        "batching": {"numBatchThreads": 0},
    })
    with pytest.raises(SpecError) as caught:
        from_data(data, "p.yaml", tmp_path)
    assert caught.value.errors == [
        f"serving.modelName: {'m' * 60!r} is 60 characters; at most 53 fit here (shorten the name) "
        "(KServe adds '-predictor' to it)",
        "serving.resources.memoryLimit: '2Gi' is below serving.resources.memoryRequest ('4Gi'); "
        "Kubernetes rejects such a pod",
        "serving.autoscaling.maxReplicas: 2 must be at least 1 and at least serving.autoscaling.minReplicas (3)",
        "serving.autoscaling.scaleMetric: 'gpu' is not one of cpu, memory, concurrency, rps",
        "serving.batching.numBatchThreads: 0 must be at least 1",
        "serving.loggerMode: 'some' is not one of all, request, response",
        f"serving.tfServingVersion: 'latest' is not a release number like {TF_SERVING_VERSION}",
    ]


def test_a_candidate_job_that_is_an_mpijob_is_reported_at_its_path(tmp_path):
    data = minimal(candidates=[{"name": "cnn", "job": {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob"}}])
    with pytest.raises(SpecError) as caught:
        from_data(data, "p.yaml", tmp_path)
    assert caught.value.errors == ["candidates[0].job: is an MPIJob manifest, not an hvdk8s job spec"]


def test_job_file_candidates_and_the_cli_error(tmp_path, capsys):
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(
        {"name": "standalone", "image": "other:2", "command": ["python", "t.py"], "workers": 3}))
    data = minimal(candidates=[{"name": "ref", "jobFile": "job.yaml"}])
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(data))
    job = load_pipeline(tmp_path / "p.yaml").candidates[0].job
    assert (job.name, job.image, job.workers) == ("tiny-ref", "other:2", 3)  # its own image, the pipeline's name

    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(minimal(selection={"metric": "f1"})))
    assert main(["pipeline", "render", str(tmp_path / "bad.yaml")]) == 2
    assert "selection.metric: 'f1' is not one of accuracy, loss" in capsys.readouterr().err


# ------------------------------------------------------------------ one DAG, the Workflow


def workflow_edges(workflow: dict[str, Any]) -> set[tuple[str, str, bool]]:
    """(upstream, task, must have succeeded) read back from the entrypoint DAG's depends expressions."""
    edges = set()
    for task in templates(workflow)[argo.ENTRYPOINT]["dag"]["tasks"]:
        for clause in (task.get("depends") or "").split(" && "):
            if clause:
                results = set(re.findall(r"([\w-]+)\.(\w+)", clause))
                (upstream,) = {name for name, _ in results}
                phases = {phase for _, phase in results}
                assert phases in ({"Succeeded"}, {"Succeeded", "Failed", "Errored"}), clause
                edges.add((upstream, task["name"], phases == {"Succeeded"}))
    return edges


def test_workflow_has_the_dags_steps_and_dependencies():
    graph = build(load_pipeline(EXAMPLE))
    workflow = render_workflow(graph)
    tasks = templates(workflow)[argo.ENTRYPOINT]["dag"]["tasks"]
    assert [t["name"] for t in tasks] == [s.name for s in graph.steps] == [
        "ingest", "train-cnn", "train-cnn-dropout", "train-cnn-bn", "select", "deploy", "loadtest"]
    assert workflow_edges(workflow) == graph.edges()
    # select tolerates failed candidates but not a failed ingest; the rest need success
    assert ("train-cnn", "select", False) in graph.edges() and ("ingest", "select", True) in graph.edges()
    assert [[s.name for s in wave] for wave in graph.waves()] == [
        ["ingest", "train-cnn", "train-cnn-dropout", "train-cnn-bn"], ["select"], ["deploy"], ["loadtest"]]


def test_committed_example_is_what_the_cli_renders(tmp_path):
    for flags, committed in (([], "digits.workflow.yaml"), (["--rbac"], "digits.rbac.yaml")):
        out = tmp_path / committed
        assert main(["pipeline", "render", str(EXAMPLE), *flags, "-o", str(out)]) == 0
        assert out.read_text() == (EXAMPLE.parent / committed).read_text(), f"re-render {committed}"


def test_workflow_validates_against_the_argo_crd_and_a_broken_one_does_not():
    workflow = yaml.safe_load((EXAMPLE.parent / "digits.workflow.yaml").read_text())
    assert argo_errors(workflow) == []
    broken = json.loads(json.dumps(workflow))
    broken["spec"]["templates"][0]["dag"]["tasks"][0]["dependz"] = ["x"]
    broken["spec"]["templates"][1]["retryStrategy"]["limit"] = [2]
    broken["spec"]["entrypoint"] = 3
    assert argo_errors(broken) == [
        "spec.entrypoint: 3 is not of type 'string'",
        "spec.templates.0.dag.tasks.0: Additional properties are not allowed ('dependz' was unexpected)",
        "spec.templates.1.retryStrategy.limit: [2] is not valid under any of the given schemas",
    ]


def test_workflow_shape(tmp_path):
    pipeline = load_pipeline(EXAMPLE)
    workflow = render_workflow(build(pipeline))
    spec, by_name = workflow["spec"], templates(workflow)
    assert (spec["entrypoint"], spec["onExit"], spec["serviceAccountName"]) == ("pipeline", "cleanup",
                                                                                "digits-pipeline")
    assert spec["volumes"] == [{"name": "shared", "persistentVolumeClaim": {"claimName": "hvdk8s-shared"}}]
    assert by_name["train-cnn"]["steps"] == [[{"name": "launch-cnn", "template": "launch-cnn"}],
                                             [{"name": "wait-cnn", "template": "wait-cnn"}],
                                             [{"name": "result-cnn", "template": "result-cnn"}]]
    launch, wait, result = by_name["launch-cnn"], by_name["wait-cnn"], by_name["result-cnn"]
    assert not {"retryStrategy"} & (launch.keys() | wait.keys() | result.keys())  # deterministic failures: not retried
    assert (launch["activeDeadlineSeconds"], wait["activeDeadlineSeconds"]) == (30 * 60, 720 * 60)
    assert launch["resource"]["action"] == "create" and launch["resource"]["setOwnerReference"] is True
    assert launch["resource"]["successCondition"] == "status.replicaStatuses.Launcher"
    reference = {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "metadata": {"name": "{{workflow.name}}-cnn"}}
    for step in (wait, result):
        assert (step["resource"]["action"], yaml.safe_load(step["resource"]["manifest"])) == ("get", reference)
    command = yaml.safe_load(launch["resource"]["manifest"])["spec"]["mpiReplicaSpecs"]["Launcher"]["template"][
        "spec"]["containers"][0]["command"]
    assert command[-2:] == ["--save", "/shared/digits/runs/{{workflow.name}}/candidates/cnn.keras"]
    select = by_name["select"]
    assert select["container"]["command"] == [
        "hvdk8s", "select", "/shared/digits/runs/{{workflow.name}}/candidates", "--base-path",
        "/shared/digits/models/digits", "--metric", "accuracy", "--data",
        "/shared/digits/runs/{{workflow.name}}/heldout.npz", "--class-names", "0,1,2,3,4,5,6,7,8,9"]
    assert select["retryStrategy"]["retryPolicy"] == "OnError"  # pod errors only, never "no candidate finished"
    loadtest = by_name["loadtest"]["container"]["command"]
    assert loadtest[:3] == ["hvdk8s", "loadtest", "http://digits.{{workflow.namespace}}.svc.cluster.local:8501"]
    assert loadtest[-4:] == ["--max-p99-ms", "1000", "--max-error-rate", "0.01"]
    assert by_name["loadtest"]["retryStrategy"]["retryPolicy"] == "OnError"  # a missed SLO fails the workflow
    deploy = [t["name"] for t in by_name["deploy"]["dag"]["tasks"]]
    assert deploy == ["apply-configmap", "apply-deployment", "apply-service", "apply-horizontalpodautoscaler"]
    assert by_name["apply-deployment"]["resource"]["successCondition"] == "status.availableReplicas > 0"
    assert by_name["apply-deployment"]["activeDeadlineSeconds"] == 15 * 60
    cleanup = [t["name"] for t in by_name["cleanup"]["dag"]["tasks"]]
    assert cleanup == ["delete-cnn", "delete-cnn-dropout", "delete-cnn-bn"]
    delete = by_name["delete-cnn"]["resource"]
    assert (delete["action"], delete["flags"], yaml.safe_load(delete["manifest"])) == (
        "delete", ["--wait=false"], {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob",
                                     "metadata": {"name": "{{workflow.name}}-cnn"}})


def embedded(workflow: dict[str, Any]) -> list[dict[str, Any]]:
    return [yaml.safe_load(t["resource"]["manifest"]) for t in workflow["spec"]["templates"]
            if "resource" in t and t["resource"]["action"] not in ("delete", "get")]


@pytest.mark.parametrize("kserve", [False, True], ids=["tfserving", "kserve"])
def test_embedded_objects_validate_against_their_own_schemas(kserve):
    pipeline = load_pipeline(EXAMPLE)
    pipeline = dataclasses.replace(pipeline, serving=dataclasses.replace(pipeline.serving, kserve=True)) \
        if kserve else pipeline
    workflow = render_workflow(build(pipeline))
    objects = embedded(workflow)
    kinds = [o["kind"] for o in objects]
    assert kinds == ["MPIJob"] * 3 + (["ConfigMap", "InferenceService"] if kserve else
                                      ["ConfigMap", "Deployment", "Service", "HorizontalPodAutoscaler"])
    custom = {"MPIJob", "InferenceService"}
    for obj in [o for o in objects if o["kind"] not in custom] + rbac(pipeline):
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
    if kserve:
        assert objects[-1]["spec"]["predictor"]["model"]["storageUri"] == "pvc://hvdk8s-shared/digits/models/digits"
        assert templates(workflow)["apply-inferenceservice"]["resource"]["successCondition"] == \
            "status.modelStatus.states.activeModelState == Loaded"
        assert "digits-predictor" in templates(workflow)["loadtest"]["container"]["command"][2]
    # last, the custom resources against their CRDs (../shared/schemas: the test skips here where one is absent)
    assert argo_errors(workflow) == []
    assert [mpijob_crd_errors(o) for o in objects if o["kind"] == "MPIJob"] == [[]] * 3
    if kserve:
        isvc = crd_validator(shared(KSERVE_CRD), "v1beta1")
        assert sorted(e.message for e in isvc.iter_errors(objects[-1])) == []


def test_role_grants_exactly_what_the_steps_do():
    role = rbac(load_pipeline(EXAMPLE))[1]
    granted = {(group, resource, verb) for rule in role["rules"] for group in rule["apiGroups"]
               for resource in rule["resources"] for verb in rule["verbs"]}
    apply = {"get", "create", "patch"}
    assert granted == {
        ("argoproj.io", "workflowtaskresults", "create"), ("argoproj.io", "workflowtaskresults", "patch"),
        *{("kubeflow.org", "mpijobs", v) for v in ("create", "get", "delete")},
        *{("", r, v) for r in ("configmaps", "services") for v in apply},
        *{("apps", "deployments", v) for v in apply},
        *{("autoscaling", "horizontalpodautoscalers", v) for v in apply},
        ("", "pods", "get"), ("", "pods", "list"), ("", "pods/log", "get"),
    }
    assert not any("*" in rule["verbs"] or "*" in rule["resources"] for rule in role["rules"])


# ------------------------------------------------------------------ the ingest step's command line


@pytest.mark.parametrize("argv, message", [
    (["--source", "imageFolder"], "--source imageFolder needs --path"),
    (["--source", "tfds", "--path", "."], "--source tfds needs --name"),
    (["--source", "digits", "--split", "validation"], "--split 'validation': the digits have train and test"),
    (["--source", "digits", "--image-size", "0"], "argument --image-size: 0: must be positive"),
    (["--source", "digits", "--image-size", "big"], "argument --image-size: 'big': not a whole number"),
])
def test_ingest_errors_name_its_flags(tmp_path, capsys, argv, message):
    """The step runs as this command in the Workflow too, so a message names its flags, not the pipeline file's."""
    out = tmp_path / "x.npz"
    try:
        code = main(["pipeline", "ingest", *argv, "--out", str(out)])
    except SystemExit as stop:  # argparse's own errors
        code = stop.code
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not out.exists()


def test_ingest_writes_the_digits_test_split_at_the_given_size(tmp_path):
    out = tmp_path / "x.npz"
    assert main(["pipeline", "ingest", "--source", "digits", "--image-size", "12", "--out", str(out)]) == 0
    with np.load(out) as held:
        x, y = held["x"], held["y"]
    assert x.shape[1:] == (12, 12, 1) and x.dtype == np.float32 and len(x) == len(y) > 100
    assert 0.0 <= x.min() and x.max() <= 1.0 and set(y.tolist()) == set(range(10))


# ------------------------------------------------------------------ the local executor, for real


@pytest.mark.e2e
def test_local_run_survives_a_broken_candidate_and_follows_the_dag(tmp_path, capsys):
    data = minimal(candidates=[
        {"name": "cnn", "job": {"command": ["python", TRAIN, "--epochs", 1]}},
        # a real 2-rank mpirun job whose ranks exit 3
        {"name": "broken", "job": {"command": ["sh", "-c", "exit 3"]}},
    ], loadTest={"concurrency": 2, "requests": 20, "images": 2, "maxErrorRate": 0})
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    assert main(["pipeline", "run", str(tmp_path / "p.yaml"), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    graph = build(load_pipeline(tmp_path / "p.yaml"))
    statuses = dict(re.findall(r"^(\S+)\s+(succeeded|failed|skipped)\s+[\d.]+$", printed, re.M))
    assert statuses == {"ingest": "succeeded", "train-cnn": "succeeded", "train-broken": "failed",
                        "select": "succeeded", "deploy": "succeeded", "loadtest": "succeeded"}
    assert set(statuses) == {t["name"] for t in templates(render_workflow(graph))[argo.ENTRYPOINT]["dag"]["tasks"]}
    # the order the steps ran in honours every edge of the DAG
    started = re.findall(r"^\[run \] (\S+)$", printed, re.M)
    finished = re.findall(r"^\[(?:ok  |FAIL)\] (\S+) ", printed, re.M)
    assert len(started) == len(finished) == 6
    for upstream, step, _ in graph.edges():
        assert finished.index(upstream) < started.index(step) or step not in started, (upstream, step)
    row = re.search(r"^cnn\s+succeeded\s+([\d.]+)\s+[\d.]+\s+version 1$", printed, re.M)
    assert row and float(row.group(1)) > 0.3  # one epoch: well above chance (0.1)
    assert re.search(r"^broken\s+failed\s+-\s+-", printed, re.M)
    load = json.loads((out / "run" / "loadtest.json").read_text())
    assert (load["requests"], load["errors"], load["slo"]["passed"]) == (20, 0, True)
    record = json.loads((out / "models" / "digits" / "1" / "assets.extra" / "hvdk8s.json").read_text())
    assert [Path(c["path"]).name for c in record["selection"]["candidates"]] == ["cnn.keras"]
    assert (out / "summary.png").stat().st_size > 10_000 and (out / "run" / "latency.png").is_file()


def test_pipeline_outcome_is_judged_like_argo(tmp_path):
    graph = build(from_data(minimal(), "p.yaml", tmp_path))
    result = local.RunResult(d.Layout("r", "m", "."))
    result.steps = {s.name: local.StepResult(s.name, local.SUCCEEDED) for s in graph.steps}
    result.steps["train-cnn"].status = local.FAILED  # a failed candidate alone does not fail the pipeline
    assert local.succeeded(graph, result)
    result.steps["loadtest"].status = local.FAILED  # a missed objective does
    assert not local.succeeded(graph, result)
