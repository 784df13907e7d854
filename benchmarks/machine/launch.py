"""Start benchmark processes the way real jobs start: mpirun ranks or TF_CONFIG clusters.

Every job writes one log file, runs in its own process group (so a timeout
or Ctrl-C ends it and only it), and reports wall time and the CPU time its
processes used (from the kernel's accounting of reaped children), which says
whether a run was bound by this machine's cores.
"""
from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hvdk8s.common.quiet import quiet_tensorflow
from hvdk8s.launcher import mpirun
from hvdk8s.mpijob import tfjob

from ..emulation import netns
from .util import free_ports

PKG = __name__.rsplit(".", 2)[0]  # the benchmarks package (``benchmarks`` or ``hvdk8s.benchmarks``), not ``.machine``


def _checkout() -> Path | None:
    """The source checkout this package runs from (an editable install, or ``python -m benchmarks`` at its root);
    None for an installed package, which has no repository around it."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() else None


CHECKOUT = _checkout()
AGENT = Path(__file__).resolve().parents[1] / "emulation" / "netns_agent.py"
TF_PORT = tfjob.PORT  # in the emulated cluster every task has a host (and its ports) to itself, as a TFJob's pods

# Open MPI settings for every Horovod job: hvdk8s's own (ranks yield the core
# while they wait instead of busy-polling). Open MPI picks the allreduce
# algorithm by message size (forcing its ring measured no better: see ``knobs``).
MPI_MCA = dict(mpirun.DEFAULT_MCA)


class JobFailed(RuntimeError):
    """A benchmark job exited non-zero or timed out; the message ends with its log's tail."""


@dataclass(frozen=True)
class JobStats:
    """``cpu_seconds``: used by the job's processes (None where mpirun's remote daemons
    detach from this process tree); ``machine_busy_cores``: the whole machine's
    average busy cores meanwhile, other users' load included."""

    name: str
    wall_seconds: float
    cpu_seconds: float | None
    machine_busy_cores: float | None
    log: str  # relative to the output folder

    def to_json(self) -> dict[str, object]:
        return {
            "wall_seconds": self.wall_seconds,
            "cpu_seconds": self.cpu_seconds,
            "machine_busy_cores": self.machine_busy_cores,
            "log": self.log,
        }


def module_argv(module: str, *args: str, python: str | None = None) -> list[str]:
    """This interpreter (or ``python``, see ``interpreter``) running one of the benchmarks' modules, named from the
    package's root (``workers.worker``; works as ``benchmarks`` or ``hvdk8s.benchmarks``)."""
    return [python or sys.executable, "-u", "-m", f"{PKG}.{module}", *args]


def interpreter(python: str = "") -> str:
    """The Python a job's processes run: this one for "", else ``python`` relative to the checkout (where the stack
    knobs' virtual environments are built), or to the working folder for an installed package, or absolute. Not
    resolved: a virtual environment's ``bin/python`` is a symlink whose own path makes it that environment."""
    return str((CHECKOUT or Path.cwd()) / python) if python else sys.executable


STACK_PROBE_TIMEOUT_S = 300.0


def probe_stack(python: str, timeout: float = STACK_PROBE_TIMEOUT_S) -> dict[str, str]:
    """What ``python`` runs (``envinfo.stack_versions``: TensorFlow, Keras, Horovod, this package), from a process of it
    started as the workers are; ``ValueError`` says why it cannot run the benchmarks (missing, or an import fails)."""
    if not os.access(python, os.X_OK) or Path(python).is_dir():
        raise ValueError(f"{python}: no such interpreter")
    code = f"import json; from {PKG}.machine.envinfo import stack_versions; print(json.dumps(stack_versions()))"
    try:
        done = subprocess.run([python, "-c", code], env=base_env(1), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ValueError(f"{python}: importing the stack took over {timeout:.0f}s") from None
    except OSError as err:
        raise ValueError(f"{python}: cannot start ({err})") from None
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ValueError(f"{python}: cannot import the benchmark stack (exit code {done.returncode}: {tail})")
    return json.loads(lines[-1])


THREAD_VARIABLES = ("OMP_NUM_THREADS", "HVDK8S_THREADS_PER_RANK")


def rank_env(threads: int | None) -> dict[str, str]:
    """The thread count a job's ranks get, here (``base_env``) and in a cluster's pods (``cluster_jobs``): none for
    None, so the processes choose their own as a user's script does."""
    return {} if threads is None else {name: str(threads) for name in THREAD_VARIABLES}


def base_env(threads: int | None, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A job's environment; ``threads`` None sets no thread count (and drops one inherited), so the processes
    choose their own as a user's script does: TensorFlow's defaults, or ``hvdk8s.init``'s policy."""
    env = dict(os.environ)
    env.update(
        {
            # ``python -m benchmarks`` at the checkout's root: its ranks import ``benchmarks`` from there too. As
            # ``hvdk8s.benchmarks`` (installed, or editable) the package is importable as it is: nothing added.
            "PYTHONPATH": os.pathsep.join(filter(None, [str(CHECKOUT) if CHECKOUT and PKG == "benchmarks" else "",
                                                        env.get("PYTHONPATH", "")])),
            "PYTHONUNBUFFERED": "1",
            "CUDA_VISIBLE_DEVICES": "",
        }
    )
    quiet_tensorflow(env)  # as every hvdk8s command's ranks: a value the user set, or verbose, is kept
    for name in THREAD_VARIABLES:
        env.pop(name, None)
    env.update(rank_env(threads))
    env.pop("TF_CONFIG", None)
    env.update(extra or {})
    return env


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _cpu_jiffies() -> tuple[int, int] | None:
    """(busy, total) jiffies of all cores from /proc/stat, or None off Linux."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


def _busy_cores(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    if before is None or after is None or after[1] == before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1]) * (os.cpu_count() or 1)


def _stop(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """End a process group this module started (by its own id), politely first."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=grace)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()


def _tail(log: Path, lines: int = 40) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


Task = tuple[str, int]


def tf_cluster_plan(roles: Mapping[str, int], cluster: netns.Cluster | None) -> tuple[dict[str, list[str]], dict[Task, netns.Host | None]]:
    """TF_CONFIG cluster spec and each task's host (None: this machine).

    On localhost every task gets an ephemeral 127.0.0.1 port; in an emulated
    cluster the chief sits on host 0, workers on hosts 1..N and parameter
    servers after them, each on its own host and so on a fixed port.
    """
    order = [r for r in ("chief", "worker", "ps") if roles.get(r)]
    tasks = [(role, i) for role in order for i in range(roles[role])]
    if cluster is None:
        addr = {t: f"127.0.0.1:{p}" for t, p in zip(tasks, free_ports(len(tasks)))}
        place: dict[Task, netns.Host | None] = {t: None for t in tasks}
    else:
        first = {"chief": 0, "worker": 1, "ps": 1 + roles.get("worker", 0)}
        needed = max(first[r] + i for r, i in tasks) + 1
        if needed > len(cluster.hosts):
            raise ValueError(f"TF cluster {dict(roles)}: needs {needed} emulated hosts, the cluster has {len(cluster.hosts)}")
        hosts = {(r, i): cluster.hosts[first[r] + i] for r, i in tasks}
        addr = {t: f"{hosts[t].ip}:{TF_PORT}" for t in tasks}
        place = dict(hosts)
    return {r: [addr[(r, i)] for i in range(roles[r])] for r in order}, place


def mpi_command(
    np: int, argv: list[str], env_names: list[str], cluster: netns.Cluster | None, *, as_root: bool,
    mca: Mapping[str, str] | None = None,
) -> list[str]:
    """hvdk8s's mpirun argv plus MPI_MCA (and ``mca`` over it); for a cluster, mpirun runs on host 0 and starts
    one rank on each of hosts 1..np through ``netns_agent`` (Open MPI's ssh replacement), over the emulated links only."""
    mca = {**MPI_MCA, **(mca or {})}
    if cluster is None:
        return mpirun.mpirun_argv(np, argv, env_names=env_names, allow_run_as_root=as_root, mca=mca)
    launcher, workers = cluster.hosts[0], cluster.hosts[1 : 1 + np]
    if len(workers) < np:
        raise ValueError(f"mpirun: the emulated cluster has {len(cluster.hosts) - 1} worker hosts, the job needs {np}")
    mca.update(
        {
            "plm_rsh_agent": f"{sys.executable} {AGENT}",
            "plm_rsh_no_tree_spawn": "1",
            "oob_tcp_if_include": netns.HOST_IFACE,
            "btl_tcp_if_include": netns.HOST_IFACE,
        }
    )
    hosts = ",".join(f"{h.name}:1" for h in workers)
    inner = mpirun.mpirun_argv(np, argv, hosts=hosts, env_names=env_names, allow_run_as_root=as_root, mca=mca)
    return launcher.exec_argv(["unshare", "--uts", sys.executable, str(AGENT), "--as-host", launcher.name, "--", *inner])


class Launcher:
    """Runs jobs with logs under ``log_dir``; ``timeout`` bounds each job."""

    def __init__(self, log_dir: Path, threads: int, timeout: float) -> None:
        self.log_dir = log_dir
        self.threads = threads
        self.timeout = timeout
        log_dir.mkdir(parents=True, exist_ok=True)

    def group(
        self,
        name: str,
        mains: Sequence[tuple[list[str], dict[str, str]]],
        servers: Sequence[tuple[list[str], dict[str, str]]] = (),
        *,
        cpu_counted: bool = True,
    ) -> JobStats:
        """Start servers then mains; wait for every main, then stop the servers."""
        log = self.log_dir / f"{name}.log"
        cpu0, jiffies0, t0 = _cpu_seconds(), _cpu_jiffies(), time.perf_counter()
        procs: list[subprocess.Popen] = []
        with open(log, "w") as fh:
            try:
                for argv, env in servers:
                    procs.append(subprocess.Popen(argv, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True))
                main_procs = []
                for argv, env in mains:
                    main_procs.append(subprocess.Popen(argv, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True))
                procs += main_procs
                deadline = time.monotonic() + self.timeout
                for proc in main_procs:
                    try:
                        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
                    except subprocess.TimeoutExpired:
                        raise JobFailed(f"{name}: timed out after {self.timeout:.0f}s\n{_tail(log)}") from None
                    if code != 0:
                        raise JobFailed(f"{name}: exit code {code}\n{_tail(log)}")
            finally:
                for proc in reversed(procs):
                    _stop(proc)
        return JobStats(
            name,
            time.perf_counter() - t0,
            _cpu_seconds() - cpu0 if cpu_counted else None,
            _busy_cores(jiffies0, _cpu_jiffies()),
            str(log.relative_to(self.log_dir.parent)),
        )

    def single(self, name: str, argv: list[str], env: Mapping[str, str] | None = None) -> JobStats:
        return self.group(name, [(argv, base_env(self.threads, env))])

    def mpi(
        self,
        name: str,
        np: int,
        argv: list[str],
        env: Mapping[str, str] | None = None,
        cluster: netns.Cluster | None = None,
        mca: Mapping[str, str] | None = None,
        own_threads: bool = False,
    ) -> JobStats:
        """``np`` ranks via hvdk8s's own mpirun command line; in ``cluster``, one rank per emulated host.
        ``own_threads``: the ranks get no thread count from the suite (``base_env``)."""
        environ = base_env(None if own_threads else self.threads, env)
        command = mpi_command(np, argv, mpirun.forwarded_env(environ), cluster, as_root=os.geteuid() == 0, mca=mca)
        return self.group(name, [(command, environ)], cpu_counted=cluster is None)

    def tf_cluster(
        self,
        name: str,
        roles: Mapping[str, int],
        main_argv: list[str],
        server_argv: list[str],
        *,
        mains: str,
        env: Mapping[str, str] | None = None,
        cluster: netns.Cluster | None = None,
    ) -> JobStats:
        """A TF_CONFIG cluster (see ``tf_cluster_plan``); tasks of role ``mains`` run ``main_argv``, the others serve."""
        spec, place = tf_cluster_plan(roles, cluster)
        main_list: list[tuple[list[str], dict[str, str]]] = []
        server_list: list[tuple[list[str], dict[str, str]]] = []
        for task in place:
            tf_config = {"cluster": spec, "task": {"type": task[0], "index": task[1]}}
            environ = base_env(self.threads, {**(env or {}), "TF_CONFIG": json.dumps(tf_config)})
            argv = main_argv if task[0] == mains else server_argv
            host = place[task]
            full = host.exec_argv(argv) if host is not None else argv
            (main_list if task[0] == mains else server_list).append((full, environ))
        return self.group(name, main_list, server_list)
