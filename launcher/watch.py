"""Follow an MPIJob until it ends: status changes from the watch API, launcher logs alongside.

The watch is resumed from the last resourceVersion when the server ends it
(timeoutSeconds, a dropped connection) and started over from a fresh list
when that version has expired (410 Gone), so a long training run is followed
without missing or repeating a transition.
"""
from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator

from hvdk8s.errors import UserError
from hvdk8s.launcher import jobstatus, kube

WATCH_SECONDS = 50  # per watch request; the server may end it sooner
POD_POLL_SECONDS = 2.0  # launcher-pod lookups between status changes
LOG_DRAIN_SECONDS = 30.0  # after the job ends, how long the last log lines may take to arrive
OPERATOR_HINT_SECONDS = 60.0


class Printer:
    """Status lines and log lines from two threads, whole lines, in order."""

    def __init__(self, job: str):
        self.prefix = f"mpijob/{job}: "
        self._lock = threading.Lock()

    def status(self, line: str) -> None:
        self._write(sys.stdout, self.prefix + line)

    def log(self, line: str) -> None:
        self._write(sys.stdout, line)

    def error(self, line: str) -> None:
        self._write(sys.stderr, line)

    def _write(self, stream, line: str) -> None:
        with self._lock:
            print(line, file=stream, flush=True)


def job_updates(cluster: kube.Cluster, namespace: str, name: str,
                watch_seconds: int = WATCH_SECONDS) -> Iterator[dict]:
    """The MPIJob now, then each time it changes; ends when it is deleted (or was never there)."""
    version = None
    while True:
        if version is None:
            listing = kube.list_job(cluster, namespace, name)
            if not listing.get("items"):
                return
            version = listing["metadata"]["resourceVersion"]
            yield listing["items"][0]
        try:
            for kind, obj in kube.watch_job(cluster, namespace, name, version, watch_seconds):
                version = obj["metadata"]["resourceVersion"]
                if kind == "DELETED":
                    return
                if kind in ("ADDED", "MODIFIED"):
                    yield obj
        except kube.WatchExpired:
            version = None


class LauncherLogs(threading.Thread):
    """Streams each launcher pod's log once it has started, including pods that replace it.

    Woken by :meth:`poke` on every status change (a launcher starting shows there), and
    by a slow poll; :meth:`finish` says the job has ended: stream what is left, then stop.
    """

    def __init__(self, cluster: kube.Cluster, namespace: str, job: str, printer: Printer):
        super().__init__(name=f"logs-{job}", daemon=True)
        self.cluster, self.namespace, self.job, self.printer = cluster, namespace, job, printer
        self._wake, self._done = threading.Event(), threading.Event()

    def poke(self) -> None:
        self._wake.set()

    def finish(self) -> None:
        self._done.set()
        self._wake.set()

    def run(self) -> None:
        streamed: set[str] = set()
        try:
            while True:
                pod = kube.launcher_pod(self.cluster, self.namespace, self.job)
                if pod and pod.uid not in streamed and pod.phase != "Pending":
                    streamed.add(pod.uid)
                    self.printer.status(f"logs of launcher pod {pod.name}:")
                    for line in kube.log_lines(self.cluster, self.namespace, pod, follow=True):
                        self.printer.log(line)
                    continue
                if self._done.is_set():
                    return
                self._wake.wait(POD_POLL_SECONDS)
                self._wake.clear()
        except UserError as err:
            self.printer.error(f"hvdk8s: cannot stream the launcher's logs: {err}")


def wait_for_job(cluster: kube.Cluster, namespace: str, name: str, follow_logs: bool,
                 printer: Printer | None = None) -> int:
    """Report conditions and replica counts as they change until the job ends.

    Returns 0 when it Succeeded, 1 when it Failed (the operator's reason printed) or
    was deleted while we waited.
    """
    printer = printer or Printer(name)
    logs = LauncherLogs(cluster, namespace, name, printer) if follow_logs else None
    if logs:
        logs.start()
    seen_status: dict | None = None
    hint = threading.Timer(OPERATOR_HINT_SECONDS, printer.status, [
        "no status yet: is the MPI Operator running? Check: kubectl get pods -A -l app=mpi-operator"])
    hint.daemon = True
    hint.start()
    try:
        for job in job_updates(cluster, namespace, name):
            status = job.get("status") or {}
            if jobstatus.conditions(status):
                hint.cancel()
            ended = jobstatus.outcome(status)
            if ended and logs:  # the last log lines come before the verdict
                logs.finish()
                logs.join(LOG_DRAIN_SECONDS)
            for line in jobstatus.transitions(seen_status, status):
                printer.status(line)
            seen_status = status
            if logs and not ended:
                logs.poke()
            if ended and ended.type == "Succeeded":
                return 0
            if ended:
                printer.error(f"hvdk8s: {jobstatus.failure_message(job)}")
                return 1
        printer.error(f"hvdk8s: MPIJob {namespace}/{name} was deleted before it finished")
        return 1
    finally:
        hint.cancel()
        if logs:
            logs.finish()


def wait_deleted(cluster: kube.Cluster, namespace: str, name: str) -> None:
    """Return once the MPIJob is gone (foreground deletion removes its pods first)."""
    for _ in job_updates(cluster, namespace, name):
        pass


def show_logs(cluster: kube.Cluster, namespace: str, name: str, follow: bool,
              emit: Callable[[str], None] = print) -> int:
    """``hvdk8s logs``: the newest launcher pod's log; with ``follow``, waits for it to start."""
    job = kube.get_job(cluster, namespace, name)
    pod = kube.launcher_pod(cluster, namespace, name)
    if follow and (pod is None or pod.phase == "Pending"):
        pod = _wait_for_launcher(cluster, namespace, name)
    if pod is None:
        raise UserError(f"MPIJob {namespace}/{name} ({jobstatus.phase(job.get('status'))}) has no launcher pod: "
                        "not started yet (try --follow), or removed by runPolicy.cleanPodPolicy")
    if pod.phase == "Pending":
        raise UserError(f"launcher pod {pod.name} has not started yet (Pending): try again, or use --follow")
    for line in kube.log_lines(cluster, namespace, pod, follow=follow):
        emit(line)
    return 0


def _wait_for_launcher(cluster: kube.Cluster, namespace: str, name: str) -> kube.LauncherPod:
    while True:
        pod = kube.launcher_pod(cluster, namespace, name)
        if pod and pod.phase != "Pending":
            return pod
        if jobstatus.outcome(kube.get_job(cluster, namespace, name).get("status")):
            raise UserError(f"MPIJob {namespace}/{name} ended before its launcher pod started")
        time.sleep(POD_POLL_SECONDS)
