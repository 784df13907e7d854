"""``hvdk8s bench --cluster``: the matrix as MPIJobs and TFJobs valid against their real CRDs, and the collector
that turns the jobs' logs into the local run's results.json and report (fast: no TensorFlow, no processes).
Submitting through the API double and the run on network-namespace pods: tests/test_cluster_bench_e2e.py."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from hvdk8s.benchmarks import cli
from hvdk8s.benchmarks.config.settings import preset
from hvdk8s.benchmarks.harness import cluster_collect, cluster_jobs
from hvdk8s.benchmarks.machine import envinfo
from hvdk8s.benchmarks.workers import cluster_entry
from hvdk8s.benchmarks.workers.cluster_entry import MARKER

from test_mpijob_schema import crd_errors, template_errors
from test_tfjob import tfjob_crd_errors

pytestmark = pytest.mark.unit

JOB_FILE = {
    "name": "scale", "image": "registry.example/hvdk8s:gpu", "namespace": "team-a", "queue": "gpu-queue", "gpu": True,
    "hostNetwork": True, "capabilities": ["IPC_LOCK"],
    "resources": {"worker": {"cpu": "8", "memory": "32Gi", "extra": {"rdma/hca_shared_devices_a": "1"}}},
    "scheduling": {"gpuProduct": "NVIDIA-H100-80GB-HBM3", "priorityClassName": "bench", "nodeSelector": {"pool": "a"},
                   "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
}
SETTINGS = ("--workloads", "mlp", "--ranks", "1,2,3", "--steps", "4", "--warmup", "2", "--windows", "1",
            "--models", "1", "--rounds", "1", "--no-tta", "--sizes", "4K,1M", "--mlp-width", "64")


def rendered(tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> list[dict[str, Any]]:
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(JOB_FILE))
    assert cli.main(["--cluster", "render", "--job-file", str(job_file), *SETTINGS, *extra]) == 0
    return list(yaml.safe_load_all(capsys.readouterr().out))


def command_of(manifest: dict[str, Any]) -> list[str]:
    """The benchmark command of a job: the MPIJob launcher's after mpirun's flags, the TFJob's first task's."""
    if manifest["kind"] == "MPIJob":
        argv = manifest["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["command"]
    else:
        argv = next(iter(manifest["spec"]["tfReplicaSpecs"].values()))["template"]["spec"]["containers"][0]["command"]
    return argv[argv.index(cluster_jobs.ENTRY[-1]) - 2:]


def test_the_matrix_renders_as_mpijobs_and_tfjobs_valid_against_their_crds(tmp_path: Path, capsys) -> None:
    objects = rendered(tmp_path, capsys)
    assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [
        *[(kind, f"scale-{s}-n{n}-r0") for n in (1, 2, 3) for kind, s in
          (("MPIJob", "hvdk8s"), ("MPIJob", "horovod"), ("TFJob", "tf-mwms"), ("TFJob", "tf-ps"))],
        ("MPIJob", "scale-allreduce-n2"), ("MPIJob", "scale-allreduce-n3"),
    ]
    for o in objects:
        if o["kind"] == "MPIJob":
            assert crd_errors(o) == [], o["metadata"]["name"]
            templates = {role: r["template"] for role, r in o["spec"]["mpiReplicaSpecs"].items()}
        else:
            assert tfjob_crd_errors(o) == [], o["metadata"]["name"]
            templates = {role: r["template"] for role, r in o["spec"]["tfReplicaSpecs"].items()}
        assert template_errors(templates) == [], o["metadata"]["name"]
        # the job file's cluster knobs on every job
        assert o["metadata"]["namespace"] == "team-a"
        assert o["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"
        for role, template in templates.items():
            pod = template["spec"]
            assert pod["priorityClassName"] == "bench" and pod["tolerations"][0]["key"] == "nvidia.com/gpu"
            container = pod["containers"][0]
            assert container["image"] == JOB_FILE["image"]
            assert {"name": "HVDK8S_NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in container["env"]
            if role in ("Worker", "PS", "Chief"):
                assert pod["nodeSelector"]["pool"] == "a"
                assert container["resources"]["limits"]["rdma/hca_shared_devices_a"] == "1"
                assert container["resources"]["limits"].get("nvidia.com/gpu") == (1 if role == "Worker" else None)


def test_every_strategy_trains_the_same_workload_batch_steps_and_warm_up(tmp_path: Path, capsys) -> None:
    trains = []
    for o in rendered(tmp_path, capsys):
        argv = command_of(o)
        job = json.loads(argv[argv.index("--job-json") + 1])
        if argv[3] == "train":
            trains.append((argv[argv.index("--strategy") + 1], int(argv[argv.index("--workers") + 1]), job))
        else:
            assert job["sizes"] == [4096, 1 << 20] and job["fusion_tensor_bytes"] == []
    assert {(s, n) for s, n, _ in trains} == {(s, n) for s in cluster_jobs.DEFAULT_CLUSTER_STRATEGIES for n in (1, 2, 3)}
    for _s, _n, job in trains:
        assert job["workloads"] == ["mlp"] and job["tta"] is False
        settings = job["settings"]
        assert (settings["mlp_batch"], settings["mlp_width"], settings["steps"], settings["warmup_steps"],
                settings["windows"]) == (8, 64, 4, 2, 1)
    # the layouts of the local suite: N workers; for PS also a Chief (coordinator) and one parameter server
    tf = {o["metadata"]["name"]: o["spec"]["tfReplicaSpecs"] for o in rendered(tmp_path, capsys) if o["kind"] == "TFJob"}
    assert {r: s["replicas"] for r, s in tf["scale-tf-ps-n3-r0"].items()} == {"Chief": 1, "Worker": 3, "PS": 1}
    assert {r: s["replicas"] for r, s in tf["scale-tf-mwms-n3-r0"].items()} == {"Worker": 3}


@pytest.mark.parametrize(("fields", "flags", "message"), [
    ({"command": ["python", "x.py"]}, (), "job.yaml: command: remove it (each job's command is the benchmark's)"),
    ({"workers": 4}, (), "job.yaml: workers: remove it (N comes from --ranks)"),
    ({"slotsPerWorker": 8}, (), "job.yaml: slotsPerWorker: 1 (one process, and GPU, per pod"),
    ({}, ("--strategies", "hvdk8s,hvdk8s_rd"), "--strategies hvdk8s_rd: not run on a cluster"),
    ({}, ("--knobs", "cycle_0.1ms"), "--knobs and --profile are local studies"),
])
def test_what_a_cluster_run_cannot_do_is_refused_by_name(tmp_path: Path, capsys, fields, flags, message) -> None:
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump({"image": "img:1"} | fields))
    assert cli.main(["--cluster", "render", "--job-file", str(job_file), *SETTINGS, *flags]) == 2
    assert message in capsys.readouterr().err


# --- the collector ------------------------------------------------------------------------------------------
def record(job: cluster_jobs.BenchJob, rate: float) -> dict[str, Any]:
    """A worker's result as ``worker.main`` writes it (the fields analysis reads), under cluster_entry's record."""
    if job.kind == "allreduce":
        result: dict[str, Any] = {"ranks": job.workers, "sweep": [{"bytes": b, "iters": 10, "seconds_per_iter": [b / rate] * 2}
                                                                  for b in (4096, 1 << 20)], "fusion": []}
    else:
        result = {"strategy": job.strategy, "throughput": [{
            "workload": "mlp", "description": "MLP", "params": 10, "gradient_bytes": 40, "batch_per_rank": 8,
            "workers": job.workers, "models": 1, "steps_per_window": 4, "examples_per_window": 32 * job.workers,
            "window_seconds": [32 * job.workers / rate]}]}
    return {"job": job.name, "kind": job.kind, "strategy": job.strategy, "workers": job.workers, "round": job.round,
            "wall_seconds": 9.0, "result": result, "environment": envinfo.collect(["python", "-m", "x"])}


def host(job: cluster_jobs.BenchJob, task: str, pod: str, node: str | None, gpus: list[str]) -> str:
    data = {"job": job.name, "task": task, "pod": pod, "node": node, "gpus": gpus, "cpu_count": 8}
    return f"{MARKER} HOST {json.dumps(data)}"


def logs_of(jobs: list[cluster_jobs.BenchJob]) -> list[cluster_collect.JobLog]:
    out = []
    for job in jobs:
        line = f"{MARKER} RECORD {json.dumps(record(job, 1000.0 * job.workers ** 0.5))}"
        pods = {f"{job.name}-worker-{i}": f"node-{i}" for i in range(job.workers)}
        if job.manifest["kind"] == "MPIJob":
            # mpirun --tag-output tags each write: rank 0's record arrives in two writes, rank 1's line between them
            half = len(line) // 2
            text = "\n".join([f"[1,{i}]<stdout>:{host(job, f'rank {i}', f'{job.name}-worker-{i}', None, ['NVIDIA H100'])}"
                              for i in range(job.workers)]
                             + [f"[1,0]<stdout>:{line[:half]}[1,1]<stdout>:worker hvdk8s: mlp done",
                                f"[1,0]<stdout>:{line[half:]}", "mpirun: done"])
            out.append(cluster_collect.JobLog(job, text, pods))
        else:
            text = "\n".join([host(job, "worker 0", f"{job.name}-worker-0", "node-0", ["NVIDIA H100"]), "2025 TF noise", line])
            out.append(cluster_collect.JobLog(job, text, {}))
    return out


def matrix() -> list[cluster_jobs.BenchJob]:
    settings = preset("quick", strategies=cluster_jobs.DEFAULT_CLUSTER_STRATEGIES, workloads=("mlp",), ranks=(1, 2, 3),
                      rounds=1, tta=False, allreduce_sizes=(4096, 1 << 20))
    return cluster_jobs.matrix(settings, {"image": "img:1"}, "test")


def collected(logs: list[cluster_collect.JobLog]) -> dict[str, Any]:
    settings = preset("quick", strategies=cluster_jobs.DEFAULT_CLUSTER_STRATEGIES, workloads=("mlp",), ranks=(1, 2, 3),
                      rounds=1, tta=False)
    return cluster_collect.results(settings, logs, network="100 GbE", command=["hvdk8s", "bench", "--cluster", "collect"],
                                   started="2025-01-01T00:00:00+00:00")


def test_the_collector_builds_a_local_runs_results_from_the_logs_records() -> None:
    jobs = matrix()
    results = collected(logs_of(jobs))
    assert results["errors"] == []
    rows = results["derived"]["training"]["throughput"]
    assert {(r["strategy"], r["workers"]) for r in rows} == {(s, n) for s in cluster_jobs.DEFAULT_CLUSTER_STRATEGIES
                                                             for n in (1, 2, 3)}
    hvdk8s3 = next(r for r in rows if (r["strategy"], r["workers"]) == ("hvdk8s", 3))
    assert hvdk8s3["examples_per_s"]["median"] == pytest.approx(1000 * 3 ** 0.5)
    assert hvdk8s3["efficiency_vs_own_n1"] == pytest.approx(3 ** 0.5 / 3)
    c = results["cluster"]
    # nodes: the MPIJob ranks' from the API (pod -> node), the TF tasks' own; GPU models as the processes saw them
    assert c["nodes"] == ["node-0", "node-1", "node-2"] and c["gpus"] == {"NVIDIA H100": ["node-0", "node-1", "node-2"]}
    busbw = {(r["workers"], r["bytes"]): r for r in c["allreduce"]}
    assert sorted(busbw) == [(2, 4096), (2, 1 << 20), (3, 4096), (3, 1 << 20)]
    big = busbw[(3, 1 << 20)]
    assert big["busbw_bytes_per_s"] == pytest.approx(1000 * 3 ** 0.5 * 4 / 3)  # bytes/time x 2(N-1)/N
    # the cost model's ring on 100 GbE: 12.5 GB/s line rate, 5 us alpha
    t = 4 / 3 * (1 << 20) / 12.5e9 + 4 * 5e-6
    assert big["predicted_busbw_bytes_per_s"] == pytest.approx((1 << 20) / t * 4 / 3)


def test_a_job_without_its_record_or_with_another_jobs_is_an_error_not_a_row() -> None:
    jobs = matrix()
    logs = logs_of(jobs)
    logs[0] = cluster_collect.JobLog(jobs[0], "Traceback (most recent call last):\n", error="MPIJob team-a/x failed")
    logs[1] = cluster_collect.JobLog(jobs[1], logs[2].text)  # the tf_mwms job's record in horovod's log
    errors = {e["job"]: e["error"] for e in collected(logs)["errors"]}
    assert errors == {jobs[0].name: "MPIJob team-a/x failed; no result record in its log (HVDK8S-BENCH RECORD line)",
                      jobs[1].name: "no result record in its log (HVDK8S-BENCH RECORD line)"}


def test_the_report_is_the_local_runs_with_the_cluster_in_place_of_the_machine(tmp_path: Path) -> None:
    results = collected(logs_of(matrix()))
    cluster_collect.write(results, tmp_path)
    md = (tmp_path / "report.md").read_text()
    assert "**Cluster:** Kubernetes, 3 node(s) seen (node-0, node-1, node-2)" in md
    assert "GPUs: NVIDIA H100 on 3 node(s)" in md
    assert "**Machine:**" not in md and "this machine has" not in md and "measured on this machine" not in md
    assert "## Cluster: jobs, pods and nodes (measured on the cluster)" in md
    assert "## 1. Training throughput and scaling efficiency (measured on the cluster)" in md
    assert "busbw predicted" in md and (tmp_path / "throughput.png").exists()
    assert json.loads((tmp_path / "results.json").read_text())["cluster"]["network"] == "100 GbE"
    # --report-only re-derives both, from the raw records
    (tmp_path / "report.md").unlink()
    assert cli.main(["--report-only", str(tmp_path / "results.json")]) == 0
    assert (tmp_path / "report.md").read_text() == md


def test_a_one_task_tfjob_gets_the_one_worker_cluster_a_local_run_gives_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Training Operator writes no TF_CONFIG for a one-task TFJob (tests/controllers/training_operator.py,
    ``distributed``); MultiWorkerMirrored would then have no chief to write the result."""
    monkeypatch.delenv("TF_CONFIG", raising=False)
    cluster_entry.one_task_cluster("tf_ps")
    assert "TF_CONFIG" not in os.environ
    cluster_entry.one_task_cluster("tf_mwms")
    assert json.loads(os.environ["TF_CONFIG"]) == {"cluster": {"worker": ["localhost:2222"]},
                                                   "task": {"type": "worker", "index": 0}}
    monkeypatch.setenv("TF_CONFIG", "{}")  # the operator's own, for a job of more tasks, is left as it is
    cluster_entry.one_task_cluster("tf_mwms")
    assert os.environ["TF_CONFIG"] == "{}"
