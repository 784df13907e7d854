"""A cluster run's results from its jobs' logs: the same results.json, report.md and plots as a local run.

Each job's log (an MPIJob launcher's, which carries every rank's output, or a TFJob's Chief / worker 0)
holds ``cluster_entry``'s ``HOST`` and ``RECORD`` lines. The records go where a local run's go (``raw``:
training runs; the allreduce runs under ``raw.cluster``), so ``analysis.derive`` and ``report`` read them
unchanged; ``cluster`` adds what only a cluster has: the pods, nodes and GPU models seen, and the
allreduce's bus bandwidth across the cluster beside the cost model's ring prediction for the network the
user names. ``report`` renders it as a local run's, with the cluster in place of the machine and its own
section after the header.
"""
from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hvdk8s.common import atomic
from hvdk8s.launcher.mpirun import rank_lines

from ..config.settings import STRATEGY_LABELS, Settings
from ..machine import envinfo
from ..reporting import analysis, costmodel, report
from ..workers.cluster_entry import HOST, MARKER, RECORD
from .cluster_jobs import BenchJob
from .suite import SCHEMA

NOT_EMULATED = "a cluster run measures the cluster's own network (see the Cluster section), not emulated links"


@dataclass
class JobLog:
    """What a job left: its result-bearing pod's log, the nodes its pods ran on (pod -> node, from the API where
    the collector could read them), and why it did not succeed (None when it did)."""

    job: BenchJob
    text: str
    pods: dict[str, str] = field(default_factory=dict)
    error: str | None = None


def marked(text: str) -> list[tuple[str, dict[str, Any]]]:
    """The (HOST or RECORD, data) lines of a log, with mpirun's per-write ``--tag-output`` prefixes undone."""
    out = []
    for _rank, line in rank_lines(text.splitlines()):
        head, _, rest = line.partition(" ")
        kind, _, payload = rest.partition(" ")
        if head == MARKER and kind in (HOST, RECORD):
            try:
                out.append((kind, json.loads(payload)))
            except json.JSONDecodeError:
                continue  # a line cut short (a killed process): its job then lacks a record, which is reported
    return out


def record_of(log: JobLog) -> tuple[dict[str, Any] | None, str | None]:
    """The job's result record, or why there is none (a job that did not succeed has none)."""
    records = [d for kind, d in marked(log.text) if kind == RECORD]
    job = log.job
    mine = [r for r in records if r.get("job") == job.name and r.get("kind") == job.kind]
    if log.error and mine:  # a job that failed after its record (teardown): not a measurement to keep
        return None, log.error
    if len(mine) != 1:
        found = f"{len(mine)} result records" if mine else "no result record"
        return None, f"{log.error + '; ' if log.error else ''}{found} in its log ({MARKER} {RECORD} line)"
    record = mine[0]
    if (record.get("strategy"), record.get("workers")) != (job.strategy, job.workers):
        return None, (f"its record is of {record.get('strategy')} N={record.get('workers')}, not the job's "
                      f"{job.strategy} N={job.workers}")
    return record, None


def results(settings: Settings, logs: Iterable[JobLog], *, network: str, command: list[str], started: str) -> dict[str, Any]:
    """results.json of a cluster run (schema of a local run's, plus ``raw.cluster`` and ``cluster``)."""
    raw: dict[str, Any] = {"training": [], "synthetic": [], "allreduce": [], "memcopy": None,
                           "emulated": {"skipped": NOT_EMULATED, "rates": []}, "profile": None, "knobs": [],
                           "cluster": {"network": network, "allreduce": [], "pods": [], "placement": {}}}
    errors, environment = [], None
    for log in logs:
        job = log.job
        raw["cluster"]["placement"][job.name] = dict(log.pods)
        for kind, host in marked(log.text):
            if kind == HOST and host.get("job") == job.name:
                raw["cluster"]["pods"].append(host | {"node": host.get("node") or log.pods.get(host.get("pod", ""))})
        record, problem = record_of(log)
        if record is None:
            errors.append({"job": job.name, "error": problem})
            continue
        environment = environment or record.get("environment")
        stats = {"wall_seconds": record["wall_seconds"], "cpu_seconds": None, "machine_busy_cores": None,
                 "log": f"logs/{job.name}.log"}
        if job.kind == "train":
            raw["training"].append({"strategy": job.strategy, "workers": job.workers, "round": job.round,
                                    "job": stats, "result": record["result"]})
        else:
            raw["cluster"]["allreduce"].append({"fusion": "default", "job": stats, "result": record["result"]})
    where = "the first result record's pod (every job's pods are listed under cluster.pods)"
    if environment is None:  # no job left a record: the collector's own, said so
        environment, where = envinfo.collect(command), "the collector's machine: no job left a result record"
    out = {
        "schema": SCHEMA,
        "settings": settings.to_json(),
        "environment": {**environment, "command": command, "where": where},
        "started": started,
        "finished": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "labels": {"strategies": STRATEGY_LABELS, "knobs": {}},
        "raw": raw,
        "errors": errors,
    }
    return derived(out)


def derived(results: dict[str, Any]) -> dict[str, Any]:
    """``derived`` (analysis.derive) from the raw data, and for a cluster run's results (``raw.cluster``) ``cluster``:
    what the collector and ``hvdk8s bench --report-only`` (either run's results) compute."""
    results["derived"] = json.loads(json.dumps(analysis.derive(results["raw"]), default=float))
    if "cluster" in results["raw"]:
        results["cluster"] = cluster(results["raw"]["cluster"])
    return results


def cluster(raw: dict[str, Any]) -> dict[str, Any]:
    """Nodes (those the processes reported and those the API placed the jobs' pods on), GPU models and pods seen;
    the allreduce's bus bandwidth, measured and as the cost model predicts it on the named network (its line rate
    and assumed latency, ``costmodel.NETWORKS``; ring, no fixed cost)."""
    pods = raw["pods"]
    placed = {node for on in raw["placement"].values() for node in on.values()}
    nodes = sorted({p["node"] for p in pods if p.get("node")} | placed)
    gpus: dict[str, set[str]] = {}
    for p in pods:
        for model in p.get("gpus") or []:
            gpus.setdefault(model, set()).add(p.get("node") or p["pod"])
    net = costmodel.NETWORKS[raw["network"]]
    rows = []
    for point in analysis.allreduce(raw["allreduce"], None)["sweep"]:
        n, nbytes = point["workers"], point["bytes"]
        predicted = nbytes / costmodel.ring_time(n, nbytes, net["alpha_s"], net["bytes_per_s"]) * analysis.busbw_factor(n)
        rows.append(point | {"predicted_busbw_bytes_per_s": predicted,
                             "measured_over_predicted": point["busbw_bytes_per_s"] / predicted})
    return {"nodes": nodes, "pods": len({(p["job"], p["pod"]) for p in pods}),
            "gpus": {model: sorted(on) for model, on in sorted(gpus.items())},
            "network": raw["network"], "network_note": net["note"], "allreduce": rows}


def write(results: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    """results.json, report.md and the plots in ``out_dir``."""
    paths = report.write(results, out_dir)
    atomic.write_json(out_dir / "results.json", results)
    return paths
