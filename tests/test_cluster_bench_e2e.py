"""The scaling benchmark on a cluster, end to end without one: ``hvdk8s bench --cluster submit`` through the real
Kubernetes client against the API double, whose MPI Operator and Training Operator models (tests/controllers)
build each job's pods, and the real benchmark processes run in them on network-namespace hosts.

Five namespaces (``netns.cluster``, unshaped, own prefix and subnet) are the cluster's nodes; pod k of a job runs
on node k, with its own address, its pod name as hostname and the job's DNS names in its /etc/hosts (the
headless Services: the hostfile's ``<pod>.<job>.<ns>.svc`` for an MPIJob, TF_CONFIG's ``<pod>.<ns>.svc`` for a
TFJob). A pod runs its container's command with its container's environment (``HVDK8S_NODE_NAME`` resolved as the
downward API would) and what the controller adds: the hostfile and Open MPI's variables on an MPIJob's launcher,
TF_CONFIG in every TFJob task. Where this is not a pod: an MPIJob worker runs a listener on the ssh port instead
of sshd (the launcher's wait connects to it), and mpirun reaches the workers through tests/netns_pod_agent.py
instead of ssh, with Open MPI kept to the pods' interface. Every strategy runs at N = 1 and 3 (one task; the most pods) and the collector's
report has all of them; the allreduce jobs (the same MPIJob path, another worker) are left out to keep it short:
their bus bandwidth and prediction are tested from logs (tests/test_cluster_bench.py). Needs root, iproute2 and
Open MPI (make setup installs them).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from hvdk8s.benchmarks import cli
from hvdk8s.benchmarks.emulation import netns
from hvdk8s.benchmarks.harness import cluster_jobs
from hvdk8s.benchmarks.workers.cluster_entry import NODE_ENV

from conftest import shared
from controllers.running import OperatedDouble

PREFIX, SUBNET = "hvclus-", "10.216.0"  # no other test's (xdist: no shared state with the netns group)
NODES = 5  # the most pods a job has: tf_ps at N=3 (chief, 3 workers, a parameter server)
AGENT = Path(__file__).with_name("netns_pod_agent.py")
SSH_PORT = 2222  # the job file's sshPort, where the launcher's wait looks for each worker's sshd
LISTEN = "import socket,sys; s=socket.create_server(('0.0.0.0',int(sys.argv[1]))); [s.accept() for _ in iter(int,1)]"

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("mpirun") is None,
    reason="needs root, iproute2 and Open MPI (make setup installs them)",
)]


class NetnsPods:
    """The PodRunner of ``OperatedDouble``: pod k of a job on namespace host k, as a process tree there."""

    def __init__(self, cluster: netns.Cluster, work: Path) -> None:
        self.hosts, self.work = cluster.hosts, work
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.placed: dict[str, netns.Host] = {}
        self.lock = threading.Lock()

    def prepare(self, job: dict[str, Any], pods: list[dict[str, Any]], hostfile: str | None) -> dict[str, str]:
        name, ns = job["metadata"]["name"], job["metadata"]["namespace"]
        assert len(pods) <= len(self.hosts), f"{name}: {len(pods)} pods, {len(self.hosts)} nodes"
        self.placed = {p["metadata"]["name"]: host for p, host in zip(pods, self.hosts)}
        dns = [f"{pod}.{name}.{ns}.svc" if job["kind"] == "MPIJob" else f"{pod}.{ns}.svc" for pod in self.placed]
        etc_hosts = "127.0.0.1 localhost\n" + "".join(f"{host.ip} {fqdn} {pod}\n" for (pod, host), fqdn in
                                                      zip(self.placed.items(), dns))
        for host in self.hosts:  # `ip netns exec` mounts /etc/netns/<namespace>/hosts over /etc/hosts
            etc = Path("/etc/netns") / host.name
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(etc_hosts)
        if hostfile is not None:
            (self.work / "hostfile").write_text(hostfile)  # the MPI Operator's ConfigMap at /etc/mpi
            (self.work / "pods.json").write_text(json.dumps(
                {fqdn: {"netns": self.placed[pod].name, "hostname": pod} for pod, fqdn in zip(self.placed, dns)}))
        return {pod: host.name for pod, host in self.placed.items()}

    def run(self, job: dict[str, Any], pod: dict[str, Any], emit: Any) -> int:
        name = pod["metadata"]["name"]
        host = self.placed[name]
        container = pod["spec"]["containers"][0]
        argv = container["command"]
        env = {"PATH": f"{Path(sys.executable).parent}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "LD_LIBRARY_PATH": os.environ.get("LD_LIBRARY_PATH", ""), "HOME": "/root",
               **{e["name"]: e["value"] for e in container["env"] if "value" in e}, NODE_ENV: host.name}
        if argv[0] == "/usr/sbin/sshd":
            argv = [sys.executable, "-c", LISTEN, str(SSH_PORT)]
        elif job["kind"] == "MPIJob":  # the launcher: the hostfile, and Open MPI into the pods without ssh
            env |= {"OMPI_MCA_orte_default_hostfile": str(self.work / "hostfile"), "HVDK8S_TEST_PODS": str(self.work / "pods.json"),
                    "OMPI_MCA_plm_rsh_agent": f"{sys.executable} {AGENT}", "OMPI_MCA_oob_tcp_if_include": netns.HOST_IFACE,
                    "OMPI_MCA_btl_tcp_if_include": netns.HOST_IFACE}
        proc = subprocess.Popen(
            ["ip", "netns", "exec", host.name, "unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', name, *argv],
            cwd=self.work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        with self.lock:
            self.procs[name] = proc
        assert proc.stdout is not None
        for line in proc.stdout:
            emit(line.rstrip("\n"))
        return proc.wait()

    def kill(self, pod: dict[str, Any]) -> None:
        with self.lock:
            proc = self.procs.get(pod["metadata"]["name"])
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def finish(self, job: dict[str, Any]) -> None:
        with self.lock:  # every pod of the job has ended (the operator waited for each)
            self.procs = {pod: proc for pod, proc in self.procs.items() if pod not in self.placed}

    def cleanup(self) -> None:
        for host in self.hosts:
            shutil.rmtree(Path("/etc/netns") / host.name, ignore_errors=True)


def test_every_strategy_runs_at_1_and_3_workers_on_pods_built_as_the_controllers_build_them(tmp_path: Path) -> None:
    shared("schemas/tfjob-v1-crd.yaml")  # the double validates every job against its real CRD
    out = tmp_path / "out"
    with netns.cluster(NODES, None, prefix=PREFIX, subnet=SUBNET) as cluster:
        pods = NetnsPods(cluster, tmp_path)
        try:
            with OperatedDouble(pods) as double:
                kubeconfig = double.write_kubeconfig(tmp_path / "kubeconfig", namespace="bench")
                code = cli.main([
                    "--cluster", "submit", "--image", "hvdk8s:test", "--kubeconfig", str(kubeconfig), "--out", str(out),
                    "--workloads", "mlp", "--mlp-width", "32", "--ranks", "1,3", "--warmup", "1", "--steps", "2",
                    "--windows", "1", "--models", "1", "--rounds", "1", "--no-tta", "--sizes", "none",
                ])
                ran = double.ran
        finally:
            pods.cleanup()
    results = json.loads((out / "results.json").read_text())
    logs = {p.stem: p.read_text()[-3000:] for p in (out / "logs").glob("*.log")}
    assert code == 0 and results["errors"] == [], (results["errors"], logs)
    assert ran == [j for n in (1, 3) for j in (f"bench-hvdk8s-n{n}-r0", f"bench-horovod-n{n}-r0", f"bench-tf-mwms-n{n}-r0",
                                                  f"bench-tf-ps-n{n}-r0")]
    rows = {(r["strategy"], r["workers"]): r for r in results["derived"]["training"]["throughput"]}
    assert sorted(rows) == sorted((s, n) for s in cluster_jobs.DEFAULT_CLUSTER_STRATEGIES for n in (1, 3))
    assert all(r["examples_per_s"]["median"] > 0 and r["workload"] == "mlp" for r in rows.values())
    # each strategy's processes really ran as N workers: Horovod's size, MultiWorkerMirrored's replicas, PS workers
    for run in results["raw"]["training"]:
        assert run["result"]["throughput"][0]["workers"] == run["workers"], run["strategy"]
    c = results["cluster"]
    assert c["nodes"] == [h.name for h in netns.hosts(NODES, PREFIX, SUBNET)]
    pods_seen = {(p["job"], p["task"]): p for p in results["raw"]["cluster"]["pods"]}
    assert pods_seen[("bench-tf-ps-n3-r0", "chief 0")]["pod"] == "bench-tf-ps-n3-r0-chief-0"
    assert {p["task"] for (job, _), p in pods_seen.items() if job == "bench-horovod-n3-r0"} == {"rank 0", "rank 1", "rank 2"}
    md = (out / "report.md").read_text()
    assert f"**Cluster:** Kubernetes, {NODES} node(s) seen" in md and "TF ParameterServer (async) | 3 |" in md
