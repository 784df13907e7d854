"""Chaos hosts in network namespaces: worker hosts that can be killed, cut off and brought back.

The hosts are built by ``netns.cluster`` (one namespace each, a veth link
``hvb0`` to a bridge; unshaped). The first is the driver's: ``hvdk8s run``
(horovodrun's elastic driver) runs there. Every other one is a worker host
with its own host name (a UTS namespace) and its own sshd on port 22, which is
how Horovod's driver starts workers on a host that is not its own: ``ssh HOST
'cd DIR; env ... python ...'`` (horovod/runner/gloo_run.py, util/remote.py,
v0.28.1). The driver's ssh is a wrapper on its PATH that adds ``-F`` with this
cluster's key and keep-alives, so a host whose link is cut ends its ssh
session in seconds, as a real driver's would with the same settings. Its
discovery script lists the worker hosts whose sshd accepts a connection
(``hvdk8s.launcher.hosts ready``, what the elastic MPIJob runs), so a host
that is down or cut off drops out and comes back when it answers again.

Faults: ``kill_host`` SIGKILLs every process in the host's namespace (sshd,
its sessions, the workers); ``cut_link`` takes its link down with its
processes alive (the worker does that itself, at its fault point, so peers
see silence rather than a reset); ``restore`` is the host coming back after
a reboot: its processes (a cut-off worker still waiting) are killed, the link
is brought up and a fresh sshd started. Needs root, iproute2 and openssh.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from . import netns

PREFIX = "hvchaos-"
SUBNET = "10.214.0"
SSH_PORT = 22
IFACE = netns.HOST_IFACE
SSHD = "/usr/sbin/sshd"
# ssh's keep-alive: a driver's session to a host that stopped answering ends after about 2 s x 3.
CLIENT_CONFIG = """Host *
    Port {port}
    IdentityFile {key}
    IdentitiesOnly yes
    BatchMode yes
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null
    LogLevel ERROR
    ConnectTimeout 5
    ServerAliveInterval 2
    ServerAliveCountMax 3
"""
SERVER_CONFIG = """Port {port}
ListenAddress {ip}
HostKey {host_key}
AuthorizedKeysFile {authorized_keys}
PermitRootLogin prohibit-password
PasswordAuthentication no
StrictModes no
UsePAM no
ClientAliveInterval 2
ClientAliveCountMax 3
"""


def unavailable() -> str | None:
    """None if namespace hosts can be built here, else why not."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, sshd)"
    for tool in ("ip", "ssh", "ssh-keygen", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (iproute2, openssh-client, util-linux)"
    if not Path(SSHD).exists():
        return f"{SSHD} is not installed (openssh-server)"
    return netns.available()


@dataclass
class Cluster:
    """A built cluster: the driver's host, the worker hosts and each worker host's running sshd."""

    driver: netns.Host
    workers: tuple[netns.Host, ...]
    folder: Path  # keys, configs, the ssh wrapper
    port: int = SSH_PORT  # every worker host's sshd
    hostnames: dict[str, str] = field(default_factory=dict)  # namespace -> its host name (default: the namespace's)
    sshd: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def ssh_path(self) -> str:
        """The folder to put first on the driver's PATH (its ``ssh`` is the wrapper)."""
        return str(self.folder / "bin")

    def host(self, ip: str) -> netns.Host:
        return next(h for h in self.workers if h.ip == ip)

    def driver_argv(self, argv: list[str]) -> list[str]:
        """``argv`` on the driver's host, under its own host name."""
        return self._as_host(self.driver, argv)

    def hosts_file(self, host: netns.Host) -> Path:
        """The host's /etc/hosts (``ip netns exec`` mounts /etc/netns/NAME/hosts over it); rewrite it in place."""
        return Path("/etc/netns") / host.name / "hosts"

    def _as_host(self, host: netns.Host, argv: list[str]) -> list[str]:
        name = self.hostnames.get(host.name, host.name)
        return host.exec_argv(["unshare", "--uts", "--", "sh", "-c", 'hostname "$0" && exec "$@"', name, *argv])

    def discovery_script(self, path: Path, python: str = sys.executable) -> Path:
        """An executable discovery script: the worker hosts whose sshd accepts a connection, one slot each."""
        listed = path.with_suffix(".hosts")
        listed.write_text("".join(f"{h.ip}:1\n" for h in self.workers))
        path.write_text(f"#!/bin/sh\nexec {python} -m hvdk8s.launcher.hosts ready --port {self.port} -- cat {listed}\n")
        path.chmod(0o755)
        return path

    def start_sshd(self, host: netns.Host) -> None:
        config = self.folder / f"sshd-{host.name}.conf"
        config.write_text(SERVER_CONFIG.format(port=self.port, ip=host.ip, host_key=self.folder / "host_key",
                                               authorized_keys=self.folder / "authorized_keys"))
        self.sshd[host.name] = subprocess.Popen(self._as_host(host, [SSHD, "-D", "-e", "-f", str(config)]),
                                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not _listening(host, self.port):
            if time.monotonic() > deadline or self.sshd[host.name].poll() is not None:
                raise RuntimeError(f"chaos hosts: sshd did not start in namespace {host.name}")
            time.sleep(0.05)

    def kill_host(self, host: netns.Host) -> None:
        """SIGKILL every process in the host's namespace (its sshd, sessions and workers)."""
        pids = subprocess.run(["ip", "netns", "pids", host.name], capture_output=True, text=True).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        if host.name in self.sshd:
            self.sshd.pop(host.name).wait()

    def cut_link(self, host: netns.Host) -> None:
        _ip(host, "link", "set", IFACE, "down")

    def restore(self, host: netns.Host) -> None:
        """The host back as after a reboot: no old processes, its link up, a fresh sshd."""
        self.kill_host(host)
        _ip(host, "link", "set", IFACE, "up")
        self.start_sshd(host)


def _ip(host: netns.Host, *args: str) -> None:
    done = subprocess.run(host.exec_argv(["ip", *args]), capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"chaos hosts: `ip {' '.join(args)}` in {host.name} failed: {done.stderr.strip()}")


def _listening(host: netns.Host, port: int) -> bool:
    probe = subprocess.run(host.exec_argv(["ss", "-Hltn", f"sport = :{port}"]), capture_output=True, text=True)
    return bool(probe.stdout.strip())


@contextmanager
def cluster(workers: int, folder: Path, *, port: int = SSH_PORT, hostnames: Sequence[str] | None = None,
            prefix: str = PREFIX) -> Iterator[Cluster]:
    """The driver's host and ``workers`` worker hosts, each with its sshd on ``port``; all torn down afterwards.

    ``hostnames`` names the driver and then each worker host (default: their
    namespace names); each host's /etc/hosts resolves every host's name.
    Clusters under one ``prefix`` take turns (``netns.cluster``'s lock).
    """
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "bin").mkdir(exist_ok=True)
    for key in ("id", "host_key"):
        if not (folder / key).exists():
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(folder / key)], check=True)
    shutil.copy(folder / "id.pub", folder / "authorized_keys")
    (folder / "ssh_config").write_text(CLIENT_CONFIG.format(port=port, key=folder / "id"))
    wrapper = folder / "bin" / "ssh"
    wrapper.write_text(f'#!/bin/sh\nexec {shutil.which("ssh")} -F {folder / "ssh_config"} "$@"\n')
    wrapper.chmod(0o755)
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory
    with netns.cluster(1 + workers, None, prefix=prefix, subnet=SUBNET) as built:
        driver, *hosts = built.hosts
        names = dict(zip((h.name for h in built.hosts), hostnames or (h.name for h in built.hosts)))
        made = Cluster(driver, tuple(hosts), folder, port, names)
        try:
            for host in built.hosts:
                # Each host resolves its own name: Horovod's Gloo set-up crashes (SIGSEGV) where it does not.
                made.hosts_file(host).parent.mkdir(parents=True, exist_ok=True)
                others = "".join(f"{h.ip} {names[h.name]}\n" for h in built.hosts if h != host)
                made.hosts_file(host).write_text(f"127.0.0.1 localhost\n{host.ip} {names[host.name]}\n{others}")
            for host in hosts:
                made.start_sshd(host)
            yield made
        finally:
            for host in built.hosts:
                made.kill_host(host)
                shutil.rmtree(made.hosts_file(host).parent, ignore_errors=True)
