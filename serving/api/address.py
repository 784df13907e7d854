"""Where ``hvdk8s serve`` listens unless told otherwise, and what a client tells its user when nothing answers.

Standard library only: the command line reads the defaults while it builds its parser.
"""
from __future__ import annotations

import ipaddress
import socket
import urllib.parse
from pathlib import Path

HOST = "127.0.0.1"
REST_PORT = 8501  # TF Serving's REST port
GRPC_PORT = 8500  # TF Serving's gRPC port
REST_URL = f"http://{HOST}:{REST_PORT}"
GRPC_ADDRESS = f"{HOST}:{GRPC_PORT}"


def host_port(address: str) -> tuple[str, int]:
    """(host, port) of a REST URL (``http://host:port``; 80 or 443 without a port) or a gRPC ``host:port``."""
    if "://" in address:
        parts = urllib.parse.urlsplit(address)
        return parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"address {address!r}: expected http://host:port (REST) or host:port (gRPC)")
    return host.strip("[]"), int(port)


def nothing_answers(address: str, timeout: float = 5.0) -> str | None:
    """Why a client gets no connection at ``address``, for its user, or None when something accepts one there
    (then the client's own error says what went wrong). For a loopback address (``localhost``, 127.0.0.0/8,
    ``::1``) it says whether an ``hvdk8s serve`` runs here, and how to start one."""
    host, port = host_port(address)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except socket.gaierror:
        reason = f"no host named {host!r}"
    except TimeoutError:
        reason = f"no answer within {timeout:g} s"
    except OSError as err:
        reason = err.strerror or str(err)
    where = f"nothing answers at {address} ({reason})"
    if not _is_this_machine(host):
        return f"{where}: is the server (`hvdk8s serve` or TF Serving) running there, and on that port?"
    servers = local_servers()
    if not servers:
        return (f"{where}, and no `hvdk8s serve` is running on this machine: start one with `hvdk8s serve "
                f"MODEL_BASE_PATH` (REST on {REST_URL}, gRPC on {GRPC_ADDRESS}), or give your server's address")
    running = "; ".join(f"pid {pid}: {command}" for pid, command in servers)
    return (f"{where}, though `hvdk8s serve` is running on this machine ({running}): give the address it printed "
            "when it started")


def _is_this_machine(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def local_servers() -> list[tuple[int, str]]:
    """The ``hvdk8s serve`` processes on this machine, (pid, command line) each, from Linux's /proc (none where
    there is no /proc). ``hvdk8s serve`` and ``python -m hvdk8s.cli serve`` both count, with global options
    (``hvdk8s --verbose serve``) before the command."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().decode(errors="replace").rstrip("\0").split("\0")
        except OSError:  # the process ended meanwhile, or is not ours to read
            continue
        for i, arg in enumerate(argv):
            if Path(arg).name == "hvdk8s" or arg == "hvdk8s.cli":
                rest = argv[i + 1:]
                if next((a for a in rest if not a.startswith("-")), None) == "serve":
                    found.append((int(cmdline.parent.name), " ".join(["hvdk8s", *rest])))
                break
    return sorted(found)
