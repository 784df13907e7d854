"""JobSpec -> Kubeflow Trainer v2 (trainer.kubeflow.org/v1alpha1) TrainJob + TrainingRuntime.

Trainer ships no generic MPI runtime (only DeepSpeed and MLX ones), so each
job gets an hvdk8s runtime named ``hvdk8s-<job>``, a namespaced TrainingRuntime
beside its TrainJob (``hvdk8s submit`` makes the TrainJob its owner, so the
garbage collector deletes it with the job; nothing is cluster-scoped, and the
same job name in two namespaces gets two runtimes). Not one shared
ClusterTrainingRuntime: Trainer v2.3.0 puts a TrainJob's image, command and
args in the launcher only (plugins/jobset/builder.go Builder.Trainer); its env
and resourcesPerNode reach the node pods too, but only with runLauncherAsNode
(builder.go line 142, runtime/core/trainingruntime.go lines 199-203), and
runtimePatches cannot set an image or resources, so the node pods, where the
ranks run, would keep a shared runtime's image (and, unless the launcher runs
ranks, its size). The runtime holds the MPI policy (OpenMPI,
``numProcPerNode`` = slots, the ssh mount path) and a JobSet template with
Trainer's naming conventions (v2.3.0, pkg/runtime/framework/plugins/mpi):
a ``node`` replicated job running sshd, and a ``launcher`` one, labelled as the
``trainer`` ancestor step, created once the nodes are Ready. Both containers
are named ``node``: the MPI plugin mounts the ssh keys (and, on the launcher,
the hostfile at /etc/mpi) only into containers of that name. The pods are the
MPIJob path's, so the launcher runs the very same mpirun command, with one
difference: Trainer mounts the ssh private key with mode 0640
(pkg/constants: MPISSHPrivateKeyFileMode), which OpenSSH refuses for the key's
owner (root, when the job file sets no ``user:``), so the launcher's wait hands
ssh a 0600 copy (``hosts wait --identity``). Each replicated Job fails at its
first failed pod (``backoffLimit: 0``, Kubernetes' default is 6), so retries are
the JobSet's ``maxRestarts`` = ``runPolicy.backoffLimit``, as for the MPIJob.
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Any

from hvdk8s.common import fields
from hvdk8s.common.fields import MULTIKUEUE, FieldError, SpecError, forbidden, join
from hvdk8s.mpijob.render import labels, launcher_command, metadata, render
from hvdk8s.mpijob.spec import JobSpec

GROUP, VERSION = "trainer.kubeflow.org", "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
TRAINJOB_KIND = "TrainJob"
RUNTIME_KIND = "TrainingRuntime"
NODE, LAUNCHER = "node", "launcher"  # replicated-job names; NODE is also every container's name
ANCESTOR_LABEL = f"{GROUP}/trainjob-ancestor-step"
ANCESTOR_TRAINER = "trainer"
RUNTIME_PREFIX = "hvdk8s-"


def runtime_name(spec: JobSpec) -> str:
    return f"{RUNTIME_PREFIX}{spec.name}"


def trainjob_problems(spec: JobSpec, path: str = "") -> list[FieldError]:
    """What a (valid, defaulted) job spec asks for that a TrainJob cannot express, at job-file paths under ``path``."""
    errors = []
    if spec.elastic:
        errors.append(forbidden(join(path, "elastic"), "Kubeflow Trainer's MPI plugin writes a fixed hostfile and has no "
                                "elastic host discovery (no discover_hosts.sh): render an MPIJob (--api mpijob)"))
    if spec.workers == 0:
        errors.append(forbidden(join(path, "workers"), "Trainer always runs at least one node pod besides the launcher: "
                                "a launcher-only job needs an MPIJob (--api mpijob)"))
    if spec.scheduler_name == "volcano":
        errors.append(forbidden(join(path, "schedulerName"), "volcano is not carried to a TrainJob: Trainer's Volcano gang "
                                "(podGroupPolicy, v2.3.0 plugins/volcano) counts the launcher in minMember, which "
                                "JobSet creates only once the nodes are Ready, so the gang would never fill: "
                                "render an MPIJob (--api mpijob) for Volcano"))
    nodes = spec.workers  # JobSet pod hostnames: <job>-<replicated job>-<job index>-<pod index>
    for host in (f"{spec.name}-{NODE}-0-{max(nodes, 1) - 1}", f"{spec.name}-{LAUNCHER}-0-0"):
        if problem := fields.name_problem(host):
            errors.append(fields.invalid(join(path, "name"), f"pod hostname {host!r} {problem}"))
    if len(runtime_name(spec)) > 253:
        errors.append(fields.invalid(join(path, "name"), f"runtime name {runtime_name(spec)!r} is over 253 characters"))
    return errors


def render_trainjob(spec: JobSpec) -> list[dict[str, Any]]:
    """[TrainingRuntime, TrainJob] for ``kubectl apply -f`` (``spec`` from ``load_spec``,
    with no ``trainjob_problems``)."""
    # The JobSet starts the launcher after the nodes are Ready, and again from
    # the nodes after a resume: the launcher never has to wait for sshd itself.
    mpijob = render(dataclasses.replace(spec, launcher_creation_policy="WaitForWorkersReady"))
    replicas = mpijob["spec"]["mpiReplicaSpecs"]
    launcher = replicas["Launcher"]["template"]["spec"]["containers"][0]
    launcher["command"] = launcher_command(spec, ssh_identity=f"{spec.ssh_auth_mount_path}/id_rsa")
    run_policy = spec.run_policy
    jobset: dict[str, Any] = {
        "network": {"publishNotReadyAddresses": True},
        "successPolicy": {"operator": "All", "targetReplicatedJobs": [LAUNCHER]},
        "failurePolicy": {"maxRestarts": run_policy.backoff_limit},
    }
    if run_policy.ttl_seconds_after_finished is not None:
        jobset["ttlSecondsAfterFinished"] = run_policy.ttl_seconds_after_finished
    jobset["replicatedJobs"] = [
        {"name": NODE, "template": {"spec": {"backoffLimit": 0, "template": _pod(replicas["Worker"])}}},
        {
            "name": LAUNCHER,
            "dependsOn": [{"name": NODE, "status": "Ready"}],
            "template": {"metadata": {"labels": {ANCESTOR_LABEL: ANCESTOR_TRAINER}},
                         "spec": {"backoffLimit": 0, "template": _pod(replicas["Launcher"])}},
        },
    ]
    runtime = {
        "apiVersion": API_VERSION,
        "kind": RUNTIME_KIND,
        "metadata": {"name": runtime_name(spec), **({"namespace": spec.namespace} if spec.namespace else {}),
                     "labels": labels(spec)},
        "spec": {
            "mlPolicy": {
                "numNodes": spec.workers,
                "mpi": {
                    "numProcPerNode": spec.slots_per_worker,
                    "mpiImplementation": spec.mpi_implementation,
                    "sshAuthMountPath": spec.ssh_auth_mount_path,
                    "runLauncherAsNode": spec.run_launcher_as_worker,
                },
            },
            "template": {"spec": jobset},
        },
    }
    train: dict[str, Any] = {
        "runtimeRef": {"name": runtime_name(spec), "apiGroup": GROUP, "kind": RUNTIME_KIND},
        # With runLauncherAsNode Trainer counts the launcher among the nodes.
        "trainer": {"numNodes": spec.hosts, "numProcPerNode": spec.slots_per_worker},
    }
    if run_policy.suspend is not None:
        train["suspend"] = run_policy.suspend
    if run_policy.managed_by == MULTIKUEUE:
        train["managedBy"] = MULTIKUEUE
    if run_policy.active_deadline_seconds is not None:
        train["activeDeadlineSeconds"] = run_policy.active_deadline_seconds
    # metadata carries Kueue's queue-name label, which its TrainJob integration reads too.
    return [runtime, {"apiVersion": API_VERSION, "kind": TRAINJOB_KIND, "metadata": metadata(spec), "spec": train}]


def checked_render_trainjob(spec: JobSpec, where: str) -> list[dict[str, Any]]:
    """``render_trainjob`` after refusing, with the reason, what Trainer cannot express."""
    if errors := trainjob_problems(spec):
        raise SpecError(where, errors)
    return render_trainjob(spec)


def _pod(replica: dict[str, Any]) -> dict[str, Any]:
    """An MPIJob replica's pod template as a Trainer pod: container ``node``, the Job's restart policy."""
    template = copy.deepcopy(replica["template"])
    template["spec"]["containers"][0]["name"] = NODE
    template["spec"]["restartPolicy"] = replica["restartPolicy"]
    return template
