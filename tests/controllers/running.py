"""The API double with the controllers at work: MPIJobs and TFJobs created on it get pods as the controller
models build them, run by a ``PodRunner``, and the status and clean-up the models say.

The MPI Operator (``mpi_operator``): worker pods first, the launcher once they all run (WaitForWorkersReady),
the job Succeeded or Failed with the launcher, the workers deleted then (cleanPodPolicy Running). The
Training Operator (``training_operator``): every task's pod with its TF_CONFIG, the job's verdict from the
pods' phases, and the pods ``deleted_on_finish`` gone. Pods carry the labels the operators give them (job
name, role), so ``hvdk8s.cluster.kube`` finds the launcher / master pod and its log, and the node they ran
on (``spec.nodeName``: the runner's). A runner runs one pod: a process in a network namespace
(tests/test_cluster_bench_e2e.py), or a script (tests/test_cluster_submit.py).
"""
from __future__ import annotations

import copy
import json
import queue
import threading
import time
from typing import Any, Protocol

from werkzeug.wrappers import Request, Response

from controllers import mpi_operator, training_operator
from kube_double import MPIJOBS, KubeDouble, Pod, Resource

TFJOBS = Resource("kubeflow.org", "v1", "tfjobs", "TFJob", "tfjob-v1-crd.yaml", job_label=training_operator.JOB_LABEL,
                  role_label=training_operator.ROLE_LABEL, roles=("master", "worker"),
                  pod_labels=((training_operator.OPERATOR_LABEL, training_operator.OPERATOR),))
MPI_LABELS = {"training.kubeflow.org/operator-name": "mpi-operator"}  # with job-name and job-role (launcher / worker)
JOB_SECONDS = 600.0  # a job the runner has not finished by then fails (bounds a hung test)


class PodRunner(Protocol):
    def prepare(self, job: dict[str, Any], pods: list[dict[str, Any]], hostfile: str | None) -> dict[str, str]:
        """Before any pod of ``job`` runs (``hostfile``: an MPIJob's, as the MPI Operator writes it): where each
        will run (pod name -> node)."""

    def run(self, job: dict[str, Any], pod: dict[str, Any], emit: Any) -> int:
        """Run ``pod`` until it exits (its exit code) or is killed (any code); ``emit(line)`` is its log."""

    def kill(self, pod: dict[str, Any]) -> None:
        """Stop the pod's process (the operator deleted it)."""

    def finish(self, job: dict[str, Any]) -> None:
        """Every pod of ``job`` has ended or been killed."""


class OperatedDouble(KubeDouble):
    """``KubeDouble`` serving TFJobs too (unless ``training_operator`` is False: a cluster without the Training
    Operator), with the operators running each created job's pods through ``runner``."""

    def __init__(self, runner: PodRunner, *, training_operator: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if training_operator:
            self.resources[(TFJOBS.group, TFJOBS.version, TFJOBS.plural)] = TFJOBS
        self.runner = runner
        self.ran: list[str] = []  # jobs in the order their pods started
        self._ended: dict[tuple[str, str], threading.Event] = {}  # set once every pod of the job has ended

    def _create(self, request: Request, res: Resource, ns: str) -> Response:
        response = super()._create(request, res, ns)
        if response.status_code == 201 and not request.args.get("dryRun") and res in (MPIJOBS, TFJOBS):
            self._spawn(self._operate_job, res, json.loads(response.get_data()))
        return response

    # ---------------------------------------------------------------- one job, start to end
    def _operate_job(self, res: Resource, job: dict[str, Any]) -> None:
        ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
        self._ended[(ns, name)] = threading.Event()
        if res is MPIJOBS:  # the launcher is started once every worker runs (WaitForWorkersReady)
            made = mpi_operator.sync(job, ready_workers=len(mpi_operator.sync(job, 0).workers))
            assert made.launcher is not None
            launcher = made.launcher["template"]
            launcher["metadata"]["name"] = f"{name}-launcher-{len(self.ran):05d}"
            pods = [*(self._labelled(p, name, "worker") for p in made.workers), self._labelled(launcher, name, "launcher")]
            hostfile: str | None = mpi_operator.hostfile(job)
        else:
            pods, hostfile = training_operator.pods(job), None
        nodes = self.runner.prepare(job, pods, hostfile)
        self._condition(res, ns, name, "Created", "Created", f"{job['kind']} {ns}/{name} is created.")
        exits: queue.Queue[tuple[str, int]] = queue.Queue()
        for pod in pods:
            self._start(job, pod, nodes, exits)
        self.ran.append(name)
        self._condition(res, ns, name, "Running", "Running", f"{job['kind']} {ns}/{name} is running.")
        phases = {p["metadata"]["name"]: "Running" for p in pods}
        verdict, deadline = "Running", time.monotonic() + JOB_SECONDS
        while verdict == "Running" and not self._gone(res, ns, name) and time.monotonic() < deadline:
            try:
                pod_name, code = exits.get(timeout=0.5)
            except queue.Empty:
                continue
            phases[pod_name] = "Succeeded" if code == 0 else "Failed"
            self._phase(ns, pod_name, phases[pod_name])
            if res is MPIJOBS:  # the launcher's end is the job's; a failed worker fails it (restartPolicy Never)
                ended = phases[pods[-1]["metadata"]["name"]]
                verdict = "Failed" if "Failed" in phases.values() else ended if ended != "Running" else "Running"
            else:
                verdict = training_operator.status(job, phases)
        running = [p for p in pods if phases[p["metadata"]["name"]] == "Running"]
        if verdict == "Running":  # deleted, or over time: every pod goes
            verdict, doomed = "Failed", running
        elif res is MPIJOBS:  # cleanPodPolicy Running (the job file's default), which the MPI Operator applies
            doomed = running
        else:
            gone = set(training_operator.deleted_on_finish(job, phases))
            doomed = [p for p in running if p["metadata"]["name"] in gone]
        self._remove_pods(ns, doomed, exits)
        done = "successfully completed." if verdict == "Succeeded" else "has failed."
        self._condition(res, ns, name, verdict, verdict, f"{job['kind']} {ns}/{name} {done}")
        left = [p for p in running if p not in doomed]  # kept by the clean-up policy: until the job is deleted
        while left and not self._gone(res, ns, name):
            time.sleep(0.5)
        self._remove_pods(ns, left, exits)
        self.runner.finish(job)
        self._ended[(ns, name)].set()

    def _finish_delete(self, res: Resource, ns: str, name: str) -> None:
        """Foreground deletion ends once the job's pods are gone: their processes too."""
        if ended := self._ended.get((ns, name)):
            ended.wait(JOB_SECONDS)
        super()._finish_delete(res, ns, name)

    def _remove_pods(self, ns: str, pods: list[dict[str, Any]], exits: queue.Queue[tuple[str, int]]) -> None:
        """Delete pods: their processes killed, and gone, before the double stops listing them."""
        for pod in pods:
            self.runner.kill(pod)
        for _ in pods:
            exits.get(timeout=60)
        with self._cond:
            for pod in pods:
                self.pods.pop((ns, pod["metadata"]["name"]), None)

    # ---------------------------------------------------------------- helpers (state under self._cond)
    @staticmethod
    def _labelled(pod: dict[str, Any], job: str, role: str) -> dict[str, Any]:
        pod = copy.deepcopy(pod)
        pod["metadata"]["labels"] = {**pod["metadata"].get("labels", {}), **MPI_LABELS,
                                     MPIJOBS.job_label: job, MPIJOBS.role_label: role}
        return pod

    def _start(self, job: dict[str, Any], pod: dict[str, Any], nodes: dict[str, str],
               exits: queue.Queue[tuple[str, int]]) -> None:
        ns, pod_name = job["metadata"]["namespace"], pod["metadata"]["name"]
        manifest = copy.deepcopy(pod)
        manifest["apiVersion"], manifest["kind"] = "v1", "Pod"
        manifest["metadata"] |= {"namespace": ns, "uid": f"uid-{pod_name}-{time.monotonic_ns()}",
                                 "creationTimestamp": "2025-01-01T00:00:00Z"}
        manifest["spec"]["nodeName"] = nodes[pod_name]
        manifest["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
        with self._cond:
            self.pods[(ns, pod_name)] = Pod(manifest)
        record = self.pods[(ns, pod_name)]

        def emit(line: str) -> None:
            with self._cond:
                record.log.append(line)
                self._cond.notify_all()

        def run() -> None:
            code = 1
            try:
                code = self.runner.run(job, pod, emit)
            finally:
                exits.put((pod_name, code))

        threading.Thread(target=run, name=f"pod-{pod_name}", daemon=True).start()

    def _phase(self, ns: str, pod_name: str, phase: str) -> None:
        with self._cond:
            if (ns, pod_name) in self.pods:
                self.pods[(ns, pod_name)].manifest["status"]["phase"] = phase
                self._cond.notify_all()

    def _gone(self, res: Resource, ns: str, name: str) -> bool:
        with self._cond:
            job = self.jobs.get((res.plural, ns, name))
            return job is None or "deletionTimestamp" in job["metadata"]

    def _condition(self, res: Resource, ns: str, name: str, ctype: str, reason: str, message: str) -> None:
        """The operators' setCondition: one per type; a terminal one turns Running off. Reasons are
        ``<Kind><Reason>`` (MPIJobSucceeded, TFJobRunning: commonutil.NewReason)."""
        with self._cond:
            job = self.jobs.get((res.plural, ns, name))
            if job is None:
                return
            status = job.setdefault("status", {})
            kept = [c for c in status.get("conditions", []) if c["type"] != ctype]
            if ctype in ("Succeeded", "Failed"):
                kept = [c | {"status": "False"} if c["type"] == "Running" else c for c in kept]
            status["conditions"] = [*kept, {"type": ctype, "status": "True", "reason": f"{res.kind}{reason}",
                                             "message": message}]
            self._record("MODIFIED", job)
