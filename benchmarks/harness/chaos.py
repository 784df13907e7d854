"""Chaos runs: elastic jobs that lose a worker host at a random point, and what became of each.

Each run is a real ``hvdk8s run`` elastic job (horovodrun over Gloo) of
``chaos_worker.py``, one slot on each of two worker hosts. Where this machine
allows (root, iproute2, openssh), the hosts are network namespaces
(``chaos_netns``): horovodrun runs on a driver host of its own and starts the
workers over ssh, Gloo on the bridge interface. The fault (``chaos_worker``'s
docstring) strikes at a step, in a commit or, on rank 0, in a checkpoint
write: ``kill`` SIGKILLs the worker and then every process of its host (down
``DOWN_S``, then back with a fresh sshd); ``cut`` takes the host's link down
with its worker alive, so its peers see silence until Gloo's timeout and the
driver's ssh session ends on its keep-alives; ``HANG_S`` later the host comes
back as after a reboot. Elsewhere (said loudly) the hosts are this machine's
two names, ``localhost`` and ``127.0.0.1`` (Horovod blacklists a failed
worker's whole host; two names let one go), and ``hang`` (SIGSTOP, the process
SIGKILLed ``HANG_S`` later) stands in for a cut. The discovery script lists a
host again once it answers, so after Horovod's blacklist cooldown a new worker
joins there.

From the workers' events, per run: finished (exit 0 and a final accuracy),
committed steps lost (the survivors' last commit before the fault minus the
step training resumed from), seconds to recover (fault to the restart on the
remaining ranks), re-sharded (that restart ran on fewer ranks), re-added (a
later restart back at full size), and the accuracy against an undisturbed run.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hvdk8s.common import atomic, figures
from hvdk8s.common.errors import UserError

from ..emulation import chaos_netns
from ..machine import envinfo

WORKER = Path(__file__).parents[1] / "workers" / "chaos_worker.py"
LOCAL_HOSTS = ("localhost", "127.0.0.1")
LOCAL_VICTIM = "127.0.0.1"
KINDS = ("kill", "cut")  # on namespace hosts
LOCAL_KINDS = ("kill", "hang")  # the fallback: SIGSTOP stands in for a cut link
POINTS = ("step", "commit", "checkpoint")
# HOROVOD_GLOO_TIMEOUT_SECONDS: how long peers wait on a hung worker; Horovod's default. It also bounds the
# rendezvous after a reset, where a joining worker may still be importing TensorFlow on a busy machine: at
# 5 s the survivors' Gloo aborted the process (gloo::IoException in http_store.cc, a C++ terminate).
GLOO_TIMEOUT_S = 30
HANG_S = GLOO_TIMEOUT_S + 5.0  # a hung worker is SIGKILLed, a cut host restored, this long after the fault
DOWN_S = 5.0  # a killed namespace host comes back (a fresh sshd) this long after
COOLDOWN_S = (1, 2)  # Horovod's blacklist cooldown range: when the lost host may come back
EPOCHS = 10
WAIT_FOR_REJOIN_S = 60.0
RUN_TIMEOUT_S = 300.0
ACCURACY_SLACK = 0.03  # a run that reset trains on other batches than the undisturbed one


@dataclass(frozen=True)
class Fault:
    kind: str  # KINDS
    point: str  # POINTS
    step: int  # the global step at (or after) which it strikes

    @property
    def spec(self) -> str:
        return f"{self.kind}:{self.point}:{self.step}"


def random_faults(count: int, seed: int, kinds: tuple[str, ...] = KINDS) -> list[Fault]:
    """``count`` faults drawn from ``seed``: any of ``kinds``, any point, in the first three of ten epochs."""
    rng = random.Random(seed)
    return [Fault(rng.choice(kinds), rng.choice(POINTS), rng.randint(3, 60)) for _ in range(count)]


@dataclass(frozen=True)
class Outcome:
    fault: str
    finished: bool
    lost_steps: int | None  # None: no fault was seen (it struck after training ended, or never)
    recover_s: float | None
    size_after_fault: int | None
    readded: bool
    accuracy: float | None
    stale_temporaries: int  # checkpoint temporaries still there at the end
    wall_s: float
    reason: str  # why it counts as failed, "" when it survived

    @property
    def survived(self) -> bool:
        return not self.reason

    @property
    def kind(self) -> str:
        return self.fault.split(":")[0]


def run_job(fault: Fault | None, workdir: Path, hosts: chaos_netns.Cluster | None, *, seed: int = 0,
            epochs: int = EPOCHS) -> tuple[int, list[dict[str, Any]], float, str]:
    """Run one elastic job on ``hosts`` (None: this machine's two names) and bring back what the fault took.

    Returns the exit code, the workers' events, the wall time and the job's output.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    events = workdir / "events.jsonl"
    env = {**os.environ, "HVDK8S_METRICS_PORT": "0", "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    if hosts:
        discover, interface, victim = hosts.discovery_script(workdir / "discover.sh"), chaos_netns.IFACE, hosts.workers[-1].ip
        env["PATH"] = f"{hosts.ssh_path}:{env['PATH']}"
    else:
        discover, interface, victim = local_discovery_script(workdir / "discover.sh"), "lo", LOCAL_VICTIM
    argv = [
        str(Path(sys.executable).parent / "hvdk8s"), "run", "-np", "2", "--min-np", "1", "--max-np", "2",
        "--host-discovery-script", str(discover), "--network-interface", interface,
        "--blacklist-cooldown", *map(str, COOLDOWN_S), "--env", f"HOROVOD_GLOO_TIMEOUT_SECONDS={GLOO_TIMEOUT_S}",
        str(WORKER), "--events", str(events), "--checkpoint-dir", str(workdir / "ckpt"), "--epochs", str(epochs),
        "--victim-host", victim, "--link", interface, "--wait-for-rejoin", str(WAIT_FOR_REJOIN_S), "--seed", str(seed),
        *(["--fault", fault.spec] if fault else []),
    ]  # fmt: skip
    start = time.monotonic()
    seen: set[int] = set()  # the pids whose fault was seen
    pending: dict[int, tuple[float, dict[str, Any]]] = {}  # the faults still on: when to end them
    with open(workdir / "output.log", "w+") as log:
        job = subprocess.Popen(hosts.driver_argv(argv) if hosts else argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                               start_new_session=True)
        while job.poll() is None:
            if time.monotonic() - start > RUN_TIMEOUT_S:
                os.killpg(job.pid, signal.SIGKILL)
                break
            for event in read_events(events):
                if event["event"] == "fault" and event["pid"] not in seen:
                    seen.add(event["pid"])
                    pending[event["pid"]] = (time.monotonic() + _lasts(event["kind"]), event)
                    if event["kind"] == "kill" and hosts:
                        hosts.kill_host(hosts.host(event["host"]))  # the rest of the host goes down with it
            for pid, (until, event) in list(pending.items()):
                if time.monotonic() > until:
                    _end_fault(event, hosts)
                    del pending[pid]
            time.sleep(0.2)
        job.wait()
        for _, event in pending.values():  # the job ended first: the next one needs the host back
            _end_fault(event, hosts)
        if hosts and job.returncode:
            for host in hosts.workers:  # leftovers of a failed run
                hosts.restore(host)
        log.seek(0)
        output = log.read()
    return job.returncode, read_events(events), time.monotonic() - start, output


def local_discovery_script(path: Path) -> Path:
    """This machine under two names, one slot each (Horovod blacklists a failed worker's whole host)."""
    listed = path.with_suffix(".hosts")
    listed.write_text("".join(f"{h}:1\n" for h in LOCAL_HOSTS))
    path.write_text(f"#!/bin/sh\ncat {listed}\n")
    path.chmod(0o755)
    return path


def _lasts(kind: str) -> float:
    """How long a fault of ``kind`` lasts: a killed host is down DOWN_S, a cut or hung one HANG_S."""
    return DOWN_S if kind == "kill" else HANG_S


def _end_fault(event: dict[str, Any], hosts: chaos_netns.Cluster | None) -> None:
    """The faulted host comes back; on this machine's names, a hung worker is killed (its host never left)."""
    if hosts:
        hosts.restore(hosts.host(event["host"]))
    elif event["kind"] == "hang":
        _kill(event["pid"])


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def read_events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def outcome(fault: Fault, returncode: int, events: list[dict[str, Any]], wall_s: float, baseline_accuracy: float,
            stale_temporaries: int) -> Outcome:
    """What became of one run, from its events (pure, so it can be checked on made-up ones)."""
    events = sorted(events, key=lambda e: e["t"])
    done = next((e for e in events if e["event"] == "done"), None)
    struck = next((e for e in events if e["event"] == "fault"), None)
    lost = recover = size_after = None
    readded = False
    if struck:
        survivors_commits = [e["step"] for e in events
                             if e["event"] == "commit" and e["t"] < struck["t"] and e["pid"] != struck["pid"]]
        restarts = [e for e in events if e["event"] == "start" and e["t"] > struck["t"]]
        if restarts:
            first = restarts[0]
            lost = max(0, max(survivors_commits, default=0) - first["step"])
            recover = first["t"] - struck["t"]
            size_after = first["size"]
            readded = any(e["size"] == 2 for e in restarts[1:])
    accuracy = done["accuracy"] if done else None
    problems = []
    if returncode != 0 or done is None:
        problems.append(f"did not finish (exit {returncode})")
    if struck and lost is None:
        problems.append("no restart after the fault")
    if lost:
        problems.append(f"lost {lost} committed steps")
    if struck and size_after is not None and size_after >= 2:
        problems.append("restarted at full size: not re-sharded")
    if struck and not readded:
        problems.append("the lost host never rejoined")
    if accuracy is not None and accuracy < baseline_accuracy - ACCURACY_SLACK:
        problems.append(f"accuracy {accuracy:.3f} < undisturbed {baseline_accuracy:.3f} - {ACCURACY_SLACK}")
    if stale_temporaries:
        problems.append(f"{stale_temporaries} stale checkpoint temporaries left")
    return Outcome(fault.spec, done is not None and returncode == 0, lost, recover, size_after, readded, accuracy,
                   stale_temporaries, wall_s, "; ".join(problems))


def run_case(fault: Fault, workdir: Path, baseline_accuracy: float, hosts: chaos_netns.Cluster | None, *,
             epochs: int = EPOCHS) -> Outcome:
    returncode, events, wall_s, _ = run_job(fault, workdir, hosts, epochs=epochs)
    done = [e for e in events if e["event"] == "done"]
    return outcome(fault, returncode, events, wall_s, baseline_accuracy,
                   len(stale_temporaries(workdir / "ckpt", done[0]["hostname"])) if done else 0)


def stale_temporaries(folder: Path, chief_hostname: str) -> list[Path]:
    """Checkpoint temporaries left that the last rank 0 should have removed: those written on its host.

    A temporary written on another host stays until it is an hour old
    (``hvdk8s.train.checkpoint.remove_stale_temporaries``: no host can tell whether
    a writer elsewhere still runs), so on namespace hosts a rank 0 killed in a
    checkpoint write leaves one behind when rank 0 moves to the other host.
    """
    return sorted(folder.glob(f".tmp-{chief_hostname}-*")) if folder.is_dir() else []


def undisturbed_accuracy(workdir: Path, hosts: chaos_netns.Cluster | None) -> float:
    returncode, events, _, output = run_job(None, workdir, hosts)
    done = [e for e in events if e["event"] == "done"]
    if returncode or not done:
        raise UserError(f"the undisturbed chaos run failed (exit {returncode}), before any fault:\n{output[-3000:]}")
    return float(done[0]["accuracy"])


def _span(values: list[float], digits: int) -> str:
    if not values:
        return "-"
    low, high = min(values), max(values)
    return f"{low:.{digits}f}" if low == high else f"{low:.{digits}f}-{high:.{digits}f}"


def by_kind(outcomes: list[Outcome], baseline_accuracy: float) -> str:
    """Per fault kind: survived, committed steps lost, seconds to recover, hosts re-added, accuracy (Markdown)."""
    lines = ["| fault kind | survived | committed steps lost | recover (s) | host re-added | accuracy "
             f"(undisturbed {baseline_accuracy:.3f}) |", "|---|---|---|---|---|---|"]
    for kind in dict.fromkeys(o.kind for o in outcomes):
        runs = [o for o in outcomes if o.kind == kind]
        lines.append(f"| {kind} | {sum(o.survived for o in runs)}/{len(runs)} | {sum(o.lost_steps or 0 for o in runs)} "
                     f"| {_span([o.recover_s for o in runs if o.recover_s is not None], 1)} "
                     f"| {sum(o.readded for o in runs)}/{len(runs)} "
                     f"| {_span([o.accuracy for o in runs if o.accuracy is not None], 3)} |")
    return "\n".join(lines) + "\n"


def table(outcomes: list[Outcome]) -> str:
    """The runs as a Markdown table, with the totals line first."""
    survived = sum(o.survived for o in outcomes)
    lost = sum(o.lost_steps or 0 for o in outcomes)
    lines = [f"{survived}/{len(outcomes)} runs survived; {lost} committed steps lost in all.", "",
             "| fault | finished | lost steps | recover (s) | size after | re-added | accuracy | problems |",
             "|---|---|---|---|---|---|---|---|"]
    for o in outcomes:
        recover = "" if o.recover_s is None else f"{o.recover_s:.1f}"
        accuracy = "" if o.accuracy is None else f"{o.accuracy:.3f}"
        lines.append(f"| {o.fault} | {'yes' if o.finished else 'no'} | {'' if o.lost_steps is None else o.lost_steps} "
                     f"| {recover} | {o.size_after_fault or ''} | {'yes' if o.readded else 'no'} | {accuracy} "
                     f"| {o.reason or '-'} |")
    return "\n".join(lines) + "\n"


def plot(outcomes: list[Outcome], path: Path) -> None:
    plt = figures.pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    for kind, marker in zip(dict.fromkeys(o.kind for o in outcomes), "ox+"):
        for point, color in zip(POINTS, ("tab:blue", "tab:orange", "tab:green")):
            runs = [(int(o.fault.rsplit(":", 1)[1]), o.recover_s) for o in outcomes
                    if o.fault.startswith(f"{kind}:{point}:") and o.recover_s is not None]
            ax.scatter([step for step, _ in runs], [seconds for _, seconds in runs], marker=marker, color=color,
                       label=f"{kind} in {point}" if runs else None)
    ax.set_xlabel("fault at step")
    ax.set_ylabel("seconds to recover")
    ax.set_title(f"{sum(o.survived for o in outcomes)}/{len(outcomes)} chaos runs survived, "
                 f"{sum(o.lost_steps or 0 for o in outcomes)} committed steps lost")
    ax.legend(fontsize="small")
    fig.tight_layout()
    figures.save_figure(fig, path)


def write(outcomes: list[Outcome], baseline_accuracy: float, meta: dict[str, Any], out: Path) -> dict[str, Path]:
    """results.json, chaos.md and chaos.png in ``out``, each written atomically."""
    results = {"meta": meta, "undisturbed_accuracy": baseline_accuracy,
               "runs": [{**asdict(o), "survived": o.survived} for o in outcomes]}
    paths = {"results": atomic.write_json(out / "results.json", results)}
    load = meta["load_average"]
    text = (f"# Chaos: {len(outcomes)} random faults\n\n`{' '.join(meta['command'])}` (seed {meta['seed']}, "
            f"{meta['wall_s']:.0f} s, {meta['date']}, commit {(meta['git'].get('commit') or '?')[:7]}; load average "
            f"{load['start'][0]} at the start, {load['end'][0]} at the end). Hosts: {meta['hosts']}. "
            f"Undisturbed run: accuracy {baseline_accuracy:.3f}."
            f"\n\n{by_kind(outcomes, baseline_accuracy)}\n{table(outcomes)}")
    paths["markdown"] = atomic.write_text(out / "chaos.md", text)
    plot(outcomes, out / "chaos.png")
    paths["plot"] = out / "chaos.png"
    return paths


def main(count: int, seed: int, out: Path, command: list[str]) -> int:
    """``hvdk8s bench --chaos N``: N random faults; exit 1 unless every run survived.

    On namespace hosts (``chaos_netns``) where this machine allows them; else,
    said loudly, on this machine's two names with SIGSTOP standing in for a cut
    link. The output of a run that failed is kept as ``run-K.log`` beside the report.
    """
    start, load_before = time.monotonic(), envinfo.load_average()
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    with tempfile.TemporaryDirectory(prefix="hvdk8s-chaos-") as scratch, ExitStack() as stack:
        if reason := chaos_netns.unavailable():
            where, kinds, hosts = f"FALLBACK to this machine's two names, SIGSTOP for a cut link ({reason})", LOCAL_KINDS, None
            print(f"[chaos] {where}: no network-namespace hosts", flush=True)
        else:
            hosts = stack.enter_context(chaos_netns.cluster(2, Path(scratch) / "hosts"))
            where, kinds = "network namespaces: the driver's and 2 worker hosts, each with its own sshd", KINDS
        print(f"[chaos] seed {seed}, {where}: an undisturbed run, then {count} faults", flush=True)
        baseline = undisturbed_accuracy(Path(scratch) / "undisturbed", hosts)
        outcomes = []
        for i, fault in enumerate(random_faults(count, seed, kinds), start=1):
            print(f"[chaos {i}/{count}] {fault.spec}", flush=True)
            outcomes.append(run_case(fault, Path(scratch) / f"run-{i}", baseline, hosts))
            if not outcomes[-1].survived:
                atomic.write_text(out / f"run-{i}.log", (Path(scratch) / f"run-{i}" / "output.log").read_text())
            print(f"[chaos {i}/{count}] {outcomes[-1].reason or 'survived'}", flush=True)
    meta = {"command": command, "seed": seed, "wall_s": time.monotonic() - start, "hosts": where, "date": date,
            "git": envinfo.git_commit(), "load_average": {"start": load_before, "end": envinfo.load_average()}}
    paths = write(outcomes, baseline, meta, out)
    print(by_kind(outcomes, baseline), end="")
    print(table(outcomes), end="")
    print(f"hvdk8s bench: wrote {paths['markdown']}", flush=True)
    return 0 if all(o.survived for o in outcomes) else 1
