"""A bandwidth-limited cluster on one machine: hosts in Linux network namespaces.

Every emulated host is a namespace ``<prefix>hK`` (``hvbench-hK`` by default)
with one veth link (``hvb0``, address <subnet>.(10+K)/24) to a bridge that
lives in its own namespace ``<prefix>sw``. Given a rate, each link is shaped in
both directions with a token bucket (``tc qdisc ... tbf rate 1gbit``), so a
host can send and receive at the link rate at once, like a full-duplex NIC
port. The multi-host MPIJob test builds its pods with the same code, unshaped
and under its own prefix. Nothing is configured in
the machine's own namespace: the private range exists only inside these
namespaces, so no traffic can leave them. Needs root and iproute2.

The emulation shapes bandwidth only: all hosts still share this machine's
CPU cores and memory, and the per-message latency is that of the kernel's
veth path, not of a real NIC and switch.
"""
from __future__ import annotations

import fcntl
import os
import re
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from .netns_agent import PREFIX

BRIDGE = "hvbbr0"
HOST_IFACE = "hvb0"
SUBNET = "10.213.0"
_RATE = re.compile(r"^(\d+(?:\.\d+)?)(k|m|g)?bit$")
_UNITS = {None: 1, "k": 10**3, "m": 10**6, "g": 10**9}


def parse_rate(rate: str) -> float:
    """``tc`` rate text (``1gbit``, ``100mbit``) in bits per second."""
    match = _RATE.match(rate.strip().lower())
    if not match:
        raise ValueError(f"link rate {rate!r}: expected a tc rate such as 1gbit, 10gbit or 500mbit")
    return float(match.group(1)) * _UNITS[match.group(2)]


@dataclass(frozen=True)
class Host:
    name: str  # the namespace
    ip: str

    def exec_argv(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.name, *argv]


@dataclass(frozen=True)
class Cluster:
    rate: str | None  # None: links are not shaped
    hosts: tuple[Host, ...]
    prefix: str = PREFIX

    @property
    def switch(self) -> str:
        return f"{self.prefix}sw"


def hosts(count: int, prefix: str = PREFIX, subnet: str = SUBNET) -> tuple[Host, ...]:
    return tuple(Host(f"{prefix}h{k}", f"{subnet}.{10 + k}") for k in range(count))


def tbf_args(rate: str) -> list[str]:
    """Token bucket for ``rate``: a 1 ms burst (at least 64 KiB) so the kernel timer can keep up."""
    bytes_per_s = parse_rate(rate) / 8
    burst = max(64 * 1024, int(bytes_per_s / 1000))
    return ["tbf", "rate", rate, "burst", str(burst), "latency", "50ms"]


def setup_commands(cluster: Cluster) -> list[list[str]]:
    """The ``ip``/``tc`` commands that build ``cluster``, in order (pure, so it can be checked)."""
    sw = ["ip", "netns", "exec", cluster.switch]
    cmds = [
        ["ip", "netns", "add", cluster.switch],
        [*sw, "ip", "link", "set", "lo", "up"],
        [*sw, "ip", "link", "add", BRIDGE, "type", "bridge"],
        [*sw, "ip", "link", "set", BRIDGE, "up"],
    ]
    for k, host in enumerate(cluster.hosts):
        port = f"hvbp{k}"
        inside = ["ip", "netns", "exec", host.name]
        cmds += [
            ["ip", "netns", "add", host.name],
            [*sw, "ip", "link", "add", port, "type", "veth", "peer", "name", HOST_IFACE, "netns", host.name],
            [*sw, "ip", "link", "set", port, "master", BRIDGE],
            [*sw, "ip", "link", "set", port, "up"],
            [*inside, "ip", "link", "set", "lo", "up"],
            [*inside, "ip", "addr", "add", f"{host.ip}/24", "dev", HOST_IFACE],
            [*inside, "ip", "link", "set", HOST_IFACE, "up"],
        ]
        if cluster.rate:
            cmds += [
                [*inside, "tc", "qdisc", "add", "dev", HOST_IFACE, "root", *tbf_args(cluster.rate)],
                [*sw, "tc", "qdisc", "add", "dev", port, "root", *tbf_args(cluster.rate)],
            ]
    return cmds


def existing_namespaces(prefix: str = PREFIX) -> list[str]:
    """The namespaces under ``prefix`` that exist now (leftovers of a killed run included)."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(prefix)]


def remove_all(prefix: str = PREFIX) -> None:
    for name in existing_namespaces(prefix):
        subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)


def available() -> str | None:
    """None if namespaces can be made here, else why not (the section is then skipped)."""
    probe = f"{PREFIX}probe"
    try:
        subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, check=True)
    except FileNotFoundError:
        return "iproute2 (ip) is not installed"
    except subprocess.CalledProcessError as err:
        return f"cannot create network namespaces (needs root): {err.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return None


@contextmanager
def cluster(count: int, rate: str | None, *, prefix: str = PREFIX, subnet: str = SUBNET) -> Iterator[Cluster]:
    """Build ``count`` hosts (links shaped to ``rate`` unless None); always tear everything down afterwards.

    A lock file per prefix serialises runs on one machine: the leftovers a
    killed run may have left are removed first, which must never hit the
    namespaces of a run still in progress.
    """
    built = Cluster(rate, hosts(count, prefix, subnet), prefix)
    with open(os.path.join(tempfile.gettempdir(), f"{prefix}netns.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        remove_all(prefix)
        try:
            for cmd in setup_commands(built):
                done = subprocess.run(cmd, capture_output=True, text=True)
                if done.returncode:
                    raise RuntimeError(f"emulated cluster: `{' '.join(cmd)}` failed: {done.stderr.strip()}")
            yield built
        finally:
            remove_all(prefix)
