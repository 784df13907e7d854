"""Run every measurement of one benchmark, in one sitting, and write results.json.

Configurations are interleaved (round r runs every strategy before round r+1
starts) so a burst of load from other processes hits all strategies alike.
Raw per-repeat timings are kept; summaries come from ``analysis.derive``.
The results file is rewritten after every job, so a run that fails or is
interrupted still leaves everything measured so far.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hvdk8s.common import atomic

from ..config import knobs, synthetic
from ..config.settings import (
    HOROVOD_STRATEGIES,
    MANY_PROCESSES_ONLY,
    NO_TTA,
    ONE_PROCESS_ONLY,
    STRATEGY_LABELS,
    STRATEGY_MCA,
    THREAD_STRATEGIES,
    Settings,
)
from ..emulation import netns
from ..machine import envinfo, memcopy
from ..machine.launch import JobFailed, Launcher, base_env, interpreter, module_argv, probe_stack
from ..reporting import analysis, costmodel

SCHEMA = "hvdk8s-bench/2"
SMALL_MESSAGE = 64 << 10  # sizes re-measured at a short Horovod cycle time
FAST_CYCLE = "cycle_0.1ms"
LINK_PROBE_BYTES = 64 << 20
LINK_PROBE_PINGS = 200
# What a job takes on an idle 2-core machine, start-up and model build included, for the estimate a run prints first:
# about the average launch of two quiet committed runs on the development VM, on two days which ran the same work at
# different speeds (benchmarks/reports/headline-2026-11-26: 17.8 s; the 23-job --quick run in
# benchmarks/reports/quick/README.md, 2026-11-29: 47.2 s; that day's other quiet committed runs averaged 37-62 s).
JOB_SECONDS = (20, 47)


class Progress:
    """One line per job: ``[bench 3/17 +42s] training hvdk8s N=2 round 1 ... 14.2s``."""

    def __init__(self, total: int, stream: Any = sys.stderr) -> None:
        self.total, self.done, self.start, self.stream = total, 0, time.monotonic(), stream

    def step(self, label: str, fn: Callable[[], Any]) -> Any:
        self.done += 1
        head = f"[bench {self.done}/{self.total} +{time.monotonic() - self.start:.0f}s] {label}"
        print(f"{head} ...", file=self.stream, flush=True)
        t0 = time.monotonic()
        try:
            out = fn()
        except Exception as err:
            print(f"{head}: FAILED ({str(err).splitlines()[0]})", file=self.stream, flush=True)
            raise
        print(f"{head}: {time.monotonic() - t0:.1f}s", file=self.stream, flush=True)
        return out


def training_configs(s: Settings) -> list[tuple[int, str, int]]:
    """(round, strategy, N), interleaved by round; the single process only at N=1, the MANY_PROCESSES_ONLY ones above;
    none without a suite workload (only Horovod's synthetic scripts asked for)."""
    if not s.suite_workloads:
        return []
    return [
        (r, strategy, n)
        for r in range(s.rounds)
        for n in s.ranks
        for strategy in s.strategies
        if not (strategy in ONE_PROCESS_ONLY and n != 1) and not (strategy in MANY_PROCESSES_ONLY and n == 1)
    ]


def synthetic_configs(s: Settings) -> list[tuple[int, int, str, str]]:
    """(round, N, model, script) of Horovod's synthetic benchmarks: every model and N in each round, the raw loop,
    at N > 1 the raw loop at hvdk8s's thread split, and hvdk8s (the loop and hvdk8s each beside Horovod's own script
    with ``synthetic_peer``) back to back, alternating which goes first (``synthetic.order``)."""
    return [(r, n, model, which) for r in range(s.synthetic_rounds) for n in s.ranks for model in s.synthetic_models
            for which in synthetic.order(r, peer=bool(s.synthetic_peer), split=n > 1)]


def knob_synthetic_configs(s: Settings, r: int) -> list[tuple[str, str]]:
    """(model, script) launched for every knob in knob round ``r``: Horovod's synthetic benchmarks at N=2."""
    return [(model, which) for model in s.synthetic_models for which in synthetic.order(r)]


def emulated_hosts(s: Settings) -> int:
    """Launcher/chief host, the most workers any job needs, and one parameter server."""
    return 1 + max([*s.emulated_workers, s.emulated_train_workers]) + 1


def knob_configs(s: Settings) -> list[tuple[int, str]]:
    """(round, knob), the baseline first in every round."""
    if not s.knobs:
        return []
    return [(r, k) for r in range(s.knob_rounds) for k in (knobs.BASELINE, *s.knobs)]


def check_stacks(s: Settings, probe: Callable[[str], dict[str, str]] = probe_stack) -> dict[str, dict[str, str]]:
    """What each requested knob with its own interpreter runs (``launch.probe_stack``), by knob; ``ValueError``
    naming the knob and the command that builds its interpreter where it is missing or cannot run the workers."""
    out = {}
    for name in s.knobs:
        knob = knobs.KNOBS[name]
        if not knob.python:
            continue
        try:
            out[name] = {"interpreter": knob.python, **probe(interpreter(knob.python))}
        except ValueError as err:
            build = f"; build it with `{knob.build}`" if knob.build else ""
            raise ValueError(f"knob {name}: its ranks run {knob.python}, which cannot run the benchmarks ({err}){build}") from None
    return out


def emulated_train_configs(s: Settings) -> list[tuple[int, str]]:
    """(round, strategy) on each emulated link: every strategy once per round, rounds one after another."""
    return [(r, strategy) for r in range(s.rounds) for strategy in s.emulated_train_strategies]


def allreduce_configs(s: Settings) -> list[tuple[str, dict[str, str], list[int], list[int]]]:
    """The allreduce microbenchmark's launches as (label, env, sizes, fusion tensor bytes): default, fusion off and
    a fast cycle, each only where it has something to measure (``--sizes none --fusion-bytes none`` launches none)."""
    fusion = list(s.fusion_tensor_bytes)
    small = [b for b in s.allreduce_sizes if b <= SMALL_MESSAGE]
    configs = [
        ("default", {}, list(s.allreduce_sizes), fusion),
        ("off", {"HOROVOD_FUSION_THRESHOLD": "0"}, [], fusion),
        (FAST_CYCLE, {"HOROVOD_CYCLE_TIME": "0.1"}, small, []),  # is Horovod's cycle the small-message floor?
    ]
    return [c for c in configs if c[2] or c[3]]


def job_count(s: Settings, emulated: bool) -> int:
    knob_jobs = sum((1 if s.suite_workloads else 0) + len(knob_synthetic_configs(s, r)) for r, _ in knob_configs(s))
    profile = int(s.profile)
    count = len(training_configs(s)) + len(synthetic_configs(s)) + len(allreduce_configs(s)) + profile + knob_jobs
    if emulated:
        per_rate = 1 + 2 * len(s.emulated_workers)
        trained_on = [rate for rate in s.emulated_rates if rate in s.emulated_train_rates]
        count += per_rate * len(s.emulated_rates) + len(emulated_train_configs(s)) * len(trained_on)
    return count


def train_job_data(s: Settings, strategy: str, seed: int, *, tta: bool, knob: knobs.Knob | None = None,
                   profile: bool = False) -> dict[str, Any]:
    """What a training launch's ranks read (``worker.main``), locally or in a cluster's pods (``cluster_jobs``):
    time to accuracy where ``tta`` and the settings ask for it and the strategy has it (not ``NO_TTA``); no thread
    count from the suite (``own_threads``) for a thread-policy knob or strategy, whose ranks choose their own."""
    return {"settings": s.to_json(), "workloads": list(s.profiled_workloads if profile else s.suite_workloads),
            "tta": tta and s.tta and strategy not in NO_TTA, "seed": seed,
            "own_threads": bool(knob and knob.thread_policy) or strategy in THREAD_STRATEGIES}


def allreduce_job_data(s: Settings, sizes: list[int], fusion_bytes: list[int]) -> dict[str, Any]:
    """What an allreduce microbenchmark launch's ranks read (``comm_worker allreduce``), locally or in a cluster."""
    return {"threads": s.threads_per_rank, "sizes": sizes, "min_seconds": s.allreduce_min_seconds,
            "repeats": s.allreduce_repeats, "fusion_tensors": s.fusion_tensors, "fusion_tensor_bytes": fusion_bytes}


class Suite:
    def __init__(self, settings: Settings, out_dir: Path, command: list[str]) -> None:
        """Refuses (``ValueError``) a stack knob that cannot run, Horovod's scripts missing from ``synthetic_peer`` or
        not running on Keras 3 as ported, or missing H100 rates, before anything is started or written."""
        stacks = check_stacks(settings)
        self.peer_sources = synthetic.peer_sources(Path(settings.synthetic_peer)) if settings.synthetic_peer else {}
        costmodel.gpus()  # the measured H100 rates the report extrapolates from: missing, nothing is started
        self.s = settings
        self.out = out_dir
        self.jobs = out_dir / "jobs"
        self.jobs.mkdir(parents=True, exist_ok=True)
        self.launcher = Launcher(out_dir / "logs", settings.threads_per_rank, settings.launch_timeout_s)
        self.results: dict[str, Any] = {
            "schema": SCHEMA,
            "settings": settings.to_json(),
            "environment": {**envinfo.collect(command), **({"stacks": stacks} if stacks else {})},
            "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "labels": {"strategies": STRATEGY_LABELS, "knobs": {k: v.what for k, v in knobs.KNOBS.items()}},
            "raw": {"training": [], "synthetic": [], "allreduce": [], "memcopy": None, "emulated": {"skipped": None, "rates": []},
                    "profile": None, "knobs": []},
            "errors": [],
        }
        self.emulated_reason = self._emulated_reason()
        self.progress = Progress(job_count(settings, self.emulated_reason is None))

    def _emulated_reason(self) -> str | None:
        if not self.s.emulated_rates:
            return "no emulated link rates requested"
        return netns.available()

    def save(self) -> Path:
        return atomic.write_json(self.out / "results.json", self.results)

    def _job_file(self, name: str, data: dict[str, Any]) -> Path:
        path = self.jobs / f"{name}.json"
        path.write_text(json.dumps(data))
        return path

    def _attempt(self, label: str, fn: Callable[[], Any]) -> Any:
        """Run one job; a failure is recorded (and makes the run fail) but later jobs still run."""
        try:
            return self.progress.step(label, fn)
        except (JobFailed, OSError, RuntimeError, ValueError) as err:
            self.results["errors"].append({"job": label, "error": str(err)})
            return None
        finally:
            self.save()

    # --- training throughput and time to accuracy --------------------------------------------
    def _train_job(
        self, name: str, settings: Settings, strategy: str, n: int, *, tta: bool, seed: int, cluster: Any = None,
        knob: knobs.Knob | None = None, profile: bool = False,
    ) -> dict[str, Any]:
        # the profile may also break down Horovod's synthetic models' steps (in the suite's harnesses, at equal threads)
        data = train_job_data(settings, strategy, seed, tta=tta, knob=knob, profile=profile)
        own_threads = data["own_threads"]
        job = self._job_file(name, data)
        out = self.jobs / f"{name}.result.json"
        args = ["--strategy", strategy, "--job", str(job), "--out", str(out), *(["--profile"] if profile else [])]
        if strategy in HOROVOD_STRATEGIES:
            knob = knob or knobs.KNOBS[knobs.BASELINE]
            mca = knob.mca | STRATEGY_MCA.get(strategy, {})
            argv = module_argv("workers.worker", *args, python=interpreter(knob.python))
            stats = self.launcher.mpi(name, n, argv, env=knob.env, mca=mca, cluster=cluster, own_threads=own_threads)
        elif strategy == "tf_mwms":
            stats = self.launcher.tf_cluster(name, {"worker": n}, module_argv("workers.worker", *args), [], mains="worker", cluster=cluster)
        elif strategy == "tf_ps":
            stats = self.launcher.tf_cluster(
                name, {"chief": 1, "worker": n, "ps": 1}, module_argv("workers.worker", *args), module_argv("workers.worker", *args, "--server"),
                mains="chief", cluster=cluster,
            )
        else:
            stats = self.launcher.single(name, module_argv("workers.worker", *args))
        return {"strategy": strategy, "workers": n, "job": stats.to_json(), "result": json.loads(out.read_text())}

    def training(self) -> None:
        for r, strategy, n in training_configs(self.s):
            name = f"train-{strategy}-n{n}-r{r}"
            run = self._attempt(
                f"training {strategy} N={n} round {r + 1}/{self.s.rounds}",
                lambda: self._train_job(name, self.s, strategy, n, tta=True, seed=r),
            )
            if run:
                self.results["raw"]["training"].append({**run, "round": r})

    def _synthetic_job(self, name: str, model: str, which: str, n: int, knob: knobs.Knob, peers: Path | None = None) -> dict[str, Any]:
        """One launch of one synthetic script (the suite's, or Horovod's own from ``peers``), as a user runs it
        (no thread count from the suite but ``raw_split``'s, hvdk8s's split for ``n`` ranks on this host)."""
        s, python = self.s, interpreter(knob.python)
        args = synthetic.script_args(which, model, s.synthetic_batches_per_iter, s.synthetic_iters, os.cpu_count() or 1, n)
        if which in synthetic.MODULES:
            argv = module_argv(f"workers.{synthetic.MODULES[which]}", *args, python=python)
        else:
            assert peers is not None, which
            argv = [python, "-u", str(peers / synthetic.PEER_FILES[which]), *args]
        stats = self.launcher.mpi(name, n, argv, env=knob.env, mca=knob.mca, own_threads=True)
        rates = synthetic.iter_rates((self.out / stats.log).read_text(errors="replace"), which, s.synthetic_iters)
        return {"model": model, "script": which, "workers": n, "batch_per_rank": synthetic.batch(model),
                "batches_per_iter": s.synthetic_batches_per_iter, "iter_img_per_s_per_rank": rates, "job": stats.to_json()}

    def synthetic(self) -> None:
        """Horovod's synthetic benchmarks: the raw loop (at N > 1 also at hvdk8s's thread split) and hvdk8s's fit,
        alternating, every round; with ``synthetic_peer``, Horovod's own scripts beside them, from a temporary
        folder that lasts the section."""
        base = knobs.KNOBS[knobs.BASELINE]
        with tempfile.TemporaryDirectory(prefix="hvdk8s-horovod-scripts-") as tmp:
            peers = Path(tmp)
            for which, text in self.peer_sources.items():
                (peers / synthetic.PEER_FILES[which]).write_text(text)
            for r, n, model, which in synthetic_configs(self.s):
                run = self._attempt(
                    f"horovod-synthetic {model} {which} N={n} round {r + 1}/{self.s.synthetic_rounds}",
                    lambda: self._synthetic_job(f"synthetic-{model}-{which}-n{n}-r{r}", model, which, n, base, peers),
                )
                if run:
                    self.results["raw"]["synthetic"].append({**run, "section": "synthetic", "round": r, "knob": knobs.BASELINE})

    def profile(self) -> None:
        """Per-phase breakdown of hvdk8s's and the raw loop's step at N=2, and a Horovod timeline of hvdk8s's."""
        if not self.s.profile:
            return
        run = self._attempt("profile hvdk8s and raw loop N=2", lambda: self._train_job(
            "profile", self.s, "hvdk8s", 2, tta=False, seed=0, profile=True, knob=knobs.Knob({"HOROVOD_TIMELINE": "DYNAMIC"})))
        if run:
            self.results["raw"]["profile"] = run

    def knob_study(self) -> None:
        """Each knob against the baseline, interleaved by round, on the paired hvdk8s/raw-loop worker at N=2
        (a stack knob's ranks run its own interpreter: ``python`` "" is the suite's)."""
        short = dataclasses.replace(self.s, tta=False)
        for r, name in knob_configs(self.s):
            knob = knobs.KNOBS[name]
            if self.s.suite_workloads:
                run = self._attempt(
                    f"knob {name} N=2 round {r + 1}/{self.s.knob_rounds}",
                    lambda: self._train_job(f"knob-{name}-r{r}", short, "hvdk8s", 2, tta=False, seed=r, knob=knob),
                )
                if run:
                    self.results["raw"]["knobs"].append({**run, "knob": name, "round": r, "python": knob.python})
            for model, which in knob_synthetic_configs(self.s, r):
                run = self._attempt(
                    f"knob {name} horovod-synthetic {model} {which} N=2 round {r + 1}/{self.s.knob_rounds}",
                    lambda: self._synthetic_job(f"knob-{name}-synthetic-{model}-{which}-r{r}", model, which, 2, knob),
                )
                if run:
                    self.results["raw"]["synthetic"].append({**run, "section": "knobs", "round": r, "knob": name})

    # --- allreduce microbenchmark ------------------------------------------------------------
    def _allreduce_job(self, name: str, n: int, sizes: list[int], fusion_bytes: list[int], env: dict[str, str], cluster: Any = None) -> dict[str, Any]:
        job = self._job_file(name, allreduce_job_data(self.s, sizes, fusion_bytes))
        out = self.jobs / f"{name}.result.json"
        stats = self.launcher.mpi(name, n, module_argv("workers.comm_worker", "allreduce", "--job", str(job), "--out", str(out)), env=env, cluster=cluster)
        return {"job": stats.to_json(), "result": json.loads(out.read_text())}

    def allreduce(self) -> None:
        self.results["raw"]["memcopy"] = memcopy.copy_rate(self.s.memcopy_bytes, self.s.allreduce_repeats)
        n = self.s.allreduce_ranks
        for label, env, sizes, tensors in allreduce_configs(self.s):
            run = self._attempt(
                f"allreduce N={n} {label}",
                lambda: self._allreduce_job(f"allreduce-{label}", n, sizes, tensors, env),
            )
            if run:
                self.results["raw"]["allreduce"].append({**run, "fusion": label})

    # --- emulated bandwidth-limited cluster ---------------------------------------------------
    def _link_probe(self, name: str, cluster: netns.Cluster) -> dict[str, Any]:
        a, b = cluster.hosts[1], cluster.hosts[2]
        out = self.jobs / f"{name}.result.json"
        self.launcher.group(
            name,
            [(b.exec_argv(module_argv("emulation.linkprobe", "probe", a.ip, "5201", str(LINK_PROBE_BYTES), str(LINK_PROBE_PINGS), str(out))), base_env(1))],
            [(a.exec_argv(module_argv("emulation.linkprobe", "serve", "5201")), base_env(1))],
        )
        return json.loads(out.read_text())

    def _ps_comm_job(self, name: str, n: int, cluster: netns.Cluster) -> dict[str, Any]:
        job = self._job_file(name, {"threads": self.s.threads_per_rank, "sizes": list(self.s.emulated_sizes),
                                    "repeats": self.s.allreduce_repeats, "steps": self.s.emulated_comm_steps})
        out = self.jobs / f"{name}.result.json"
        argv = module_argv("workers.comm_worker", "ps", "--job", str(job), "--out", str(out))
        stats = self.launcher.tf_cluster(name, {"chief": 1, "worker": n, "ps": 1}, argv, [*argv, "--server"], mains="chief", cluster=cluster)
        return {"job": stats.to_json(), "result": json.loads(out.read_text())}

    def emulated(self) -> None:
        emu = self.results["raw"]["emulated"]
        if self.emulated_reason:
            emu["skipped"] = self.emulated_reason
            return
        for rate in self.s.emulated_rates:
            entry: dict[str, Any] = {"rate": rate, "rate_bits_per_s": netns.parse_rate(rate), "ring": [], "ps": [], "training": []}
            try:
                with netns.cluster(emulated_hosts(self.s), rate) as cluster:
                    entry["link"] = self._attempt(f"emulated {rate}: TCP link probe", lambda: self._link_probe(f"link-{rate}", cluster))
                    for n in self.s.emulated_workers:
                        run = self._attempt(
                            f"emulated {rate}: ring allreduce N={n}",
                            lambda: self._allreduce_job(f"ring-{rate}-n{n}", n, list(self.s.emulated_sizes), [], {}, cluster),
                        )
                        if run:
                            entry["ring"].append(run)
                        run = self._attempt(
                            f"emulated {rate}: parameter server N={n} P=1",
                            lambda: self._ps_comm_job(f"ps-{rate}-n{n}", n, cluster),
                        )
                        if run:
                            entry["ps"].append(run)
                    if rate in self.s.emulated_train_rates:
                        n = self.s.emulated_train_workers
                        short = dataclasses.replace(self.s, steps=self.s.emulated_train_steps)
                        for r, strategy in emulated_train_configs(self.s):
                            run = self._attempt(
                                f"emulated {rate}: training {strategy} N={n} round {r + 1}/{self.s.rounds}",
                                lambda: self._train_job(f"etrain-{strategy}-{rate}-r{r}", short, strategy, n, tta=False, seed=r,
                                                        cluster=cluster),
                            )
                            if run:
                                entry["training"].append({**run, "round": r})
            except RuntimeError as err:  # the namespaces could not be built
                self.results["errors"].append({"job": f"emulated {rate}", "error": str(err)})
            if entry.get("link"):
                emu["rates"].append(entry)
            self.save()

    def run(self) -> dict[str, Any]:
        self.save()
        self.training()
        self.synthetic()
        self.profile()
        self.knob_study()
        self.allreduce()
        self.emulated()
        self.results["finished"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        self.results["environment"]["load_average_end"] = envinfo.load_average()
        self.results["derived"] = analysis.derive(self.results["raw"])
        self.save()
        return self.results
