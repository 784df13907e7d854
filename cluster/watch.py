"""Follow an MPIJob or TrainJob until it ends: status changes from the watch API, launcher logs alongside.

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

from hvdk8s.cluster import jobstatus, kube
from hvdk8s.cluster.client import Cluster
from hvdk8s.cluster.kubeerrors import Action, watch_cut_message
from hvdk8s.common.errors import UserError

WATCH_SECONDS = 50  # per watch request; the server may end it sooner
POD_POLL_SECONDS = 2.0  # launcher-pod lookups between status changes
LOG_DRAIN_SECONDS = 30.0  # after the job ends, how long the last log lines may take to arrive
EXPLAIN_SECONDS = 60.0  # without the job running this long (and as often after), say why it waits
EXPLAIN_PODS = 5  # pending pods whose events are read each time
# A watch that ends sooner than this without an event did not work (client-go's reflector: "very short watch"):
# it is tried again after each of these waits in turn (a good watch starts them over), then the wait fails.
SHORT_WATCH_SECONDS = 1.0
SHORT_WATCH_WAITS = (0.5, 1.0, 2.0, 4.0, 8.0)


class Printer:
    """Status lines and log lines from two threads, whole lines, in order."""

    def __init__(self, job: str, kind: kube.JobKind = kube.MPIJOB):
        self.prefix = f"{kind.kind.lower()}/{job}: "
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


def job_updates(cluster: Cluster, namespace: str, name: str, watch_seconds: int = WATCH_SECONDS,
                kind: kube.JobKind = kube.MPIJOB) -> Iterator[dict]:
    """The job now, then each time it changes; ends when it is deleted (or was never there).

    Watches that end at once without an event (see ``SHORT_WATCH_WAITS``; an immediate 410 Gone is re-listed without
    a wait, but counted) end it with a UserError.
    """
    version = None
    waits = iter(SHORT_WATCH_WAITS)
    while True:
        if version is None:
            listing = kube.list_job(cluster, namespace, name, kind)
            if not listing.get("items"):
                return
            version = listing["metadata"]["resourceVersion"]
            yield listing["items"][0]
        began, events = time.monotonic(), 0
        try:
            for event, obj in kube.watch_job(cluster, namespace, name, version, watch_seconds, kind):
                events += 1
                version = obj["metadata"]["resourceVersion"]
                if event == "DELETED":
                    return
                if event in ("ADDED", "MODIFIED"):
                    yield obj
        except kube.WatchExpired:
            version = None
        if events or time.monotonic() - began >= SHORT_WATCH_SECONDS:
            waits = iter(SHORT_WATCH_WAITS)
        elif (wait := next(waits, None)) is not None:
            if version is not None:  # after a 410 the list comes at once (it is counted: one every time must not spin)
                time.sleep(wait)
        else:
            raise UserError(watch_cut_message(cluster.host, Action("watch", kind.resource, namespace, name),
                                              len(SHORT_WATCH_WAITS) + 1))


class LauncherLogs(threading.Thread):
    """Streams each launcher pod's log once it has started, including pods that replace it.

    Woken by :meth:`poke` on every status change (a launcher starting shows there), and
    by a slow poll; :meth:`finish` says the job has ended: stream what is left, then stop.
    """

    def __init__(self, cluster: Cluster, namespace: str, job: str, printer: Printer, kind: kube.JobKind):
        super().__init__(name=f"logs-{job}", daemon=True)
        self.cluster, self.namespace, self.job, self.printer, self.kind = cluster, namespace, job, printer, kind
        self._wake, self._done, self._stopped = threading.Event(), threading.Event(), threading.Event()

    def poke(self) -> None:
        self._wake.set()

    def finish(self) -> None:
        self._done.set()
        self._wake.set()

    def stop(self) -> None:
        """The wait has ended: a request still in flight ends silently (the verdict is said)."""
        self._stopped.set()
        self.finish()

    def run(self) -> None:
        streamed: set[str] = set()
        try:
            while True:
                pod = kube.launcher_pod(self.cluster, self.namespace, self.job, self.kind)
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
            if not self._stopped.is_set():
                self.printer.error(f"hvdk8s: cannot stream the launcher's logs: {err}")


class Explainer(threading.Thread):
    """Says why a job is not running yet (suspended, not picked up, unschedulable pods),
    every EXPLAIN_SECONDS until :meth:`stop` or the job runs; each reason once.

    It checks for itself whether a TrainJob runs: Trainer has no Running condition, and
    its launcher pod may start without the TrainJob's status changing.
    """

    def __init__(self, cluster: Cluster, namespace: str, job: str, printer: Printer, kind: kube.JobKind):
        super().__init__(name=f"explain-{job}", daemon=True)
        self.cluster, self.namespace, self.job, self.printer, self.kind = cluster, namespace, job, printer, kind
        self._stopped = threading.Event()

    def stop(self) -> None:
        self._stopped.set()

    def run(self) -> None:
        said: set[str] = set()
        while not self._stopped.wait(EXPLAIN_SECONDS):
            try:
                lines = self.reasons()
            except UserError as err:
                if not self._stopped.is_set():  # once the wait has ended, its answer stands alone
                    self.printer.error(f"hvdk8s: cannot tell why the job waits: {err}")
                return
            for line in lines:
                if line not in said and not self._stopped.is_set():
                    said.add(line)
                    self.printer.status(f"waiting: {line}")

    def reasons(self) -> list[str]:
        listed = kube.list_job(self.cluster, self.namespace, self.job, self.kind)["items"]
        if not listed:  # deleted meanwhile: the watch reports that
            return []
        job = listed[0]
        if jobstatus.started(jobstatus.phase(job.get("status"),
                                             launcher_phase(self.cluster, self.namespace, self.job, self.kind))):
            self.stop()
            return []
        pods = kube.job_pods(self.cluster, self.namespace, self.job, self.kind)
        pending = [p["metadata"]["name"] for p in pods if (p.get("status") or {}).get("phase") == "Pending"]
        events = {name: kube.events_about(self.cluster, self.namespace, name)
                  for name in [self.job, *pending[:EXPLAIN_PODS]]}
        return jobstatus.waiting_reasons(job, pods, events)


def launcher_phase(cluster: Cluster, namespace: str, name: str, kind: kube.JobKind) -> str | None:
    """A TrainJob's launcher pod phase, which its :func:`jobstatus.phase` needs (None: no such pod yet).
    None for an MPIJob, whose Running condition says it runs."""
    if kind is not kube.TRAINJOB:
        return None
    pod = kube.launcher_pod(cluster, namespace, name, kind)
    return pod.phase if pod else None


def wait_for_job(cluster: Cluster, namespace: str, name: str, follow_logs: bool,
                 printer: Printer | None = None, kind: kube.JobKind = kube.MPIJOB) -> int:
    """Report conditions and replica counts as they change until the job ends.

    Returns 0 when it Succeeded, 1 when it Failed (the operator's reason printed) or
    was deleted while we waited.
    """
    printer = printer or Printer(name, kind)
    logs = LauncherLogs(cluster, namespace, name, printer, kind) if follow_logs else None
    if logs:
        logs.start()
    seen_status: dict | None = None
    explainer = Explainer(cluster, namespace, name, printer, kind)
    explainer.start()
    try:
        for job in job_updates(cluster, namespace, name, kind=kind):
            status = job.get("status") or {}
            if jobstatus.started(jobstatus.phase(status)):  # a TrainJob's Running: the Explainer sees it
                explainer.stop()
            ended = jobstatus.outcome(status)
            if ended and logs:  # the last log lines come before the verdict
                logs.finish()
                logs.join(LOG_DRAIN_SECONDS)
            for line in jobstatus.transitions(seen_status, status):
                printer.status(line)
            seen_status = status
            if logs and not ended:
                logs.poke()
            if ended and ended.type in jobstatus.SUCCESS:
                return 0
            if ended:
                printer.error(f"hvdk8s: {jobstatus.failure_message(job)}")
                return 1
        printer.error(f"hvdk8s: {kind.kind} {namespace}/{name} was deleted before it finished")
        return 1
    finally:
        explainer.stop()
        if logs:
            logs.stop()


def wait_deleted(cluster: Cluster, namespace: str, name: str, kind: kube.JobKind = kube.MPIJOB) -> None:
    """Return once the job is gone (foreground deletion removes its pods first)."""
    for _ in job_updates(cluster, namespace, name, kind=kind):
        pass


def show_logs(cluster: Cluster, namespace: str, name: str, follow: bool,
              emit: Callable[[str], None] = print, kind: kube.JobKind = kube.MPIJOB) -> int:
    """``hvdk8s logs``: the newest launcher pod's log; with ``follow``, waits for it to start."""
    job = kube.get_job(cluster, namespace, name, kind)
    pod = kube.launcher_pod(cluster, namespace, name, kind)
    if follow and (pod is None or pod.phase == "Pending"):
        pod = _wait_for_launcher(cluster, namespace, name, kind)
    if pod is None:
        raise UserError(f"{kind.kind} {namespace}/{name} ({jobstatus.phase(job.get('status'))}) has no launcher pod: "
                        "not started yet (try --follow), or removed by runPolicy.cleanPodPolicy")
    if pod.phase == "Pending":
        raise UserError(f"launcher pod {pod.name} has not started yet (Pending): try again, or use --follow")
    for line in kube.log_lines(cluster, namespace, pod, follow=follow):
        emit(line)
    return 0


def _wait_for_launcher(cluster: Cluster, namespace: str, name: str, kind: kube.JobKind) -> kube.LauncherPod:
    while True:
        pod = kube.launcher_pod(cluster, namespace, name, kind)
        if pod and pod.phase != "Pending":
            return pod
        if jobstatus.outcome(kube.get_job(cluster, namespace, name, kind).get("status")):
            raise UserError(f"{kind.kind} {namespace}/{name} ended before its launcher pod started")
        time.sleep(POD_POLL_SECONDS)
