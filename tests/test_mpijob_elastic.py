"""The elastic MPIJob on Kubernetes: which workers its host discovery offers Horovod.

The chain as on a cluster: the API server's worker pods (tests/kube_double.py,
read with the real client) -> the MPI Operator's ``discover_hosts.sh`` of the
Running ones (its model, tests/controllers/mpi_operator.py) -> the rendered
discovery command, which keeps the workers whose sshd answers (what their
readiness probe tests) -> Horovod. Pod DNS names resolve through a hosts file
mounted over /etc/hosts in a private mount namespace, each pod's sshd is a
listener on its own loopback address. Needs root (unshare, mount).
"""
from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest

from hvdk8s.benchmarks.emulation import chaos_netns, netns
from hvdk8s.cluster import kube
from hvdk8s.cluster.client import Cluster, connect
from hvdk8s.mpijob import load_spec, render

from controllers import mpi_operator
from kube_double import KubeDouble
from test_mpijob import EXAMPLES, REPO, launcher

NAMESPACE, JOB = "team-a", "digits-elastic"
WORKERS = [f"{JOB}-worker-{i}" for i in range(3)]
ADDRESS = {name: f"127.0.0.{10 + i}" for i, name in enumerate(WORKERS)}
EPOCHS = 40  # the elastic example's job, lengthened in the test that replaces a pod mid-training
TAG = r"\[\d+\]<std(?:out|err)>:"  # horovodrun's prefix of a worker's lines: its process index, not its rank


def test_the_elastic_example_runs_the_elastic_script_with_flags_it_takes(monkeypatch: pytest.MonkeyPatch):
    """#28: mpijob/examples/elastic.yaml runs train_digits.py --elastic, and the script takes its flags."""
    command = load_spec(EXAMPLES / "elastic.yaml").command
    assert command[:2] == ("python", "/app/examples/train_digits.py") and "--elastic" in command
    loader = importlib.util.spec_from_file_location("train_digits", REPO / "examples" / "train_digits.py")
    script = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(script)
    monkeypatch.setattr(sys, "argv", ["train_digits.py", *command[2:]])
    args = script.parse_args()
    assert args.elastic and args.epochs == 20 and str(args.checkpoint_dir) == "/shared/digits-elastic"


def discovery_command() -> list[str]:
    """The rendered launcher's --host-discovery-script, with the operator's script path left to the caller."""
    command = launcher(render(load_spec(EXAMPLES / "elastic.yaml")))["command"]
    assert command[:4] == ["horovodrun", "--blacklist-cooldown-range", "10", "300"]  # a re-created pod may rejoin
    return shlex.split(command[command.index("--host-discovery-script") + 1])


def operator_writes_discover_hosts(cluster: Cluster, manifest: dict[str, Any], script: Path) -> None:
    """updateDiscoverHostsInConfigMap from the API's Running worker pods."""
    pods = kube.job_pods(cluster, NAMESPACE, JOB)
    running = [p["metadata"]["name"] for p in pods if p["status"]["phase"] == "Running"
               and p["metadata"]["labels"]["training.kubeflow.org/job-role"] == "worker"]
    script.write_text(mpi_operator.discover_hosts(manifest, running))
    script.chmod(0o755)


@contextmanager
def sshd(name: str, port: int) -> Iterator[None]:
    """The pod's sshd: a listener on its address, as long as the pod's sshd runs."""
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((ADDRESS[name], port))
        server.listen()
        yield


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
def test_discovery_offers_ready_workers_survives_a_deleted_pod_and_takes_its_replacement(tmp_path: Path):
    with socket.socket() as probe:  # a free port on the pods' addresses
        probe.bind((ADDRESS[WORKERS[0]], 0))
        port = probe.getsockname()[1]
    argv = discovery_command()
    assert argv[argv.index("--port") + 1] == "2222"
    argv[argv.index("--port") + 1] = str(port)
    script = tmp_path / "discover_hosts.sh"  # the operator's ConfigMap, mounted at /etc/mpi
    assert argv[-1] == "/etc/mpi/discover_hosts.sh"
    argv[-1] = str(script)
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n" + "".join(
        f"{ip} {name}.{JOB}.{NAMESPACE}.svc\n" for name, ip in ADDRESS.items()))
    manifest = render(load_spec(EXAMPLES / "elastic.yaml"))
    manifest["metadata"]["namespace"] = NAMESPACE

    with KubeDouble() as api:
        cluster = connect(str(api.write_kubeconfig(tmp_path / "kubeconfig")))

        def operator_syncs() -> None:
            operator_writes_discover_hosts(cluster, manifest, script)

        def offered() -> list[str]:
            """What Horovod's driver gets from the rendered discovery command, run as in the launcher pod."""
            found = subprocess.run(
                ["unshare", "--mount", "--", "sh", "-c", f'mount --bind {hosts} /etc/hosts && exec "$@"', "pod",
                 *[sys.executable if a == "python" else a for a in argv]],
                capture_output=True, text=True, timeout=60, check=True)
            return [line.split(".")[0] for line in found.stdout.split()]

        with ExitStack() as pods_sshd:
            listening: dict[str, ExitStack] = {}

            def sshd_up(name: str) -> None:
                listening[name] = pods_sshd.enter_context(ExitStack())
                listening[name].enter_context(sshd(name, port))

            # Two workers Running and Ready, a third Running whose sshd is not up yet.
            for name in WORKERS[:2]:
                api.put_worker(NAMESPACE, JOB, name)
                sshd_up(name)
            api.put_worker(NAMESPACE, JOB, WORKERS[2], ready=False)
            operator_syncs()
            assert script.read_text().count("echo ") == 3  # the operator lists every Running pod
            assert offered() == WORKERS[:2]  # Horovod gets the Ready ones

            # worker-1 is deleted (drain, spot reclaim): its sshd goes with it. Before the operator's
            # new script reaches the launcher (the kubelet syncs ConfigMap volumes late), it is dropped.
            api.delete_pod(NAMESPACE, WORKERS[1])
            listening.pop(WORKERS[1]).close()
            assert offered() == WORKERS[:1]
            operator_syncs()
            assert script.read_text().count("echo ") == 2 and offered() == WORKERS[:1]

            # The operator re-creates it under its name; Pending, then Running before sshd is up: not offered.
            api.put_worker(NAMESPACE, JOB, WORKERS[1], phase="Pending", ready=False)
            operator_syncs()
            assert offered() == WORKERS[:1]
            api.put_worker(NAMESPACE, JOB, WORKERS[1], ready=False)
            operator_syncs()
            assert offered() == WORKERS[:1]
            # Its sshd answers (Ready): it joins, and so does worker-2 once its own sshd is up.
            sshd_up(WORKERS[1])
            assert offered() == WORKERS[:2]
            sshd_up(WORKERS[2])
            assert offered() == WORKERS


def pods_command(command: list[str], script: Path, checkpoints: Path) -> list[str]:
    """The rendered launcher command as this machine runs it: our Python and script, files in the test's folder.

    Horovod's blacklist cooldown (10-300 s rendered) is cut to 1-2 s and the job runs ``EPOCHS`` epochs (20
    rendered), so the replacement rejoins well before the survivor, alone, has finished.
    """
    assert command[:4] == ["horovodrun", "--blacklist-cooldown-range", "10", "300"]
    here = {"python": sys.executable, "/app/examples/train_digits.py": str(REPO / "examples" / "train_digits.py"),
              "/etc/mpi/discover_hosts.sh": str(script), "/shared/digits-elastic": str(checkpoints)}
    discovery = command.index("--host-discovery-script") + 1
    command = [*command[:2], "1", "2", *command[4:]]
    command[discovery] = " ".join(here.get(word, word) for word in command[discovery].split())
    epochs = command.index("--epochs") + 1
    assert command[epochs] == "20"
    command[epochs] = str(EPOCHS)
    return [here.get(word, word) for word in command]


@pytest.mark.e2e
def test_a_deleted_worker_pods_replacement_joins_the_running_job(tmp_path: Path) -> None:
    """#28 on Kubernetes, with real training: the rendered elastic launcher command runs on a namespace host,
    its workers on namespace hosts (own address, host name and sshd on 2222) that the API's worker pods stand
    for. worker-1's pod is deleted mid-training and every process on its host killed; the operator re-creates
    the pod, a new host with a new address behind the same DNS name, and it joins the running job.

    The replacement's namespace is built with the others but stays dark (no sshd, link down) until its pod
    is created. Pod DNS is the launcher host's /etc/hosts, rewritten as the cluster DNS would answer.
    """
    if reason := chaos_netns.unavailable():
        pytest.skip(f"needs network-namespace hosts: {reason}")
    manifest = render(load_spec(EXAMPLES / "elastic.yaml"))
    manifest["metadata"]["namespace"] = NAMESPACE
    container = launcher(manifest)
    script = tmp_path / "discover_hosts.sh"  # the operator's ConfigMap, mounted at /etc/mpi
    command = pods_command(container["command"], script, tmp_path / "checkpoints")
    launcher_name = f"{JOB}-launcher"
    names = [launcher_name, WORKERS[0], WORKERS[1], WORKERS[1]]  # the last: worker-1's replacement
    with KubeDouble() as api, chaos_netns.cluster(3, tmp_path / "hosts", port=2222, hostnames=names,
                                                   prefix="hvk8sel-") as hosts:
        cluster = connect(str(api.write_kubeconfig(tmp_path / "kubeconfig")))
        worker_0, worker_1, replacement = hosts.workers

        def dns(pods: dict[str, netns.Host]) -> None:
            """The launcher's view of pod DNS: each worker pod's name at its host's address."""
            hosts.hosts_file(hosts.driver).write_text(f"127.0.0.1 localhost\n{hosts.driver.ip} {launcher_name}\n" + "".join(
                f"{host.ip} {name}.{JOB}.{NAMESPACE}.svc {name}\n" for name, host in pods.items()))

        hosts.kill_host(replacement)  # not created yet
        hosts.cut_link(replacement)
        for name in WORKERS[:2]:
            api.put_worker(NAMESPACE, JOB, name)
        dns({WORKERS[0]: worker_0, WORKERS[1]: worker_1})
        operator_writes_discover_hosts(cluster, manifest, script)
        env = {
            "PATH": f"{hosts.ssh_path}:{Path(sys.executable).parent}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root", **{e["name"]: e["value"] for e in container["env"]},
            "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        }
        lines: list[str] = []
        deleted = replaced = False
        with subprocess.Popen(hosts.driver_argv(command), cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) as job:
            watchdog = threading.Timer(600, job.kill)  # a hang guard: 40 epochs on 1-2 ranks, minutes under load
            watchdog.start()
            assert job.stdout is not None
            for line in job.stdout:
                lines.append(line)
                if not deleted and re.match(rf"{TAG}Epoch 1/{EPOCHS}: 100%", line):
                    # worker-1's pod is deleted (drain, spot reclaim): every process on its host is killed, so
                    # nothing can run there again (no sshd)
                    api.delete_pod(NAMESPACE, WORKERS[1])
                    hosts.kill_host(worker_1)
                    operator_writes_discover_hosts(cluster, manifest, script)
                    deleted = True
                elif deleted and not replaced and "elastic: training on 1 ranks" in line:
                    # The operator re-creates it under its name: a new pod, a new address behind the name.
                    hosts.restore(replacement)
                    api.put_worker(NAMESPACE, JOB, WORKERS[1])
                    dns({WORKERS[0]: worker_0, WORKERS[1]: replacement})
                    operator_writes_discover_hosts(cluster, manifest, script)
                    replaced = True
            job.wait()
            watchdog.cancel()
    out = "".join(lines)
    assert job.returncode == 0 and replaced, out[-4000:]
    starts = re.findall(rf"^{TAG}elastic: training on (\d) ranks from epoch (\d+)", out, re.M)
    # 2 ranks; 1 after the deletion; 2 again once the replacement (the only host behind worker-1's name with
    # an sshd: everything on the old one was killed) has joined
    sizes = [int(size) for size, _ in starts]
    assert sizes[:2] == [2, 1] and 2 in sizes[2:], out[-4000:]
    accuracy = float(re.search(r"test accuracy (\d\.\d+)", out).group(1))
    assert accuracy >= 0.9
