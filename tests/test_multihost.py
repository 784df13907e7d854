"""The rendered launcher command, run for real across emulated pods built as the controllers build them.

Each pod is a Linux network namespace with its own address (built by the
benchmarks' emulated-cluster module, unshaped), its own host name (UTS
namespace) and its own mounts: the controller's ssh Secret over ``/root/.ssh``
with the file modes the controller's model gives it (tests/controllers), and
the image's ssh client settings (Dockerfile.gpu) in ``/etc/ssh/ssh_config.d``.
Workers run the rendered sshd; the launcher gets the controller's environment
and hostfile and runs the rendered command unchanged. Both ways are run: an
MPIJob as the MPI Operator v0.8.2 builds its pods (key mode 0600), and a
TrainJob as Kubeflow Trainer v2.3.0 does (key mode 0640, which OpenSSH refuses
for its owner). Needs root, iproute2 and openssh (CI has them).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hvdk8s import mpijob
from hvdk8s.benchmarks.emulation import netns

from conftest import REPO
from controllers import mpi_operator, trainer

JOB = "mh"
NAMESPACE = "default"
SSH_PORT = 2222  # the image's sshd and ssh client port (Dockerfile.gpu, job spec sshPort)
SUBNET = "10.231.7"
PREFIX = f"hvk8s-{os.getpid()}-"
# Dockerfile.gpu's /etc/ssh/ssh_config.d/hvdk8s.conf: how the image's ssh reaches the workers.
ROOT_SSH = Path("/root/.ssh")  # where both controllers mount the Secret for root
IMAGE_SSH_CONFIG = f"Host *\n    StrictHostKeyChecking no\n    UserKnownHostsFile /dev/null\n    Port {SSH_PORT}\n"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None or not Path("/usr/sbin/sshd").exists(),
    reason="needs root, iproute2 and openssh-server (make setup installs them)",
)


@dataclass(frozen=True)
class Pod:
    hostname: str  # as the controller names the pod
    fqdn: str  # as its hostfile names it
    netns: str
    ip: str
    secret: Path  # bind-mounted over /root/.ssh: the controller's Secret volume
    ssh_config: Path  # bind-mounted over /etc/ssh/ssh_config.d: the image's settings

    def exec_argv(self, argv: list[str]) -> list[str]:
        """Run argv in this pod: its network and mount namespaces, and its own host name."""
        setup = (f'hostname "$0" && mount --bind {self.secret} {ROOT_SSH} '
                 f'&& mount --bind {self.ssh_config} /etc/ssh/ssh_config.d')
        return [
            "ip", "netns", "exec", self.netns, "unshare", "--uts", "--",
            "sh", "-c", f'{setup} && exec "$@"', self.hostname, *argv,
        ]  # fmt: skip


@dataclass(frozen=True)
class Built:
    """What a controller made of the rendered objects: its pods, hostfile and the key's mode."""

    launcher: dict[str, Any]
    workers: list[dict[str, Any]]
    hostfile: str
    key_mode: int


def run(argv: list[str]) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True)


def job_spec() -> mpijob.JobSpec:
    return mpijob.load_spec({
        "name": JOB,
        "image": "hvdk8s:test",
        "command": [sys.executable, str(REPO / "examples" / "train_digits.py"), "--epochs", "3"],
        "workers": 2,
        "slotsPerWorker": 1,
        "sshPort": SSH_PORT,
    })


def by_mpi_operator() -> Built:
    manifest = mpijob.render(job_spec())
    manifest["metadata"]["namespace"] = NAMESPACE
    made = mpi_operator.sync(manifest, ready_workers=2)
    assert made.launcher is not None  # WaitForWorkersReady: created once both workers are Ready
    launcher = made.launcher["template"]
    return Built(launcher, made.workers, mpi_operator.hostfile(manifest), mpi_operator.ssh_key_mode(launcher["spec"]))


def by_trainer() -> Built:
    runtime, trainjob = mpijob.render_trainjob(job_spec())
    pods = trainer.pods(trainjob, runtime)
    (launcher,) = pods[trainer.LAUNCHER]
    return Built(launcher, pods[trainer.NODE], trainer.hostfile(trainjob, runtime), trainer.key_mode(launcher))


@contextmanager
def emulated_pods(built: Built, tmp_path: Path) -> Iterator[tuple[Pod, list[Pod]]]:
    """The namespaces, DNS names, ssh Secret and the rendered sshd of every worker."""
    names = [p["metadata"]["name"] for p in built.workers]
    fqdns = [line.split()[0] for line in built.hostfile.splitlines()]
    assert [f.split(".")[0] for f in fqdns] == names  # the hostfile lists exactly the worker pods
    secret = tmp_path / "secret"  # one Secret, mounted in every pod
    secret.mkdir(parents=True)
    run(["ssh-keygen", "-q", "-t", "ecdsa", "-b", "521", "-N", "", "-f", str(secret / "id_rsa")])  # both: ECDSA P-521
    shutil.copy(secret / "id_rsa.pub", secret / "authorized_keys")
    (secret / "id_rsa").chmod(built.key_mode)
    for public in ("id_rsa.pub", "authorized_keys"):
        (secret / public).chmod(0o644)
    ssh_config = tmp_path / "ssh_config.d"
    ssh_config.mkdir()
    (ssh_config / "hvdk8s.conf").write_text(IMAGE_SSH_CONFIG)
    with mount_point(ROOT_SSH), netns.cluster(1 + len(names), None, prefix=PREFIX, subnet=SUBNET) as cluster:
        launcher, *workers = [
            Pod(name, fqdn, host.name, host.ip, secret, ssh_config)
            for name, fqdn, host in zip([built.launcher["metadata"].get("name") or built.launcher["spec"]["hostname"],
                                         *names],
                                        ["launcher", *fqdns], cluster.hosts)
        ]
        with sshd_workers(launcher, workers, built.workers[0], tmp_path):
            yield launcher, workers


@contextmanager
def mount_point(path: Path) -> Iterator[None]:
    """An empty directory to mount over inside the pods (removed again if the test made it)."""
    made = not path.exists()
    path.mkdir(mode=0o700, exist_ok=True)
    try:
        yield
    finally:
        if made:
            path.rmdir()


@contextmanager
def sshd_workers(launcher: Pod, workers: list[Pod], worker_pod: dict[str, Any], tmp_path: Path) -> Iterator[None]:
    """The pods' DNS names in each pod's /etc/hosts, and the rendered sshd in each worker pod."""
    hosts_file = "".join(f"{p.ip} {p.fqdn} {p.hostname}\n" for p in [launcher, *workers])
    sshd_pids: list[Path] = []
    try:
        for pod in [launcher, *workers]:
            etc = Path("/etc/netns") / pod.netns  # `ip netns exec` mounts these over /etc
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text("127.0.0.1 localhost\n" + hosts_file)
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "host_key")])
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory
        worker_cmd = worker_pod["spec"]["containers"][0]["command"]
        for pod in workers:
            # The image's sshd settings (Dockerfile.gpu), a host key, and a pid file to see it start.
            config = tmp_path / f"sshd-{pod.hostname}.conf"
            pid = tmp_path / f"sshd-{pod.hostname}.pid"
            config.write_text(
                f"Port {SSH_PORT}\nHostKey {tmp_path / 'host_key'}\nPermitRootLogin prohibit-password\n"
                f"StrictModes no\nUsePAM no\nPasswordAuthentication no\nPidFile {pid}\n"
            )
            subprocess.Popen(pod.exec_argv([*worker_cmd, "-f", str(config)]), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            sshd_pids.append(pid)
        deadline = time.monotonic() + 20
        while not all(p.exists() for p in sshd_pids):
            assert time.monotonic() < deadline, "sshd did not start in the worker namespaces"
            time.sleep(0.1)
        yield
    finally:
        for pid in sshd_pids:
            if pid.exists():
                subprocess.run(["kill", pid.read_text().strip()], check=False)
        for pod in [launcher, *workers]:
            shutil.rmtree(Path("/etc/netns") / pod.netns, ignore_errors=True)


@pytest.mark.e2e
@pytest.mark.parametrize("controller", [by_mpi_operator, by_trainer], ids=["mpijob", "trainjob"])
def test_rendered_launcher_command_trains_across_pods(controller: Callable[[], Built], tmp_path: Path) -> None:
    built = controller()
    container = built.launcher["spec"]["containers"][0]
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(built.hostfile)  # the controller's ConfigMap
    env = {
        # the image's environment
        "PATH": f"{Path(sys.executable).parent}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LD_LIBRARY_PATH": os.environ.get("LD_LIBRARY_PATH", ""),
        "HOME": "/root",
        # the pod's, as the controller built it: the manifest's and the controller's own
        **{e["name"]: e["value"] for e in container["env"]},
        # the ConfigMap is mounted at /etc/mpi in a pod; here the file stands beside the test
        "OMPI_MCA_orte_default_hostfile": str(hostfile),
    }
    with emulated_pods(built, tmp_path) as (launcher, workers):
        job = subprocess.run(
            launcher.exec_argv(container["command"]), cwd=tmp_path, env=env, capture_output=True, text=True,
            timeout=400,
        )
    out = job.stdout + job.stderr
    assert job.returncode == 0, out[-4000:]
    hosts = re.search(r"hvdk8s: 2 ranks on 2 hosts \((.*)\)", out)
    assert hosts, out[-3000:]
    # one rank in each worker pod, none on the launcher
    assert hosts.group(1) == ", ".join(f"{w.hostname}: 1" for w in workers)
    accuracy = float(re.search(r"test accuracy (\d\.\d+)", out).group(1))
    assert accuracy > 0.5  # 3 epochs: learning happened across the hosts


def test_trainers_key_mode_is_one_openssh_refuses_for_root() -> None:
    """Why the TrainJob's launcher needs its 0600 copy: the model's mode, OpenSSH's rule."""
    assert by_trainer().key_mode == 0o640 and not trainer.openssh_uses_key(0o640, key_uid=0, user_uid=0)
    assert by_mpi_operator().key_mode == 0o600
