"""``hvdk8s bench --cluster submit`` through the real Kubernetes client against the API double, with the MPI
Operator and Training Operator models running each job's pods (tests/controllers/running.py) as scripts: the
result pod prints its records, servers serve until deleted. One job at a time, each deleted before the next;
the report from the logs; a missing Training Operator and a failed job said by name."""
from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from hvdk8s.benchmarks import cli
from hvdk8s.benchmarks.harness import cluster_jobs
from hvdk8s.benchmarks.workers.cluster_entry import MARKER, parse_args

from controllers import training_operator
from controllers.running import OperatedDouble
from test_cluster_bench import host, record

SETTINGS = ("--workloads", "mlp", "--ranks", "1,2", "--rounds", "1", "--no-tta", "--sizes", "4K", "--quick")


class ScriptedPods:
    """Each pod as a script: the job's result pod (MPIJob launcher, TFJob master) prints its HOST and RECORD
    lines and exits 0 (or ``fail`` for the jobs named there), servers and MPI workers (sshd) run until killed,
    other TF workers exit 0. Counts how many jobs have pods at once."""

    def __init__(self, fail: tuple[str, ...] = ()) -> None:
        self.fail, self.active, self.most = fail, set[str](), 0
        self.lock, self.killed = threading.Lock(), dict[str, threading.Event]()

    def prepare(self, job: dict[str, Any], pods: list[dict[str, Any]], hostfile: str | None) -> dict[str, str]:
        with self.lock:
            self.active.add(job["metadata"]["name"])
            self.most = max(self.most, len(self.active))
            for pod in pods:
                self.killed[pod["metadata"]["name"]] = threading.Event()
        return {p["metadata"]["name"]: f"node-{i % 3}" for i, p in enumerate(pods)}

    def run(self, job: dict[str, Any], pod: dict[str, Any], emit: Any) -> int:
        argv = pod["spec"]["containers"][0]["command"]
        labels = pod["metadata"]["labels"]
        if labels.get(training_operator.ROLE_LABEL) in ("launcher", "master"):
            args = parse_args(argv[argv.index(cluster_jobs.ENTRY[-1]) + 1:])
            bench = cluster_jobs.BenchJob(args.job_name, args.kind, args.strategy, args.workers, args.round, {})
            emit(host(bench, "rank 0", pod["metadata"]["name"], pod["spec"].get("nodeName"), []))
            emit(f"{MARKER} RECORD {json.dumps(record(bench, 100.0 * args.workers))}")
            return 1 if args.job_name in self.fail else 0
        if "--server" in argv or argv[0] == "/usr/sbin/sshd":
            self.killed[pod["metadata"]["name"]].wait(120)
            return 137
        return 0

    def kill(self, pod: dict[str, Any]) -> None:
        self.killed[pod["metadata"]["name"]].set()

    def finish(self, job: dict[str, Any]) -> None:
        with self.lock:
            self.active.discard(job["metadata"]["name"])


def submit(double: OperatedDouble, tmp_path: Path, *extra: str) -> int:
    kubeconfig = double.write_kubeconfig(tmp_path / "kubeconfig", namespace="bench")
    return cli.main(["--cluster", "submit", "--image", "img:1", "--kubeconfig", str(kubeconfig), *SETTINGS,
                     "--out", str(tmp_path / "out"), *extra])


def test_submit_runs_the_matrix_one_job_at_a_time_and_reports_it(tmp_path: Path) -> None:
    pods = ScriptedPods()
    with OperatedDouble(pods) as double:
        assert submit(double, tmp_path) == 0
        assert double.jobs == {} and double.pods == {}  # every job deleted, with its pods
    names = ["bench-hvdk8s-n1-r0", "bench-horovod-n1-r0", "bench-tf-mwms-n1-r0", "bench-tf-ps-n1-r0",
             "bench-hvdk8s-n2-r0", "bench-horovod-n2-r0", "bench-tf-mwms-n2-r0", "bench-tf-ps-n2-r0", "bench-allreduce-n2"]
    assert double.ran == names and pods.most == 1
    created = [(path.rsplit("/", 1)[-1], args.get("dryRun")) for method, path, args in double.requests
               if method == "POST"]
    assert created == [("mpijobs", None), ("mpijobs", None), ("tfjobs", None), ("tfjobs", None)] * 2 + [("mpijobs", None)]
    out = tmp_path / "out"
    results = json.loads((out / "results.json").read_text())
    assert results["errors"] == []
    assert sorted((r["strategy"], r["workers"]) for r in results["raw"]["training"]) == sorted(
        (s, n) for s in cluster_jobs.DEFAULT_CLUSTER_STRATEGIES for n in (1, 2))
    assert [r["result"]["ranks"] for r in results["raw"]["cluster"]["allreduce"]] == [2]
    assert sorted(p.name for p in (out / "logs").iterdir()) == sorted(f"{n}.log" for n in names)
    assert "**Cluster:** Kubernetes, 3 node(s) seen" in (out / "report.md").read_text()


def test_without_the_training_operator_nothing_is_created_and_the_user_is_told(tmp_path: Path, capsys) -> None:
    with OperatedDouble(ScriptedPods(), training_operator=False) as double:
        assert submit(double, tmp_path) == 2
        assert double.ran == [] and not [r for r in double.requests if r[0] == "POST"]
    assert not (tmp_path / "out" / "results.json").exists()  # nothing ran, nothing to report
    err = capsys.readouterr().err
    assert "the cluster does not serve kubeflow.org/v1 TFJobs: the Kubeflow Training Operator is not installed" in err


def test_a_failed_job_is_reported_and_deleted_and_the_others_still_run(tmp_path: Path, capsys) -> None:
    pods = ScriptedPods(fail=("bench-tf-ps-n2-r0",))
    with OperatedDouble(pods) as double:
        assert submit(double, tmp_path, "--strategies", "hvdk8s,tf_ps", "--sizes", "none") == 1
        assert double.jobs == {} and double.ran == ["bench-hvdk8s-n1-r0", "bench-tf-ps-n1-r0", "bench-hvdk8s-n2-r0",
                                                    "bench-tf-ps-n2-r0"]
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [e["job"] for e in results["errors"]] == ["bench-tf-ps-n2-r0"]
    assert results["errors"][0]["error"].startswith("TFJob bench/bench-tf-ps-n2-r0 failed (TFJobFailed)")
    assert len(results["raw"]["training"]) == 3
    assert "error in bench-tf-ps-n2-r0" in capsys.readouterr().err

