"""The DAG as an Argo Workflow (argoproj.io/v1alpha1), built with Hera, plus its RBAC objects.

Pure: ``render(dag)`` returns the Workflow as a dict, ``rbac(pipeline)`` the
ServiceAccount, Role and RoleBinding it runs as. How each DAG step becomes
Argo templates:

* train: three ``resource`` templates in sequence, the two waits each bounded by
  its ``activeDeadlineSeconds`` (the pipeline's ``deadlines``; the kubelet ends the
  executor's pod, and Argo fails the step, when it passes). ``launch-*``
  creates the candidate's MPIJob and waits until its launcher exists: under
  ``WaitForWorkersReady`` the MPI Operator creates none until every worker is
  Ready, so an unschedulable, image-pulling or crash-looping worker fails the
  step after ``deadlines.launcherMinutes`` instead of leaving it waiting
  forever (a suspended MPIJob gets its suspended launcher at once, so queueing
  counts against the next bound). ``wait-*`` then reads the MPIJob until it
  ends, for at most ``deadlines.trainMinutes``, and ``result-*`` reads its outcome.
  Argo evaluates ``successCondition``/``failureCondition`` as Kubernetes label
  selectors over gjson paths of the object (workflow/executor/resource.go:
  ``labels.Parse`` + ``gjsonLabels``; any failure requirement fails the step, all
  success requirements succeed it): keys must be plain dotted paths, so a query
  into ``status.conditions`` by type cannot be written, nor "A and not B" as a
  failure. Hence two reads. The MPI Operator sets ``status.completionTime`` when
  the launcher Job has succeeded, or failed for good (backoffLimit reached,
  activeDeadlineSeconds passed), and leaves the status as it is from then on;
  ``status.replicaStatuses.Launcher.succeeded`` is 1 exactly when the launcher Job
  succeeded. The launcher Job's ``failed`` count tells nothing: under the
  launcher's default ``restartPolicy: OnFailure`` Kubernetes counts container
  restarts against ``backoffLimit`` and ``failed`` ends at 0 or 1.
  Never retried: a training failure is deterministic (bug, OOM) and the job
  already has its own backoffLimit. The MPIJob is named after the run
  (``naming``), so overlapping runs never collide, and is owned by the Workflow
  (``setOwnerReference``): deleting the Workflow deletes it and its pods.
* select, ingest, loadtest: container steps running the ``dag.*_argv`` commands
  on the shared volume, retried with backoff only on Argo *errors* (pod
  evicted, node lost), never on their own failure (no candidate finished, SLO missed).
* deploy: a DAG of ``apply`` resource templates, one per serving manifest,
  the server's readiness awaited; applies are idempotent, so they are retried.
* exit handler: deletes this run's candidate MPIJobs (``--ignore-not-found``),
  finished or not, so a failed or timed-out run leaves no job running.

Every pod the Workflow runs carries the label ``sidecar.istio.io/inject: "false"``
(``podMetadata``; the annotation of that name is deprecated): with no injected
sidecar, Argo never needs ``pods/exec`` to kill one, and the Role does not grant it.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any

from hera.workflows import DAG, Container, Resource, RetryStrategy, Step, Steps, Task, Workflow, models as m

from hvdk8s.common.files import to_yaml
from hvdk8s.mpijob.files import SpecError
from hvdk8s.mpijob.render import API_VERSION as MPIJOB_API, KIND as MPIJOB_KIND, render as render_mpijob
from hvdk8s.mpijob.validation import check_manifest
from hvdk8s.pipeline import dag as d, naming
from hvdk8s.pipeline.load import model_base_path, serving_options
from hvdk8s.pipeline.spec import Candidate, Pipeline
from hvdk8s.serving.kube import manifests
from hvdk8s.serving.kube.options import REST_PORT

ENTRYPOINT, EXIT_HANDLER, DEPLOY_DAG = "pipeline", "cleanup", "deploy"
SHARED_VOLUME = "shared"
# Argo fills these in when the Workflow runs: one folder per run, services in its namespace.
WORKFLOW_NAME, WORKFLOW_NAMESPACE = naming.WORKFLOW_NAME, "{{workflow.namespace}}"
# On every pod the Workflow runs: Istio injects no sidecar (a label since Istio 1.10; the annotation is deprecated).
POD_LABELS = {"sidecar.istio.io/inject": "false"}
STEP_RESOURCES = m.ResourceRequirements(requests={"cpu": m.Quantity("1"), "memory": m.Quantity("2Gi")})
ON_ERROR = RetryStrategy(limit=2, retry_policy="OnError", backoff=m.Backoff(duration="15s", factor=m.IntOrString(2)))
APPLY_RETRY = RetryStrategy(limit=2, retry_policy="Always", backoff=m.Backoff(duration="10s", factor=m.IntOrString(2)))
# Readiness as Argo can test it (see the module docstring).
READY = {
    "Deployment": ("status.availableReplicas > 0", None),
    "InferenceService": ("status.modelStatus.states.activeModelState == Loaded",
                         "status.modelStatus.states.activeModelState == FailedToLoad"),
}


def layout(pipeline: Pipeline) -> d.Layout:
    """Paths inside the step containers, on the shared volume."""
    mount = pipeline.shared_volume.mount_path.rstrip("/")
    return d.Layout(run_dir=f"{mount}/{pipeline.name}/runs/{WORKFLOW_NAME}",
                    models=f"{mount}/{model_base_path(pipeline)}", data_root=mount)


def service_url(pipeline: Pipeline) -> str:
    """The model server's in-cluster REST root: the TF Serving Service, or KServe's predictor Service."""
    namespace = pipeline.namespace or WORKFLOW_NAMESPACE
    name = pipeline.serving.model_name
    if pipeline.serving.kserve:
        return f"http://{name}-predictor.{namespace}.svc.cluster.local"
    return f"http://{name}.{namespace}.svc.cluster.local:{REST_PORT}"


def service_account(pipeline: Pipeline) -> str:
    return f"{pipeline.name}-pipeline"


def train_manifest(candidate: Candidate, p: Pipeline, where: d.Layout) -> dict[str, Any]:
    """The candidate's MPIJob as the template holds it: named after the run, its command told where to
    save the model. Held to the operator's rules as Argo will create it, with the longest run name."""
    job = dataclasses.replace(candidate.job, name=job_name(candidate),
                              command=tuple(d.train_command(candidate, where)))
    manifest = render_mpijob(job)
    if errors := check_manifest(at_run(manifest, naming.longest_workflow_name(p.name))):
        raise SpecError(f"candidate {candidate.name}", errors)
    return manifest


def job_name(candidate: Candidate) -> str:
    return naming.candidate_job(WORKFLOW_NAME, candidate.name)


def at_run(obj: dict[str, Any], workflow_name: str) -> dict[str, Any]:
    """``obj`` with ``{{workflow.name}}`` filled in, as Argo does over a template's JSON text."""
    return json.loads(json.dumps(obj).replace(WORKFLOW_NAME, workflow_name))


# Argo waits for the launcher: the operator writes status.replicaStatuses.Launcher once the launcher Job
# exists (mpi_job_controller.go updateMPIJobStatus); a bare key is the label selector "exists".
LAUNCHED = "status.replicaStatuses.Launcher"
# MPI Operator v0.8.2, pkg/controller/mpi_job_controller.go: updateMPIJobStatus copies the launcher Job's
# CompletionTime on success and sets Launcher.succeeded = 1 (rewriting replicaStatuses on every sync);
# updateMPIJobFailedStatus sets CompletionTime (and the Failed condition) once the launcher Job has the
# Failed condition; syncHandler returns before touching the status once the job isFinished with a
# CompletionTime. So ENDED is "succeeded or failed for good", and the status read after it is final.
ENDED = "status.completionTime"
SUCCEEDED, FAILED = "status.replicaStatuses.Launcher.succeeded = 1", "status.replicaStatuses.Launcher.succeeded != 1"


def render(dag: d.Dag) -> dict[str, Any]:
    """The Workflow: one DAG task per step, same names and dependencies as ``dag``."""
    p = dag.pipeline
    where = layout(p)
    templates: list[Any] = [DAG(name=ENTRYPOINT, tasks=[_task(step) for step in dag.steps])]
    for step in dag.steps:
        templates += _templates(step, p, where)
    templates += _cleanup(p)
    meta: dict[str, Any] = {"generate_name": naming.generate_name(p.name),
                            "labels": {"app.kubernetes.io/name": "hvdk8s", "app.kubernetes.io/instance": p.name}}
    if p.namespace:
        meta["namespace"] = p.namespace
    workflow = Workflow(
        **meta,
        entrypoint=ENTRYPOINT,
        on_exit=EXIT_HANDLER,
        service_account_name=service_account(p),
        pod_metadata=m.Metadata(labels=POD_LABELS),
        volumes=[m.Volume(name=SHARED_VOLUME, persistent_volume_claim=m.PersistentVolumeClaimVolumeSource(
            claim_name=p.shared_volume.claim_name))],
        templates=templates,
    )
    return workflow.to_dict()


def depends(step: d.Step) -> str | None:
    """Argo's enhanced ``depends``: ``needs`` must have Succeeded, ``after`` only finished."""
    terms = [f"{name}.Succeeded" for name in step.needs]
    terms += [f"({name}.Succeeded || {name}.Failed || {name}.Errored)" for name in step.after]
    return " && ".join(terms) or None


def _task(step: d.Step) -> Task:
    return Task(name=step.name, template=step.name, depends=depends(step))


def _templates(step: d.Step, p: Pipeline, where: d.Layout) -> list[Any]:
    if step.kind == d.TRAIN:
        assert step.candidate is not None
        return _train(step.name, step.candidate, p, where)
    if step.kind == d.INGEST:
        return [_container(step.name, d.ingest_argv(p, where), p)]
    if step.kind == d.SELECT:
        return [_container(step.name, d.select_argv(p, where), p)]
    if step.kind == d.LOADTEST:
        return [_container(step.name, d.loadtest_argv(p, service_url(p)), p)]
    if step.kind == d.DEPLOY:
        return _deploy(p)
    raise ValueError(f"step {step.name}: unknown kind {step.kind!r}")


def _train(name: str, c: Candidate, p: Pipeline, where: d.Layout) -> list[Any]:
    """Create the MPIJob and wait for its launcher, then for its end (each wait bounded), then read
    whether it succeeded (module docstring)."""
    launch, wait, result = f"launch-{c.name}", f"wait-{c.name}", f"result-{c.name}"
    reference = to_yaml(_reference(c))
    return [
        Steps(name=name, sub_steps=[Step(name=s, template=s) for s in (launch, wait, result)]),
        Resource(name=launch, action="create", manifest=to_yaml(train_manifest(c, p, where)),
                 set_owner_reference=True, success_condition=LAUNCHED,
                 active_deadline_seconds=60 * p.deadlines.launcher_minutes),
        Resource(name=wait, action="get", manifest=reference, success_condition=ENDED,
                 active_deadline_seconds=60 * p.deadlines.train_minutes),
        # one read decides: the status is final once ENDED, and one of the two conditions matches
        Resource(name=result, action="get", manifest=reference, success_condition=SUCCEEDED,
                 failure_condition=FAILED),
    ]


def _reference(c: Candidate) -> dict[str, Any]:
    """What kubectl needs to find this run's MPIJob of ``c``."""
    return {"apiVersion": MPIJOB_API, "kind": MPIJOB_KIND, "metadata": {"name": job_name(c)}}


def _container(name: str, argv: list[str], p: Pipeline) -> Container:
    mount = m.VolumeMount(name=SHARED_VOLUME, mount_path=p.shared_volume.mount_path)
    return Container(name=name, image=p.image, command=argv, volume_mounts=[mount], resources=STEP_RESOURCES,
                     retry_strategy=ON_ERROR)


def serving_manifests(p: Pipeline) -> list[dict[str, Any]]:
    return manifests.render(serving_options(p))


def _deploy(p: Pipeline) -> list[Any]:
    """ConfigMap first (the server mounts it), then the other objects together."""
    objects = serving_manifests(p)
    names = [f"apply-{obj['kind'].lower()}" for obj in objects]
    tasks: list[Task | m.DAGTask] = [Task(name=names[0], template=names[0])]
    tasks += [Task(name=name, template=name, depends=f"{names[0]}.Succeeded") for name in names[1:]]
    templates: list[Any] = [DAG(name=DEPLOY_DAG, tasks=tasks)]
    for name, obj in zip(names, objects, strict=True):
        success, failure = READY.get(obj["kind"], (None, None))
        templates.append(Resource(
            name=name, action="apply", manifest=to_yaml(obj), success_condition=success,
            failure_condition=failure, retry_strategy=APPLY_RETRY,
            active_deadline_seconds=60 * p.deadlines.deploy_minutes if success else None,
        ))
    return templates


def _cleanup(p: Pipeline) -> list[Any]:
    """Exit handler: delete this run's candidate MPIJobs, finished or not (their models are on the volume)."""
    names = [f"delete-{c.name}" for c in p.candidates]
    templates: list[Any] = [DAG(name=EXIT_HANDLER, tasks=[Task(name=n, template=n) for n in names])]
    for name, c in zip(names, p.candidates, strict=True):
        # Argo adds --ignore-not-found; --wait=false spares kubectl (and the Role) a list+watch until it is gone.
        templates.append(Resource(name=name, action="delete", manifest=to_yaml(_reference(c)),
                                  flags=["--wait=false"], retry_strategy=ON_ERROR))
    return templates


def rbac(p: Pipeline) -> list[dict[str, Any]]:
    """ServiceAccount, Role and RoleBinding with exactly what the Workflow's steps do."""
    meta: dict[str, Any] = {"name": service_account(p)}
    if p.namespace:
        meta["namespace"] = p.namespace
    meta["labels"] = {"app.kubernetes.io/name": "hvdk8s", "app.kubernetes.io/instance": p.name}
    apply = ["get", "create", "patch"]  # kubectl apply: read, then create or patch
    serving = [{"apiGroups": [""], "resources": ["configmaps"], "verbs": apply}]
    if p.serving.kserve:
        serving += [{"apiGroups": ["serving.kserve.io"], "resources": ["inferenceservices"], "verbs": apply}]
    else:
        serving += [
            {"apiGroups": [""], "resources": ["services"], "verbs": apply},
            {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": apply},
            {"apiGroups": ["autoscaling"], "resources": ["horizontalpodautoscalers"], "verbs": apply},
        ]
    rules = [
        # Argo's executor records each step's outcome as a WorkflowTaskResult.
        {"apiGroups": ["argoproj.io"], "resources": ["workflowtaskresults"], "verbs": ["create", "patch"]},
        # train: create, then poll the status; exit handler: delete.
        {"apiGroups": ["kubeflow.org"], "resources": ["mpijobs"], "verbs": ["create", "get", "delete"]},
        *serving,
        # The launchers' logs (hvdk8s logs NAME with this account).
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
        {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    ]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta, "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": service_account(p)},
         "subjects": [{"kind": "ServiceAccount", "name": service_account(p)}]},
    ]
