"""Which MPIJob workers can take ranks: those whose sshd accepts connections.

Run inside the launcher pod, where the API is out of reach, so "Ready" is
tested the way the workers' readiness probe tests it: a TCP connection to the
ssh port. The MPI Operator's ``discover_hosts.sh`` lists every Running worker,
Ready or not, and Horovod's elastic driver fails on a host whose sshd is not up
yet; ``ready`` filters that list. ``wait`` holds every launcher until each
host of the controller's hostfile is reachable, then runs mpirun: a launcher may
start before its workers' sshd (``AtStartup``, and any job Kueue suspends, which
the MPI Operator starts together with its workers on resume), and when they are
up the wait costs one connection per host.

``--identity`` is for Kubeflow Trainer v2.3.0, which mounts the ssh private key
with mode 0640 (pkg/constants: MPISSHPrivateKeyFileMode): OpenSSH refuses a key
the user owns that others may read, so a root launcher could never connect. The
wait hands ssh a private 0600 copy instead (through ``OMPI_MCA_plm_rsh_args``,
which both controllers set and mpirun passes to ssh), and turns off Open MPI's
tree spawn, under which orteds on the node pods, where there is no copy, would
ssh on to further pods.

    python -m hvdk8s.launcher.hosts ready --port 2222 -- /etc/mpi/discover_hosts.sh
    python -m hvdk8s.launcher.hosts wait --port 2222 --timeout 3600 -- mpirun ...
"""
from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence

CONNECT_SECONDS = 1.0
POLL_SECONDS = 2.0
# Where both controllers point Open MPI (and so this wait) at their hostfile.
HOSTFILE_ENV = "OMPI_MCA_orte_default_hostfile"
RSH_ARGS_ENV = "OMPI_MCA_plm_rsh_args"
# Open MPI 4.1 orte/mca/plm/rsh/plm_rsh_component.c registers "no_tree_spawn" (plm_rsh_no_tree_spawn, bool):
# without it, orteds started on the first hosts ssh on to further hosts with the same plm_rsh_args.
NO_TREE_SPAWN_ENV = "OMPI_MCA_plm_rsh_no_tree_spawn"


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


def private_identity(key: str, env: dict[str, str]) -> dict[str, str]:
    """Copy ``key`` to a fresh 0600 file only this user can read; ``env`` with ssh told to use it, and
    Open MPI told to start every orted from here: the copy exists on this pod only, so an orted on a
    node pod (Open MPI's default tree spawn) could not ssh on with it."""
    folder = tempfile.mkdtemp(prefix="hvdk8s-ssh-")  # 0700
    copy = os.path.join(folder, os.path.basename(key))
    fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out, open(key, "rb") as src:
        shutil.copyfileobj(src, out)
    rsh_args = " ".join(filter(None, [env.get(RSH_ARGS_ENV, ""), "-i", copy]))
    return env | {RSH_ARGS_ENV: rsh_args, NO_TREE_SPAWN_ENV: "1"}


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``python -m hvdk8s.launcher.hosts`` (the docs' Command line page renders it too).

    It parses the arguments before ``--``; ``main`` takes what follows as the command.
    """
    parser = argparse.ArgumentParser(prog="python -m hvdk8s.launcher.hosts", description=__doc__.split("\n\n")[0],
                                     epilog="after --: the discovery script (ready) or the command to run (wait)")
    parser.add_argument("mode", choices=("ready", "wait"),
                        help="ready: print the workers whose sshd answers (elastic host discovery); "
                             "wait: run the command once every worker in the hostfile answers")
    parser.add_argument("--port", type=int, required=True, help="the workers' sshd port")
    parser.add_argument("--hostfile", default=os.environ.get(HOSTFILE_ENV, "/etc/mpi/hostfile"),
                        help=f"wait: the controller's hostfile (default: ${HOSTFILE_ENV}, else /etc/mpi/hostfile)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="wait: give up after this many seconds")
    parser.add_argument("--identity", metavar="KEY", help="wait: ssh with a private 0600 copy of this key")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
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
    try:
        with open(args.hostfile) as f:
            hosts = hostfile_hosts(f.read(), socket.gethostname())
    except OSError as err:
        print(f"hvdk8s: cannot read the hostfile {args.hostfile}: {err.strerror}", file=sys.stderr)
        return 1
    if missing := wait_for(hosts, ready, args.timeout):
        print(f"hvdk8s: after {args.timeout:g} s these workers never answered on their sshd port {args.port}: "
              f"{', '.join(missing)} (raise workerWaitSeconds in the job file if they are still starting: "
              "node scale-up, image pull)", file=sys.stderr)
        return 1
    env = dict(os.environ)
    if args.identity:
        try:
            env = private_identity(args.identity, env)
        except OSError as err:
            print(f"hvdk8s: cannot copy the ssh key {args.identity}: {err.strerror}", file=sys.stderr)
            return 1
    os.execvpe(command[0], command, env)


if __name__ == "__main__":
    sys.exit(main())
