"""The suite's training matrix as Kubernetes jobs: MPIJobs for the Horovod strategies, TFJobs for TensorFlow's.

``hvdk8s bench --cluster render`` prints them, ``--cluster submit`` runs them one at a time. Every job
is built from one job file (``--job-file``: image, queue, priority class, node selectors, tolerations,
GPUs, RDMA resources, user, volumes: the fields ``hvdk8s render`` reads) with the same settings (workload,
per-rank batch, warm-up, steps, windows, threads) for every strategy, and N worker pods of one process
each: hvdk8s and the raw Horovod loop as MPIJobs through ``hvdk8s.mpijob.render`` (mpirun ranks, one per
worker pod), MultiWorkerMirrored as a TFJob of N Workers, parameter-server TensorFlow as a TFJob of a
Chief (the coordinator, no GPU), N Workers and one PS, as the local suite runs them
(``suite.Suite._train_job``). With ``allreduce_sizes``, an allreduce microbenchmark MPIJob runs at every
N >= 2. Each process runs ``cluster_entry``; pure functions, nothing here talks to a cluster.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hvdk8s.common.errors import UserError
from hvdk8s.common.files import read_yaml, to_yaml
from hvdk8s.mpijob import tfjob
from hvdk8s.mpijob.files import checked_render, load_spec

from ..config.settings import HOROVOD_STRATEGIES, Settings
from ..machine.launch import rank_env
from ..workers.cluster_entry import NODE_ENV
from .suite import allreduce_job_data, train_job_data, training_configs

ENTRY = ("python", "-m", "hvdk8s.benchmarks.workers.cluster_entry")
TF_STRATEGIES = ("tf_mwms", "tf_ps")
# Strategies a cluster run can launch: the MPIJob ones differ from hvdk8s only in the worker's code.
CLUSTER_STRATEGIES = ("single", "hvdk8s", "horovod", "hvdk8s_fp16", "hvdk8s_spe", *TF_STRATEGIES)
DEFAULT_CLUSTER_STRATEGIES = ("hvdk8s", "horovod", "tf_mwms", "tf_ps")
# Job-file fields the benchmark sets itself, per job.
BENCH_FIELDS = {"command": "each job's command is the benchmark's", "workers": "N comes from --ranks",
                "elastic": "the benchmark's jobs have a fixed size", "runLauncherAsWorker": "ranks run on worker pods only"}
DEFAULT_NAME = "bench"


@dataclass(frozen=True)
class BenchJob:
    """One job of the matrix: ``kind`` train (a ``strategy`` at N=``workers``, round ``round``) or allreduce."""

    name: str
    kind: str
    strategy: str | None
    workers: int
    round: int
    manifest: dict[str, Any]


def base_job(path: str | None, image: str | None) -> tuple[dict[str, Any], str]:
    """The job file's fields (none without ``path``), ``image`` laid over them, and where they came from;
    refuses fields the benchmark sets itself and more than one process per pod."""
    origin = path or "--image"
    data: dict[str, Any] = {}
    if path:
        loaded = read_yaml(path)
        if not isinstance(loaded, dict):
            raise UserError(f"{path}: must be a mapping of job-spec fields")
        data = loaded
    if image:
        data = data | {"image": image}
    if "image" not in data:
        raise UserError("--cluster needs the image the jobs run: --image IMAGE, or image: in --job-file")
    for key, why in BENCH_FIELDS.items():
        if key in data:
            raise UserError(f"{origin}: {key}: remove it ({why})")
    if data.get("slotsPerWorker", 1) != 1:
        raise UserError(f"{origin}: slotsPerWorker: 1 (one process, and GPU, per pod, so that N counts the same "
                        "thing for every strategy; TensorFlow's strategies run one task per pod)")
    return data, origin


def check_settings(s: Settings) -> None:
    """Refuse what a cluster run cannot do (UserError naming the setting)."""
    if bad := [x for x in s.strategies if x not in CLUSTER_STRATEGIES]:
        raise UserError(f"--strategies {','.join(bad)}: not run on a cluster (it runs {', '.join(CLUSTER_STRATEGIES)})")
    if bad := [w for w in s.workloads if w not in s.suite_workloads]:
        raise UserError(f"--workloads {','.join(bad)}: Horovod's synthetic scripts are not run on a cluster")
    if s.knobs or s.profile:
        raise UserError("--knobs and --profile are local studies; a cluster run has neither")


def job_name(prefix: str, kind: str, n: int, r: int | None = None) -> str:
    return f"{prefix}-{kind.replace('_', '-')}-n{n}" + (f"-r{r}" if r is not None else "")


def matrix(s: Settings, base: Mapping[str, Any], origin: str) -> list[BenchJob]:
    """Every job of the run, in the order they run: the training matrix interleaved by round
    (``suite.training_configs``), then the allreduce microbenchmark at every N >= 2."""
    check_settings(s)
    prefix = base.get("name", DEFAULT_NAME)
    jobs = []
    for r, strategy, n in training_configs(s):
        name = job_name(prefix, strategy, n, r)
        job = train_job_data(s, strategy, r, tta=True)  # as the local suite's training matrix
        command = [*ENTRY, "train", "--job-name", name, "--strategy", strategy, "--workers", str(n), "--round", str(r),
                   "--job-json", json.dumps(job, separators=(",", ":"))]
        threads = None if job["own_threads"] else s.threads_per_rank
        jobs.append(BenchJob(name, "train", strategy, n, r, _manifest(base, origin, name, strategy, n, command, threads)))
    if s.allreduce_sizes:
        job = allreduce_job_data(s, list(s.allreduce_sizes), [])
        for n in (n for n in s.ranks if n >= 2):
            name = job_name(prefix, "allreduce", n)
            command = [*ENTRY, "allreduce", "--job-name", name, "--workers", str(n),
                       "--job-json", json.dumps(job, separators=(",", ":"))]
            jobs.append(BenchJob(name, "allreduce", None, n, 0,
                                 _manifest(base, origin, name, "horovod", n, command, s.threads_per_rank)))
    return jobs


def _manifest(base: Mapping[str, Any], origin: str, name: str, strategy: str, n: int, command: list[str],
              threads: int | None) -> dict[str, Any]:
    """One job, validated as ``hvdk8s render`` validates a job file; its ranks get ``threads`` as the local
    launcher's do (``launch.rank_env``), under the job file's env. Every container is given its node (``NODE_ENV``),
    which a TFJob's tasks read; an MPIJob's ranks, started through sshd, never see it (the collector takes their
    nodes from the API's placement of the pods)."""
    data = {**base, "name": name, "command": command, "workers": n, "env": rank_env(threads) | dict(base.get("env") or {})}
    where = f"{origin} (job {name})"
    spec = load_spec(data, origin=where)
    if strategy in HOROVOD_STRATEGIES or strategy == "single":
        manifest = checked_render(spec, where)
        templates = [r["template"] for r in manifest["spec"]["mpiReplicaSpecs"].values()]
    else:
        ps = strategy == "tf_ps"
        manifest = tfjob.checked_render_tfjob(spec, where, chief=ps, ps=int(ps), serve_command=[*command, "--server"])
        templates = [r["template"] for r in manifest["spec"]["tfReplicaSpecs"].values()]
    for template in templates:
        for container in template["spec"]["containers"]:
            container["env"].append({"name": NODE_ENV, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}})
    return manifest


def render_yaml(jobs: list[BenchJob]) -> str:
    """The whole matrix as one multi-document YAML, with how to run it."""
    head = (f"# hvdk8s bench --cluster: {len(jobs)} jobs. Run them one at a time, each after the previous one has "
            "finished and been deleted\n# (hvdk8s bench --cluster submit does that and collects the report); "
            "applied together they would measure each other.\n")
    return head + to_yaml(*(job.manifest for job in jobs))
