"""Which MPIJob workers can take ranks: those whose sshd accepts connections.

Run inside the launcher pod, where the API is out of reach, so "Ready" is
tested the way the workers' readiness probe tests it: a TCP connection to the
ssh port. The MPI Operator's ``discover_hosts.sh`` lists every Running worker,
Ready or not, and Horovod's elastic driver fails on a host whose sshd is not up
yet; ``ready`` filters that list. ``wait`` holds a launcher started together
with its workers (``launcherCreationPolicy: AtStartup``, as under Kueue) until
every host of the operator's hostfile is reachable, then runs mpirun.

    python -m hvdk8s.launcher.hosts ready --port 2222 -- /etc/mpi/discover_hosts.sh
    python -m hvdk8s.launcher.hosts wait --port 2222 --hostfile /etc/mpi/hostfile -- mpirun ...
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence

CONNECT_SECONDS = 1.0
POLL_SECONDS = 2.0


def accepts(host: str, port: int, timeout: float = CONNECT_SECONDS) -> bool:
    """True when ``host:port`` accepts a TCP connection (the readiness probe's test)."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:  # refused, unreachable, or not in DNS yet (the Service lists Ready pods only)
        return False


def ready_lines(lines: Iterable[str], is_ready: Callable[[str], bool]) -> list[str]:
    """The ``host[:slots]`` lines whose host is ready, in order."""
    return [line for line in (raw.strip() for raw in lines) if line and is_ready(line.split(":")[0])]


def hostfile_hosts(text: str, own_hostname: str) -> list[str]:
    """Hosts of an Open MPI hostfile (``host slots=N``) other than this pod (runLauncherAsWorker lists it)."""
    hosts = [line.split()[0] for line in text.splitlines() if line.strip() and not line.startswith("#")]
    return [h for h in hosts if h.split(".")[0] != own_hostname]


def wait_for(hosts: Sequence[str], is_ready: Callable[[str], bool], timeout: float,
             sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> list[str]:
    """Poll until every host is ready or ``timeout`` passes; the hosts still not ready."""
    deadline = clock() + timeout
    waiting = list(hosts)
    while waiting := [h for h in waiting if not is_ready(h)]:
        if clock() >= deadline:
            break
        sleep(min(POLL_SECONDS, max(deadline - clock(), 0.0)))
    return waiting


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hvdk8s.launcher.hosts", description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("ready", "wait"))
    parser.add_argument("--port", type=int, required=True, help="the workers' sshd port")
    parser.add_argument("--hostfile", default="/etc/mpi/hostfile", help="wait: the operator's hostfile")
    parser.add_argument("--timeout", type=float, default=600.0, help="wait: give up after this many seconds")
    parser.epilog = "after --: the discovery script (ready) or the command to run (wait)"
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    args, command = parser.parse_args(argv[:split]), argv[split + 1:]
    if not command:
        parser.error("give the command after --")
    ready = lambda host: accepts(host, args.port)  # noqa: E731
    if args.mode == "ready":
        listed = subprocess.run(command, capture_output=True, text=True, check=False)
        if listed.returncode != 0:
            sys.stderr.write(listed.stderr)
            return listed.returncode
        print("\n".join(ready_lines(listed.stdout.splitlines(), ready)))
        return 0
    with open(args.hostfile) as f:
        hosts = hostfile_hosts(f.read(), socket.gethostname())
    if missing := wait_for(hosts, ready, args.timeout):
        print(f"hvdk8s: after {args.timeout:.0f} s no sshd answers on port {args.port} of: {', '.join(missing)}",
              file=sys.stderr)
        return 1
    os.execvp(command[0], command)


if __name__ == "__main__":
    sys.exit(main())
