"""Entry point of every process of a cluster benchmark job (``hvdk8s bench --cluster``), in its pod.

    python -m hvdk8s.benchmarks.workers.cluster_entry train --job-name J --strategy S --workers N --round R --job-json JSON [--server]
    python -m hvdk8s.benchmarks.workers.cluster_entry allreduce --job-name J --workers N --job-json JSON

Runs the suite's own process (``worker`` for training, ``comm_worker allreduce``) on the job the JSON
describes, as a local run's ``Launcher`` runs it, with two additions for a cluster, where the only thing
that leaves a pod is its log: each process first prints a ``HOST`` line (its pod, its node where its
environment has it, and GPUs), and the process that wrote a result (rank 0, the Chief, worker 0) prints it
as a ``RECORD`` line, the same record a local run keeps, with this pod's environment. Both are one line of JSON after ``MARKER``; mpirun's
``--tag-output`` prefixes are undone by the collector.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MARKER = "HVDK8S-BENCH"
HOST, RECORD = "HOST", "RECORD"
NODE_ENV = "HVDK8S_NODE_NAME"  # the pod's node, from the downward API (spec.nodeName)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kind", choices=("train", "allreduce"))
    p.add_argument("--job-name", required=True, help="the Kubernetes job this process belongs to")
    p.add_argument("--job-json", required=True, help="what the suite writes to a job file: settings, workloads, ...")
    p.add_argument("--workers", type=int, required=True, help="N of the matrix")
    p.add_argument("--strategy", default=None)
    p.add_argument("--round", type=int, default=0)
    p.add_argument("--server", action="store_true", help="a TF task that only serves (parameter servers, PS workers)")
    return p.parse_args(argv)


def gpu_models() -> list[str]:
    """The GPUs this container sees (the device plugin exposes only those allocated to it); none without nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return []
    done = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True)
    return [line.strip() for line in done.stdout.splitlines() if line.strip()] if done.returncode == 0 else []


def task() -> str:
    """This process's place in its job: its MPI rank or its TF_CONFIG task."""
    if "OMPI_COMM_WORLD_RANK" in os.environ:
        return f"rank {os.environ['OMPI_COMM_WORLD_RANK']}"
    if config := os.environ.get("TF_CONFIG"):
        t = json.loads(config).get("task", {})
        return f"{t.get('type')} {t.get('index')}"
    return "single"


def one_task_cluster(strategy: str | None) -> None:
    """A TFJob of one task gets no TF_CONFIG (the Training Operator's isDistributed, release-1.9
    ``pkg/controller.v1/tensorflow/util.go``), without which MultiWorkerMirrored runs in its local mode (no
    server, no cross-worker collectives): give it the one-worker cluster a local run gives it, so that N=1, the
    baseline of its scaling, runs as the local suite's N=1 does."""
    if strategy == "tf_mwms" and "TF_CONFIG" not in os.environ:
        from hvdk8s.mpijob.tfjob import PORT  # the pod's tfjob-port

        os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": [f"localhost:{PORT}"]},
                                              "task": {"type": "worker", "index": 0}})


def host_info(job: str) -> dict[str, Any]:
    return {"job": job, "task": task(), "pod": socket.gethostname(), "node": os.environ.get(NODE_ENV) or None,
            "gpus": gpu_models(), "cpu_count": os.cpu_count()}


def emit(kind: str, data: dict[str, Any]) -> None:
    print(f"{MARKER} {kind} {json.dumps(data, separators=(',', ':'))}", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    one_task_cluster(args.strategy)
    emit(HOST, host_info(args.job_name))
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="hvdk8s-bench-") as tmp:
        job, out = Path(tmp) / "job.json", Path(tmp) / "result.json"
        job.write_text(args.job_json)
        if args.kind == "train":
            from . import worker

            code = worker.main(["--strategy", args.strategy, "--job", str(job), "--out", str(out),
                                *(["--server"] if args.server else [])])
        else:
            from . import comm_worker

            code = comm_worker.main(["allreduce", "--job", str(job), "--out", str(out)])
        if out.exists():
            from ..machine.envinfo import collect

            emit(RECORD, {"job": args.job_name, "kind": args.kind, "strategy": args.strategy, "workers": args.workers,
                          "round": args.round, "wall_seconds": time.time() - started,
                          "result": json.loads(out.read_text()), "environment": collect(sys.argv)})
    return code


if __name__ == "__main__":
    sys.exit(main())
