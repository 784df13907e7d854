"""The launcher command lines (mpirun, and horovodrun for elastic jobs), as pure functions.

``hvdk8s run`` executes them on localhost and the MPIJob renderer puts the very
same argv into the launcher pod, so a command that works on a laptop is the
command the cluster runs.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Literal

# Variables worth forwarding to remote ranks (mpirun -x): process basics plus
# every knob of the libraries involved.
FORWARD_NAMES = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONUNBUFFERED")
FORWARD_PREFIXES = ("HOROVOD_", "NCCL_", "HVDK8S_", "TF_", "OMP_")

# Horovod's recommended Open MPI settings: no core binding (TensorFlow runs its
# own thread pools), ranks placed slot by slot, the TCP/ob1 transport that works
# in every container network.
BASE_FLAGS = ("-bind-to", "none", "-map-by", "slot", "--tag-output", "-mca", "pml", "ob1", "-mca", "btl", "^openib")
# Open MPI's TCP transport sends a message of up to its eager limit at once; a larger one waits for
# the receiver's reply before the rest (rendezvous). Where ranks share their cores with compute, each
# such wait can cost a scheduler time slice: docs/benchmark-studies.md, "Open MPI's TCP eager limit".
MIN_TCP_EAGER_LIMIT = 64 << 10  # Open MPI's own default
DEFAULT_TCP_EAGER_LIMIT = 16 << 20
MAX_TCP_EAGER_LIMIT = 1 << 30  # each rank may keep a send buffer this large
DEFAULT_TCP_MAX_SEND_SIZE = 128 << 10  # Open MPI's btl_tcp_max_send_size


def tcp_eager_limit_problem(limit: int) -> str | None:
    """What is wrong with a TCP eager limit, or None."""
    if not MIN_TCP_EAGER_LIMIT <= limit <= MAX_TCP_EAGER_LIMIT:
        return (f"{limit}: must be between {MIN_TCP_EAGER_LIMIT} (Open MPI's default) and {MAX_TCP_EAGER_LIMIT} "
                "bytes")
    return None


# Horovod 0.28.1 horovod/runner/elastic/discovery.py (HostState._validate_cooldown_range) raises ValueError for a
# min below 1 or a max above 3600 seconds, in the elastic driver's discovery thread when it first sees a host:
# the job would end in a thread's traceback. min <= max is hvdk8s's own rule (Horovod would wait min every time).
HOROVOD_COOLDOWN_RANGE = (1, 3600)


def blacklist_cooldown_problem(cooldown: tuple[int, int]) -> str | None:
    """What is wrong with horovodrun's blacklist cooldown range (seconds), or None."""
    low, high = cooldown
    floor, ceiling = HOROVOD_COOLDOWN_RANGE
    if floor <= low <= high <= ceiling:
        return None
    return (f"blacklist cooldown: need {floor} <= min ({low}) <= max ({high}) <= {ceiling} seconds "
            f"(Horovod refuses a min below {floor} or a max above {ceiling})")


def tcp_eager_mca(limit: int) -> dict[str, str]:
    """Open MPI's TCP eager limit, with the rendezvous first fragment at the limit and the largest fragment
    at least the limit (never below Open MPI's 128 KiB).

    The three were measured together; at ``MIN_TCP_EAGER_LIMIT`` they are Open MPI's own defaults.
    """
    if problem := tcp_eager_limit_problem(limit):
        raise ValueError(f"TCP eager limit {problem}")
    return {
        "btl_tcp_eager_limit": str(limit),
        "btl_tcp_rndv_eager_limit": str(limit),
        "btl_tcp_max_send_size": str(max(limit, DEFAULT_TCP_MAX_SEND_SIZE)),
    }


# Ranks yield the core while they wait in MPI instead of busy-polling it (Open MPI's default): the
# clearest of the transport settings measured in benchmarks/reports/knobs (polling ran at 0.3-0.6 of
# the rate); and the TCP eager limit above.
DEFAULT_MCA: Mapping[str, str] = {"mpi_yield_when_idle": "1", **tcp_eager_mca(DEFAULT_TCP_EAGER_LIMIT)}
# Open MPI's allreduce algorithms (coll_tuned_allreduce_algorithm, names as ``ompi_info`` lists them);
# auto leaves the choice to Open MPI's size-based decision rules.
AllreduceAlgorithm = Literal[
    "auto", "basic_linear", "nonoverlapping", "recursive_doubling", "ring", "segmented_ring", "rabenseifner"
]
# Parameters set for the launcher by hvdk8s's argv or by the MPI Operator, and why a job may not set them too
# (an mpirun -mca flag wins over the OMPI_MCA_* variable of the same name).
OWNED_MCA = {
    "pml": "hvdk8s launches over ob1 (TCP), the transport every container network has",
    "btl": "hvdk8s launches over ob1 (TCP), the transport every container network has",
    "coll_tuned_use_dynamic_rules": "set by hvdk8s whenever a coll_tuned_* parameter is given",
    "coll_tuned_allreduce_algorithm": "set it with openMpi.allreduceAlgorithm",
    "mpi_yield_when_idle": "set it with openMpi.yieldWhenIdle",
    **{name: "set it with openMpi.tcpEagerLimit" for name in tcp_eager_mca(DEFAULT_TCP_EAGER_LIMIT)},
    "orte_default_hostfile": "set by the MPI Operator (its hostfile of the job's pods)",
    "orte_keep_fqdn_hostnames": "set by the MPI Operator (its hostfile of the job's pods)",
    "plm_rsh_args": "set by the MPI Operator (how the launcher reaches the workers' sshd)",
}
MCA_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def transport_mca(
    allreduce_algorithm: AllreduceAlgorithm = "auto", yield_when_idle: bool = True,
    extra: Mapping[str, str] | None = None, *, tcp_eager_limit: int = DEFAULT_TCP_EAGER_LIMIT,
    network_interface: str | None = None,
) -> dict[str, str]:
    """Open MPI parameters (``-mca``, over ``DEFAULT_MCA``) for a job's transport settings; ``extra`` holds others.

    Open MPI's tuned collectives read a fixed algorithm, or any other
    ``coll_tuned_*`` choice, only with their dynamic rules on.
    ``network_interface`` (an interface name, as horovodrun takes it)
    carries the ranks' TCP traffic and mpirun's own wire-up: ``horovodrun
    --network-interface`` sets ``btl_tcp_if_include`` (Horovod 0.28.1
    ``horovod/runner/mpi_run.py``), and ``oob_tcp_if_include`` keeps the
    out-of-band channel on the same network.
    """
    mca = dict(extra or {})
    if network_interface:
        mca.update(btl_tcp_if_include=network_interface, oob_tcp_if_include=network_interface)
    if tcp_eager_limit != DEFAULT_TCP_EAGER_LIMIT:
        mca.update(tcp_eager_mca(tcp_eager_limit))
    if allreduce_algorithm != "auto":
        mca["coll_tuned_allreduce_algorithm"] = allreduce_algorithm
    if any(name.startswith("coll_tuned_") for name in mca):
        mca["coll_tuned_use_dynamic_rules"] = "1"
    if not yield_when_idle:
        mca["mpi_yield_when_idle"] = "0"
    return mca


def mca_problems(extra: Mapping[str, str]) -> dict[str, str]:
    """What is wrong with each refused name of ``extra`` (a job spec's own Open MPI parameters)."""
    problems = {}
    for name, value in extra.items():
        if not MCA_NAME.match(name):
            problems[name] = "not an Open MPI parameter name (lowercase letters, digits and _)"
        elif name in OWNED_MCA:
            problems[name] = OWNED_MCA[name]
        elif not str(value).strip():
            problems[name] = "empty value"
    return problems


def forwarded_env(environ: Mapping[str, str], extra: Iterable[str] = ()) -> list[str]:
    """Names from ``environ`` to pass with ``-x``, in a stable order."""
    names = {n for n in environ if n in FORWARD_NAMES or n.startswith(FORWARD_PREFIXES)}
    return sorted(names | set(extra))


# One label of a host name (letters, digits, - and _ inside), so an IPv4 address passes too.
_HOST_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]*[A-Za-z0-9_])?"
_HOST_NAME = re.compile(rf"{_HOST_LABEL}(?:\.{_HOST_LABEL})*")
# Open MPI 4's relative names for the allocation's nodes (orte/util/dash_host: +n<index>, +e or +e:<count> empty).
_RELATIVE = re.compile(r"\+n[0-9]+|\+e(:[1-9][0-9]*)?")


def check_hosts(hosts: str) -> None:
    """Raise ``ValueError`` naming the first entry of an Open MPI ``-H`` list that mpirun would not take.

    Entries are ``host`` or ``host:slots`` (a whole number above 0, or ``*``/``auto`` for the host's cores), or a
    relative ``+n<i>``/``+e[:n]`` (Open MPI 4.1's orte/util/dash_host). Slots are not summed against ``-np``: under
    a hostfile or a resource manager's allocation, ``-H`` only picks hosts from it, with the allocation's slots.
    """
    for entry in hosts.split(","):
        if _RELATIVE.fullmatch(entry):
            continue
        host, colon, slots = entry.partition(":")
        if not host:
            raise ValueError(f"{entry!r}: no host name")
        if not _HOST_NAME.fullmatch(host):
            raise ValueError(f"{entry!r}: {host!r} is not a host name or IPv4 address")
        if colon and slots not in ("*", "auto") and not (slots.isascii() and slots.isdigit() and int(slots) > 0):
            raise ValueError(f"{entry!r}: slots {slots!r} is not a whole number above 0 (or * or auto)")


def mpirun_argv(
    np: int,
    command: Sequence[str],
    *,
    hosts: str | None = None,
    env_names: Sequence[str] = (),
    allow_run_as_root: bool = False,
    mca: Mapping[str, str] | None = None,
) -> list[str]:
    """Build ``mpirun`` argv for ``np`` ranks running ``command``.

    ``hosts`` is Open MPI's ``-H`` list (``host1:2,host2:2``); without it
    mpirun uses localhost or the hostfile the MPI Operator configures.
    ``mca`` adds or overrides Open MPI parameters over ``DEFAULT_MCA``.
    """
    if np < 1:
        raise ValueError(f"np={np}: must be >= 1")
    if not command:
        raise ValueError("command: empty")
    argv = ["mpirun", "-np", str(np)]
    if allow_run_as_root:
        argv.append("--allow-run-as-root")
    if hosts:
        argv += ["-H", hosts]
    argv += BASE_FLAGS
    for key, value in sorted({**DEFAULT_MCA, **(mca or {})}.items()):
        argv += ["-mca", key, value]
    for name in env_names:
        argv += ["-x", name]
    return argv + list(command)


def horovodrun_argv(
    np: int,
    command: Sequence[str],
    *,
    min_np: int,
    max_np: int,
    discovery_script: str,
    slots: int | None = None,
    network_interface: str | None = None,
    blacklist_cooldown: tuple[int, int] | None = None,
) -> list[str]:
    """Build elastic ``horovodrun`` argv: ``np`` ranks to start, kept within [min_np, max_np].

    Elastic Horovod runs over Gloo and forwards the launcher's environment
    itself. ``discovery_script`` prints ``host[:slots]`` lines; ``slots`` is
    used for hosts listed without a count. Horovod's driver waits for two hosts
    to agree on a network interface unless ``network_interface`` names one,
    so single-host runs need it (``lo``). Horovod blacklists the host of a
    failed worker for good, unless ``blacklist_cooldown`` (min, max seconds)
    lets it back: after the host's n-th failure, ``min * 2**n`` plus up to
    ``min`` more at random, clamped to [min, max] (Horovod 0.28.1
    ``horovod/runner/elastic/discovery.py``, HostState._set_cooldown_period).
    """
    if not 1 <= min_np <= np <= max_np:
        raise ValueError(f"elastic bounds: need 1 <= min_np ({min_np}) <= np ({np}) <= max_np ({max_np})")
    if not command:
        raise ValueError("command: empty")
    argv = ["horovodrun", "-np", str(np), "--min-np", str(min_np), "--max-np", str(max_np)]
    if slots is not None:
        argv += ["--slots", str(slots)]
    if network_interface:
        argv += ["--network-interface", network_interface]
    if blacklist_cooldown is not None:
        if problem := blacklist_cooldown_problem(blacklist_cooldown):
            raise ValueError(problem)
        argv += ["--blacklist-cooldown-range", *map(str, blacklist_cooldown)]
    return argv + ["--host-discovery-script", discovery_script, *command]


_TAG = re.compile(r"\[(?:\d+,)?(\d+)\]<(stdout|stderr)>:")
_FAILED_EXIT = re.compile(r"Process name:\s*\[\[\d+,\d+\],(\d+)\].*?Exit code:\s*(\d+)", re.S)
_FAILED_SIGNAL = re.compile(r"process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+)")


class RankLines:
    """Each rank's own lines, reassembled from mpirun's ``--tag-output`` stream.

    mpirun tags every *write*, not every line: an unbuffered ``print`` writes
    its text and its newline separately, and another rank's write can land in
    between (``[1,0]<stdout>:epoch 3[1,1]<stdout>:hello[1,0]<stdout>:``).
    Text is therefore collected per rank and stream until its newline arrives,
    so no line is attributed to the wrong rank.
    """

    def __init__(self) -> None:
        self._partial: dict[tuple[int, str], str] = {}

    def feed(self, line: str) -> list[tuple[int | None, str]]:
        """One line read from mpirun (newline stripped) -> the (rank or None, text) lines it completes.

        Untagged text is mpirun's own (rank None).
        """
        tags = list(_TAG.finditer(line))
        if not tags:
            return [(None, line)]
        done: list[tuple[int | None, str]] = []
        if tags[0].start():
            done.append((None, line[: tags[0].start()]))
        for tag, following in zip(tags, [*tags[1:], None]):
            key = (int(tag.group(1)), tag.group(2))
            text = self._partial.pop(key, "") + line[tag.end() : following.start() if following else len(line)]
            if following is None:  # the line's newline ends this write
                done.append((key[0], text))
            else:
                self._partial[key] = text
        return done

    def flush(self) -> list[tuple[int | None, str]]:
        """Text still waiting for a newline when the stream ended (a rank that died mid-line)."""
        done: list[tuple[int | None, str]] = [(rank, text) for (rank, _), text in self._partial.items()]
        self._partial.clear()
        return done


def rank_lines(stream: Iterable[str]) -> Iterator[tuple[int | None, str]]:
    """mpirun's output lines (as read from its pipe) -> each rank's lines as (rank or None, text)."""
    lines = RankLines()
    for line in stream:
        yield from lines.feed(line.rstrip("\n"))
    yield from lines.flush()


# Printed by ranks that Horovod stopped because another rank left the job.
HOROVOD_SHUTDOWN = "Horovod has been shut down"
_TRACEBACK = "Traceback (most recent call last):"
# horovodrun's elastic driver (horovod/runner/gloo_run.py, elastic/registration.py, v0.28.1): a worker's exit,
# the reason it stopped the whole job, and its closing report.
_ELASTIC_EXIT = re.compile(r"^Process (\d+) exit with status code (\d+)\.$", re.M)
_ELASTIC_STOP = re.compile(r"^ERROR:root:(.+) -> stop running$", re.M)
_ELASTIC_FIRST = re.compile(r"^Process name: (\S+)\nExit code: (\d+)$", re.M)
_BLACKLISTED = (
    "Horovod's elastic driver stopped the job: it blacklists the whole host of a failed worker, and no host was "
    "left; list each slot under a host name of its own (e.g. localhost:1 and 127.0.0.1:1) to keep the others"
)


class RankErrors:
    """The exception that ended each rank's Python traceback, by rank (the last one a rank printed)."""

    def __init__(self) -> None:
        self.errors: dict[int, str] = {}
        self._in_traceback: set[int] = set()

    def feed(self, rank: int, text: str) -> None:
        if text == _TRACEBACK:
            self._in_traceback.add(rank)
        elif rank in self._in_traceback and text.strip() and not text[0].isspace():
            self.errors[rank] = text  # a traceback's first unindented line is its exception
            self._in_traceback.discard(rank)


def _exit_status(code: int) -> str:
    return f"was killed by signal {code - 128}" if code > 128 else f"exited with code {code}"


def failed_rank(output: str) -> str | None:
    """The launcher's report of the first rank (mpirun) or worker process (horovodrun) to exit badly."""
    if match := _FAILED_SIGNAL.search(output):
        return f"rank {match.group(1)} on {match.group(2)} was killed by signal {match.group(3)}"
    if match := _FAILED_EXIT.search(output):
        return f"rank {match.group(1)} exited with code {match.group(2)}"
    if match := _ELASTIC_EXIT.search(output):
        return f"worker process {match.group(1)} {_exit_status(int(match.group(2)))}"
    if match := _ELASTIC_FIRST.search(output):
        return f"worker {match.group(1)} {_exit_status(int(match.group(2)))}"
    return None


def failure_summary(
    output: str, returncode: int, ranks: Iterable[int], collateral: Iterable[int],
    errors: Mapping[int, str] | None = None, launcher: str = "mpirun",
) -> str:
    """One line naming what failed the job: the exception a rank raised, else the rank that left first.

    mpirun names the first rank to *exit*, which is often a healthy rank that
    Horovod shut down after the faulty one left. Ranks that printed Horovod's
    shutdown message are therefore reported as collateral, and the ranks that
    did not are named as where to look; their own exceptions, when they raised
    one, are the cause. Horovod's elastic driver says why it stopped the job.
    """
    first = failed_rank(output) or f"{launcher} exited with code {returncode}"
    errors = errors or {}
    collateral = set(collateral)
    suspects = sorted(set(ranks) - collateral)
    raised = [f"rank {rank} raised {errors[rank]}" for rank in suspects if rank in errors]
    if raised:
        cause = "; ".join(raised)
    elif collateral and suspects:
        ranks_word = "rank" if len(suspects) == 1 else "ranks"
        cause = (
            f"{ranks_word} {', '.join(map(str, suspects))} left the job first; "
            f"ranks {', '.join(map(str, sorted(collateral)))} were stopped by Horovod as a result ({first})"
        )
    else:
        cause = first
    stop = _ELASTIC_STOP.search(output)
    if stop and stop.group(1).startswith("blacklisted"):
        cause = f"{cause}; {_BLACKLISTED}"
    elif stop and not stop.group(1).startswith("failure count"):  # every worker failed: named above
        cause = f"{cause}; Horovod's elastic driver stopped the job ({stop.group(1)})"
    return cause
