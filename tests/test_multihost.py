"""The rendered MPIJob's launcher command, run for real across emulated pods.

Each pod is a Linux network namespace with its own address (built by the
benchmarks' emulated-cluster module, unshaped) and its own host name (UTS
namespace). Workers run the manifest's sshd; the
launcher gets what the MPI Operator would give it (the hostfile with the
workers' DNS names, ``OMPI_MCA_*`` variables, the ssh key) and runs the
manifest's command unchanged. Needs root and iproute2 (CI has both).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from hvdk8s import mpijob
from hvdk8s.benchmarks import netns

from conftest import REPO

JOB = "mh"
NAMESPACE = "default"
SSH_PORT = 2222  # the image's sshd and ssh client port (Dockerfile.gpu, job spec sshPort)
SUBNET = "10.231.7"
PREFIX = f"hvk8s-{os.getpid()}-"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None or not Path("/usr/sbin/sshd").exists(),
    reason="needs root, iproute2 and openssh-server (make setup installs them)",
)


@dataclass(frozen=True)
class Pod:
    hostname: str  # as the operator names it (<job>-worker-<i> / <job>-launcher)
    netns: str
    ip: str

    @property
    def fqdn(self) -> str:
        # The job's headless Service (operator v0.5+): <job>-worker-<i>.<job>.<namespace>.svc, as in its hostfile.
        return f"{self.hostname}.{JOB}.{NAMESPACE}.svc"

    def exec_argv(self, argv: list[str]) -> list[str]:
        """Run argv in this pod: its network namespace, and its own host name."""
        return [
            "ip", "netns", "exec", self.netns, "unshare", "--uts", "--",
            "sh", "-c", 'hostname "$0" && exec "$@"', self.hostname, *argv,
        ]  # fmt: skip


def run(argv: list[str]) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True)


@pytest.fixture
def pods(tmp_path: Path) -> Iterator[tuple[Pod, list[Pod]]]:
    with netns.cluster(3, None, prefix=PREFIX, subnet=SUBNET) as cluster:
        launcher, *workers = [
            Pod(name, host.name, host.ip)
            for name, host in zip([f"{JOB}-launcher", f"{JOB}-worker-0", f"{JOB}-worker-1"], cluster.hosts)
        ]
        with sshd_workers(launcher, workers, tmp_path):
            yield launcher, workers


@contextmanager
def sshd_workers(launcher: Pod, workers: list[Pod], tmp_path: Path) -> Iterator[None]:
    """The pods' DNS names in each pod's /etc/hosts, and the manifest's sshd in each worker pod."""
    hosts_file = "".join(f"{p.ip} {p.fqdn} {p.hostname}\n" for p in [launcher, *workers])
    sshd_pids: list[Path] = []
    try:
        for pod in [launcher, *workers]:
            etc = Path("/etc/netns") / pod.netns  # `ip netns exec` mounts these over /etc
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text("127.0.0.1 localhost\n" + hosts_file)
        # The operator's ssh Secret: one key pair, authorized on every worker.
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "id_ed25519")])
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "host_key")])
        shutil.copy(tmp_path / "id_ed25519.pub", tmp_path / "authorized_keys")
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory
        worker_cmd = manifest()["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["command"]
        for pod in workers:
            config = tmp_path / f"sshd-{pod.hostname}.conf"
            pid = tmp_path / f"sshd-{pod.hostname}.pid"
            config.write_text(
                f"Port {SSH_PORT}\nHostKey {tmp_path / 'host_key'}\nAuthorizedKeysFile {tmp_path / 'authorized_keys'}\n"
                f"PermitRootLogin yes\nStrictModes no\nUsePAM no\nPasswordAuthentication no\nPidFile {pid}\n"
            )
            subprocess.Popen(pod.exec_argv([*worker_cmd, "-f", str(config)]), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            sshd_pids.append(pid)
        deadline = time.monotonic() + 20
        while not all(p.exists() for p in sshd_pids):  # WaitForWorkersReady
            assert time.monotonic() < deadline, "sshd did not start in the worker namespaces"
            time.sleep(0.1)
        yield
    finally:
        for pid in sshd_pids:
            if pid.exists():
                subprocess.run(["kill", pid.read_text().strip()], check=False)
        for pod in [launcher, *workers]:
            shutil.rmtree(Path("/etc/netns") / pod.netns, ignore_errors=True)


def manifest() -> dict:
    spec = mpijob.load_spec({
        "name": JOB,
        "image": "hvdk8s:test",
        "command": [sys.executable, str(REPO / "examples" / "train_digits.py"), "--epochs", "3"],
        "workers": 2,
        "slotsPerWorker": 1,
        "sshPort": SSH_PORT,
    })
    return mpijob.render(spec)


def test_rendered_launcher_command_trains_across_pods(pods: tuple[Pod, list[Pod]], tmp_path: Path) -> None:
    launcher, workers = pods
    container = manifest()["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"{w.fqdn} slots=1\n" for w in workers))  # the operator's ConfigMap
    env = {
        # the image's environment
        "PATH": f"{Path(sys.executable).parent}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LD_LIBRARY_PATH": os.environ.get("LD_LIBRARY_PATH", ""),
        "HOME": str(tmp_path),
        # the manifest's
        **{e["name"]: e["value"] for e in container["env"]},
        # what the operator adds to the launcher (mpi_job_controller.go), the hostfile path aside
        "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
        "OMPI_MCA_orte_default_hostfile": str(hostfile),
        # ssh settings the image's ssh_config and the mounted Secret provide in a pod
        "OMPI_MCA_plm_rsh_args": f"-p {SSH_PORT} -i {tmp_path / 'id_ed25519'} -o StrictHostKeyChecking=no "
        "-o UserKnownHostsFile=/dev/null -o BatchMode=yes -o LogLevel=ERROR -o ConnectionAttempts=10",
    }
    assert container["command"][0] == "mpirun"
    job = subprocess.run(
        launcher.exec_argv(container["command"]), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400
    )
    out = job.stdout + job.stderr
    assert job.returncode == 0, out[-4000:]
    hosts = re.search(r"hvdk8s: 2 ranks on 2 hosts \((.*)\)", out)
    assert hosts, out[-3000:]
    assert hosts.group(1) == "mh-worker-0: 1, mh-worker-1: 1"  # one rank in each worker pod, none on the launcher
    accuracy = float(re.search(r"test accuracy (\d\.\d+)", out).group(1))
    assert accuracy > 0.5  # 3 epochs: learning happened across the hosts
