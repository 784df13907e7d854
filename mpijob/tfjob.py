"""JobSpec -> Kubeflow Training Operator TFJob (kubeflow.org/v1): distributed TensorFlow as Kubeflow runs it.

Why a TFJob and not a Trainer v2 TrainJob: Trainer v2's ML policies (``pkg/runtime/framework/plugins``: torch,
MPI, JAX, XGBoost, Flux, plain) and its runtimes have nothing for TensorFlow, and nothing in it writes
``TF_CONFIG``; a TrainingRuntime whose init step did would be hvdk8s's own invention. The Training Operator's TFJob (release-1.9, the last line that has it) is what the Kubeflow
material describes for distributed TensorFlow: PS / Chief / Worker replicas, and the operator writes
``TF_CONFIG`` into every pod (``pkg/controller.v1/tensorflow/tensorflow.go`` genTFConfigJSONStr: the cluster
spec's keys are the replica types lowercased, each task ``<job>-<type>-<index>.<namespace>.svc:<port>``, the
port being the ``tensorflow`` container's ``tfjob-port``, default 2222).

The pods are the MPIJob path's worker pods (``render``: image, resources and GPUs, node selectors,
tolerations, priority, volumes, user, RDMA opt-ins, the job's labels and Kueue queue), with the container
named ``tensorflow`` (the operator's webhook requires one of that name) running the role's command, and the
MPIJob's runPolicy, whose fields kubeflow.org/v1 shares. Parameter servers and the Chief get no GPU.

Success and clean-up (``tfjob_controller.go`` UpdateJobStatus, ``common/job.go`` DeletePodsAndServices): the
default success policy ("") ends the job when the Chief succeeds, or worker 0 when there is no Chief, so a
job whose parameter servers (and PS-strategy workers) serve until killed still finishes; ``cleanPodPolicy``
(the job file's ``runPolicy.cleanPodPolicy``, default ``Running``; the TFJob's own default would be ``None``)
then deletes the pods still running, and the succeeded Chief's pod stays with its log.
"""
from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from typing import Any

from hvdk8s.common import fields
from hvdk8s.common.fields import MULTIKUEUE, FieldError, SpecError, forbidden, invalid
from hvdk8s.mpijob.render import render
from hvdk8s.mpijob.spec import JobSpec

API_VERSION = "kubeflow.org/v1"
KIND = "TFJob"
CHIEF, WORKER, PS = "Chief", "Worker", "PS"
CPU_ROLES = (CHIEF, PS)  # the replica types without a GPU: a ParameterServerStrategy's coordinator and servers
CONTAINER = "tensorflow"  # kubeflowv1.TFJobDefaultContainerName
PORT_NAME = "tfjob-port"  # kubeflowv1.TFJobDefaultPortName
PORT = 2222  # kubeflowv1.TFJobDefaultPort
COMPONENT_LABEL = "app.kubernetes.io/component"


def tfjob_problems(spec: JobSpec, *, chief: bool = False, ps: int = 0) -> list[FieldError]:
    """What a (valid, defaulted) job spec asks for that a TFJob cannot express, at its job-file paths."""
    errors = []
    if spec.elastic:
        errors.append(forbidden("elastic", "a TFJob's cluster is fixed when its pods start (TF_CONFIG): "
                                "elastic training is for MPIJobs"))
    if spec.run_launcher_as_worker:
        errors.append(forbidden("runLauncherAsWorker", "a TFJob has no launcher"))
    if spec.run_policy.managed_by not in (None, MULTIKUEUE):
        errors.append(forbidden("runPolicy.managedBy", f"{spec.run_policy.managed_by!r} manages MPIJobs; "
                                f"the Training Operator accepts only its own TFJobs or {MULTIKUEUE}"))
    if not chief and spec.workers < 1:
        errors.append(invalid("workers", "a TFJob without a Chief needs at least one worker (worker 0 "
                              "decides when it succeeds)"))
    # The operator's webhook (validateTFJob) wants the name a DNS-1035 label; each pod gets a Service of its
    # own name (common/service.go CreateNewService), and Service names are DNS-1035 labels too.
    longest = [f"{spec.name}-{rtype.lower()}-{count - 1}" for rtype, count in _replicas(spec, chief, ps).items()]
    for name in [spec.name, *longest]:
        if problem := fields.name_problem(name):
            errors.append(invalid("name", f"{'TFJob name' if name == spec.name else 'Service'} "
                                  f"{name!r} {problem}"))
            break
    return errors


def render_tfjob(spec: JobSpec, *, chief: bool = False, ps: int = 0,
                 serve_command: Sequence[str] | None = None) -> dict[str, Any]:
    """The TFJob: ``spec.workers`` Workers, a Chief (``chief``) and ``ps`` parameter servers.

    ``spec.command`` runs on the task that drives the job (the Chief, else every Worker, as under
    MultiWorkerMirroredStrategy); the others (PS, and the Workers when there is a Chief, as under
    ParameterServerStrategy) run ``serve_command``, default ``spec.command``. Only Workers get GPUs (``CPU_ROLES``:
    parameter servers hold variables, a Chief only coordinates). ``spec`` from ``load_spec``, with no
    ``tfjob_problems``.
    """
    serve = tuple(serve_command or spec.command)
    commands = {CHIEF: spec.command, WORKER: serve if chief else spec.command, PS: serve}
    job = dataclasses.replace(spec, workers=max(spec.workers, 1))
    mpijob = render(job)
    counts = _replicas(spec, chief, ps)
    # Every task's pod is a copy of the MPIJob's Worker pod: as rendered, or without GPU (nor GPU-model selector).
    cpu = render(dataclasses.replace(job, gpu=False, scheduling=dataclasses.replace(job.scheduling, gpu_product=None)))
    pods = {gpu: m["spec"]["mpiReplicaSpecs"]["Worker"]["template"] for gpu, m in ((True, mpijob), (False, cpu))}
    replicas: dict[str, dict[str, Any]] = {
        rtype: {
            "replicas": count,
            "restartPolicy": spec.restart_policy.worker,
            "template": _template(pods[rtype not in CPU_ROLES], rtype, commands[rtype]),
        }
        for rtype, count in counts.items()
    }
    run_policy = mpijob["spec"]["runPolicy"]
    if gang := run_policy.get("schedulingPolicy"):
        # The MPIJob's minAvailable and minResources count its launcher and workers; every TF task is one
        # pod of the gang, and the operator sums their resources itself (common/job.go calcPGMinResources).
        gang.pop("minResources", None)
        gang["minAvailable"] = sum(counts.values())
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": mpijob["metadata"],
        "spec": {"runPolicy": run_policy, "tfReplicaSpecs": replicas},
    }


def checked_render_tfjob(spec: JobSpec, where: str, *, chief: bool = False, ps: int = 0,
                         serve_command: Sequence[str] | None = None) -> dict[str, Any]:
    """``render_tfjob`` after refusing, with the reason, what a TFJob cannot express."""
    if errors := tfjob_problems(spec, chief=chief, ps=ps):
        raise SpecError(where, errors)
    return render_tfjob(spec, chief=chief, ps=ps, serve_command=serve_command)


def _replicas(spec: JobSpec, chief: bool, ps: int) -> dict[str, int]:
    counts = {CHIEF: int(chief), WORKER: spec.workers, PS: ps}
    return {rtype: count for rtype, count in counts.items() if count > 0}


def _template(worker: dict[str, Any], rtype: str, command: Sequence[str]) -> dict[str, Any]:
    """A copy of the MPIJob Worker's pod template as a TF task's: container ``tensorflow`` on the TF port, no sshd."""
    template = copy.deepcopy(worker)
    template["metadata"]["labels"][COMPONENT_LABEL] = rtype.lower()
    container = template["spec"]["containers"][0]
    container["name"] = CONTAINER
    container["command"] = list(command)
    del container["readinessProbe"]  # the sshd probe; a TF task is ready when it runs
    container["ports"] = [{"name": PORT_NAME, "containerPort": PORT},
                          *(p for p in container["ports"] if p["name"] != "ssh")]
    return template
