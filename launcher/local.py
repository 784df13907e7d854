"""``hvdk8s run``: launch N ranks with mpirun and stream their output.

The side-effecting edge around ``mpirun_argv``: picks the interpreter, the
environment to forward, root flags, then relays output with rank prefixes and
turns the failure into one line that names its cause: the exception a rank raised, else the
rank that left first (mpirun's or horovodrun's report).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TextIO

from hvdk8s.common.errors import UserError
from hvdk8s.launcher import mpirun


def script_command(command: Sequence[str]) -> list[str]:
    """Run ``*.py`` files with this interpreter, anything else as given."""
    if command and command[0].endswith(".py"):
        if not os.path.isfile(command[0]):
            raise UserError(f"script {command[0]}: no such file")
        return [sys.executable, "-u", *command]
    return list(command)


def installed_script(name: str) -> str:
    """A console script of this environment (a venv's bin need not be on PATH), else from PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), name)
    found = beside if os.access(beside, os.X_OK) else shutil.which(name)
    if found is None:
        raise UserError(f"{name} not found beside {sys.executable} or on PATH: install Horovod (make setup does)")
    return found


@dataclass(frozen=True)
class ElasticOptions:
    """``horovodrun`` elastic settings (see ``mpirun.horovodrun_argv``)."""

    min_np: int
    max_np: int
    discovery_script: str
    slots: int | None = None
    blacklist_cooldown: tuple[int, int] | None = None


def elastic_argv(np: int, command: list[str], options: ElasticOptions, network_interface: str | None) -> list[str]:
    """Check the user's elastic flags, then build the command with this environment's horovodrun."""
    if not os.access(options.discovery_script, os.X_OK):
        raise UserError(f"--host-discovery-script {options.discovery_script}: not an executable file")
    if options.blacklist_cooldown and (problem := mpirun.blacklist_cooldown_problem(options.blacklist_cooldown)):
        raise UserError(f"--blacklist-cooldown: {problem}")
    try:
        argv = mpirun.horovodrun_argv(
            np,
            command,
            min_np=options.min_np,
            max_np=options.max_np,
            discovery_script=os.path.abspath(options.discovery_script),
            slots=options.slots,
            network_interface=network_interface,
            blacklist_cooldown=options.blacklist_cooldown,
        )
    except ValueError as err:
        raise UserError(f"--min-np/-np/--max-np: {err}") from None
    return [installed_script("horovodrun"), *argv[1:]]


def run(
    np: int,
    command: Sequence[str],
    *,
    hosts: str | None = None,
    env: Sequence[str] = (),
    timeline: str | None = None,
    elastic: ElasticOptions | None = None,
    allreduce_algorithm: mpirun.AllreduceAlgorithm = "auto",
    tcp_eager_limit: int = mpirun.DEFAULT_TCP_EAGER_LIMIT,
    network_interface: str | None = None,
    out: TextIO = sys.stdout,
) -> int:
    """Run ``command`` on ``np`` ranks (elastic: with horovodrun); return the job's exit status.

    ``network_interface`` carries the ranks' traffic, as ``horovodrun
    --network-interface`` does: Open MPI's TCP transport and NCCL's sockets
    (plain runs), Gloo (elastic runs, where horovodrun takes it itself).
    """
    if np < 1:
        raise UserError(f"-np {np}: must be >= 1")
    if problem := mpirun.tcp_eager_limit_problem(tcp_eager_limit):
        raise UserError(f"--tcp-eager-limit {problem}")
    environ = dict(os.environ)
    for item in env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UserError(f"--env {item!r}: expected NAME=VALUE")
        environ[name] = value
    if timeline:
        environ["HOROVOD_TIMELINE"] = os.path.abspath(timeline)
    environ.setdefault("PYTHONUNBUFFERED", "1")
    if elastic is None:
        if shutil.which("mpirun") is None:
            raise UserError("mpirun not found: install Open MPI (make setup does)")
        if network_interface:
            environ["NCCL_SOCKET_IFNAME"] = network_interface  # horovodrun's mpirun -x NCCL_SOCKET_IFNAME=...
        argv = mpirun.mpirun_argv(
            np,
            script_command(command),
            hosts=hosts,
            env_names=mpirun.forwarded_env(environ),
            allow_run_as_root=os.geteuid() == 0,
            mca=mpirun.transport_mca(allreduce_algorithm, tcp_eager_limit=tcp_eager_limit,
                                     network_interface=network_interface),
        )
    elif allreduce_algorithm != "auto":
        raise UserError("--allreduce-algorithm: elastic runs use horovodrun over Gloo, not Open MPI's allreduce")
    elif tcp_eager_limit != mpirun.DEFAULT_TCP_EAGER_LIMIT:
        raise UserError("--tcp-eager-limit: elastic runs use horovodrun over Gloo, not Open MPI's TCP transport")
    else:
        argv = elastic_argv(np, script_command(command), elastic, network_interface)
    tail: deque[str] = deque(maxlen=60)  # mpirun's own closing report, for failure_summary
    ranks: set[int] = set()
    collateral: set[int] = set()
    errors = mpirun.RankErrors()
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environ, bufsize=1) as proc:
        assert proc.stdout is not None
        for rank, text in mpirun.rank_lines(proc.stdout):
            if rank is None:
                tail.append(text)
                print(text, file=out, flush=True)
            else:
                ranks.add(rank)
                errors.feed(rank, text)
                if mpirun.HOROVOD_SHUTDOWN in text:
                    collateral.add(rank)
                print(f"[{rank}] {text}", file=out, flush=True)
    if proc.returncode != 0:
        reason = mpirun.failure_summary("\n".join(tail), proc.returncode, ranks, collateral, errors.errors,
                                        launcher="mpirun" if elastic is None else "horovodrun")
        print(f"hvdk8s run: job failed: {reason}", file=sys.stderr, flush=True)
    return proc.returncode
