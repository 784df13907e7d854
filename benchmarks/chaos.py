"""Chaos runs: elastic jobs that lose a worker at a random point, and what became of each.

Each run is a real ``hvdk8s run`` elastic job (horovodrun over Gloo) of
``chaos_worker.py`` on two hosts, one slot each: this machine under two names,
``localhost`` and ``127.0.0.1`` (Horovod blacklists a failed worker's whole
host; two names let one go). The fault (``chaos_worker``'s docstring) is a
SIGKILL or a SIGSTOP (a hang: no reset reaches the peers, Gloo's timeout ends
their wait; the harness SIGKILLs the stopped process ``HANG_S`` later) at a
step, in a commit or, on rank 0, in a checkpoint write. The discovery script
keeps offering the host, so once Horovod's blacklist cooldown has passed it
comes back and a new worker joins.

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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hvdk8s import atomic
from hvdk8s.errors import UserError

WORKER = Path(__file__).with_name("chaos_worker.py")
HOSTS = ("localhost", "127.0.0.1")
VICTIM_HOST = "127.0.0.1"
KINDS = ("kill", "hang")
POINTS = ("step", "commit", "checkpoint")
# HOROVOD_GLOO_TIMEOUT_SECONDS: how long peers wait on a hung worker; Horovod's default. It also bounds the
# rendezvous after a reset, where a joining worker may still be importing TensorFlow on a busy machine: at
# 5 s the survivors' Gloo aborted the process (gloo::IoException in http_store.cc, a C++ terminate).
GLOO_TIMEOUT_S = 30
HANG_S = GLOO_TIMEOUT_S + 5.0  # a hung worker's process is SIGKILLed this long after it stopped
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


def random_faults(count: int, seed: int) -> list[Fault]:
    """``count`` faults drawn from ``seed``: any kind, any point, in the first three of ten epochs."""
    rng = random.Random(seed)
    return [Fault(rng.choice(KINDS), rng.choice(POINTS), rng.randint(3, 60)) for _ in range(count)]


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


def run_job(fault: Fault | None, workdir: Path, *, seed: int = 0) -> tuple[int, list[dict[str, Any]], float, str]:
    """Run one elastic job (hanging the faulted worker for ``HANG_S`` first); return exit code, events, wall, output."""
    workdir.mkdir(parents=True, exist_ok=True)
    hosts = workdir / "hosts.txt"
    hosts.write_text("".join(f"{h}:1\n" for h in HOSTS))
    discover = workdir / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat {hosts}\n")
    discover.chmod(0o755)
    events = workdir / "events.jsonl"
    argv = [
        str(Path(sys.executable).parent / "hvdk8s"), "run", "-np", "2", "--min-np", "1", "--max-np", "2",
        "--host-discovery-script", str(discover), "--network-interface", "lo",
        "--blacklist-cooldown", *map(str, COOLDOWN_S), "--env", f"HOROVOD_GLOO_TIMEOUT_SECONDS={GLOO_TIMEOUT_S}",
        str(WORKER), "--events", str(events), "--checkpoint-dir", str(workdir / "ckpt"), "--epochs", str(EPOCHS),
        "--victim-host", VICTIM_HOST, "--wait-for-rejoin", str(WAIT_FOR_REJOIN_S), "--seed", str(seed),
        *(["--fault", fault.spec] if fault else []),
    ]  # fmt: skip
    env = {**os.environ, "HVDK8S_METRICS_PORT": "0", "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    start = time.monotonic()
    with open(workdir / "output.log", "w+") as log:
        job = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        hung: dict[int, float] = {}
        while job.poll() is None:
            if time.monotonic() - start > RUN_TIMEOUT_S:
                os.killpg(job.pid, signal.SIGKILL)
                break
            for event in read_events(events):
                if event["event"] == "fault" and event["kind"] == "hang":
                    hung.setdefault(event["pid"], time.monotonic())
            for pid, since in list(hung.items()):
                if time.monotonic() - since > HANG_S:
                    _kill(pid)
                    del hung[pid]
            time.sleep(0.2)
        job.wait()
        log.seek(0)
        output = log.read()
    return job.returncode, read_events(events), time.monotonic() - start, output


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


def run_case(fault: Fault, workdir: Path, baseline_accuracy: float) -> Outcome:
    returncode, events, wall_s, _ = run_job(fault, workdir)
    stale = [p for p in (workdir / "ckpt").glob(".tmp-*")] if (workdir / "ckpt").is_dir() else []
    return outcome(fault, returncode, events, wall_s, baseline_accuracy, len(stale))


def undisturbed_accuracy(workdir: Path) -> float:
    returncode, events, _, output = run_job(None, workdir)
    done = [e for e in events if e["event"] == "done"]
    if returncode or not done:
        raise UserError(f"the undisturbed chaos run failed (exit {returncode}), before any fault:\n{output[-3000:]}")
    return float(done[0]["accuracy"])


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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    for kind, marker in zip(KINDS, "ox"):
        for point, color in zip(POINTS, ("tab:blue", "tab:orange", "tab:green")):
            runs = [o for o in outcomes if o.fault.startswith(f"{kind}:{point}:") and o.recover_s is not None]
            ax.scatter([int(o.fault.rsplit(":", 1)[1]) for o in runs], [o.recover_s for o in runs], marker=marker,
                       color=color, label=f"{kind} in {point}" if runs else None)
    ax.set_xlabel("fault at step")
    ax.set_ylabel("seconds to recover")
    ax.set_title(f"{sum(o.survived for o in outcomes)}/{len(outcomes)} chaos runs survived, "
                 f"{sum(o.lost_steps or 0 for o in outcomes)} committed steps lost")
    ax.legend(fontsize="small")
    fig.tight_layout()
    with atomic.atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)


def write(outcomes: list[Outcome], baseline_accuracy: float, meta: dict[str, Any], out: Path) -> dict[str, Path]:
    """results.json, chaos.md and chaos.png in ``out``, each written atomically."""
    results = {"meta": meta, "undisturbed_accuracy": baseline_accuracy,
               "runs": [{**asdict(o), "survived": o.survived} for o in outcomes]}
    paths = {"results": atomic.write_json(out / "results.json", results)}
    text = (f"# Chaos: {len(outcomes)} random faults\n\n`{' '.join(meta['command'])}` (seed {meta['seed']}, "
            f"{meta['wall_s']:.0f} s). Undisturbed run: accuracy {baseline_accuracy:.3f}.\n\n{table(outcomes)}")
    paths["markdown"] = atomic.write_text(out / "chaos.md", text)
    plot(outcomes, out / "chaos.png")
    paths["plot"] = out / "chaos.png"
    return paths


def main(count: int, seed: int, out: Path, command: list[str]) -> int:
    """``hvdk8s bench --chaos N``: N random faults; exit 1 unless every run survived.

    The output of a run that failed is kept as ``run-K.log`` beside the report.
    """
    start = time.monotonic()
    print(f"[chaos] seed {seed}: an undisturbed run, then {count} faults", flush=True)
    with tempfile.TemporaryDirectory(prefix="hvdk8s-chaos-") as scratch:
        baseline = undisturbed_accuracy(Path(scratch) / "undisturbed")
        outcomes = []
        for i, fault in enumerate(random_faults(count, seed), start=1):
            print(f"[chaos {i}/{count}] {fault.spec}", flush=True)
            outcomes.append(run_case(fault, Path(scratch) / f"run-{i}", baseline))
            if not outcomes[-1].survived:
                atomic.write_text(out / f"run-{i}.log", (Path(scratch) / f"run-{i}" / "output.log").read_text())
            print(f"[chaos {i}/{count}] {outcomes[-1].reason or 'survived'}", flush=True)
    meta = {"command": command, "seed": seed, "wall_s": time.monotonic() - start}
    paths = write(outcomes, baseline, meta, out)
    print(table(outcomes), end="")
    print(f"hvdk8s bench: wrote {paths['markdown']}", flush=True)
    return 0 if all(o.survived for o in outcomes) else 1
