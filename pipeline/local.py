"""The DAG on this machine: every step as the same ``hvdk8s`` command the Workflow runs.

Candidates train with ``hvdk8s run -np RANKS`` (as many jobs at once as the
cores allow), select, ingest and the load test run their ``dag.*_argv``
commands, deploy starts ``hvdk8s serve`` on a free local port. Steps run in
the DAG's order and by its rules: a step whose ``needs`` failed is skipped,
select runs once every candidate has finished, failed or not. The server and
any job still running are stopped at the end whatever happened (the local
exit handler), on Ctrl-C before waiting for any step to end. Each step's output goes to ``<out>/logs/<step>.log``.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from hvdk8s.pipeline import dag as d

SUCCEEDED, FAILED, SKIPPED = "succeeded", "failed", "skipped"
HVDK8S = [sys.executable, "-m", "hvdk8s.cli"]
SERVER_START_SECONDS = 120.0
INTERPRETERS = ("python", "python3")
LOADTEST_JSON = "loadtest.json"


@dataclass
class StepResult:
    name: str
    status: str
    seconds: float = 0.0
    log: Path | None = None


@dataclass
class RunResult:
    layout: d.Layout
    steps: dict[str, StepResult] = field(default_factory=dict)
    url: str | None = None

    @property
    def loadtest_json(self) -> Path:
        return Path(self.layout.run_dir) / LOADTEST_JSON


def local_layout(dag: d.Dag, out_dir: Path, base_dir: Path) -> d.Layout:
    """The run's files under ``out_dir`` (serving versions kept across runs); data paths from ``base_dir``."""
    p = dag.pipeline
    return d.Layout(run_dir=str(out_dir / "run"), models=str(out_dir / "models" / p.serving.model_name),
                    data_root=str(base_dir))


def run(dag: d.Dag, out_dir: str | os.PathLike[str], *, base_dir: str | os.PathLike[str] = ".",
        cores: int | None = None, out: TextIO | None = None) -> RunResult:
    """Run every step; the result says how each ended (``succeeded`` tells whether the pipeline did)."""
    out = out or sys.stdout
    out_root = Path(out_dir)
    layout = local_layout(dag, out_root, Path(base_dir))
    shutil.rmtree(layout.run_dir, ignore_errors=True)  # this run's candidates only; versions stay
    logs = out_root / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    ranks = dag.pipeline.local.ranks
    at_once = max(1, (cores or os.cpu_count() or 1) // ranks)
    result = RunResult(layout)
    executor = _Executor(dag, layout, logs, result, out)
    print(f"pipeline {dag.pipeline.name}: {len(dag.steps)} steps, candidates on {ranks} ranks each, "
          f"{at_once} at a time; logs in {logs}", file=out, flush=True)
    pool = ThreadPoolExecutor(max_workers=at_once)
    try:
        for wave in dag.waves():
            for step_result in pool.map(executor.run_step, wave):
                result.steps[step_result.name] = step_result
    finally:
        # On Ctrl-C (or SIGTERM, see cli) the workers are blocked waiting for their jobs, which are in
        # their own sessions and got no signal: drop the queued steps and stop the jobs BEFORE joining
        # the workers, or the join waits for every running job to end on its own.
        pool.shutdown(wait=False, cancel_futures=True)
        executor.stop()
        pool.shutdown()
    return result


def succeeded(dag: d.Dag, result: RunResult) -> bool:
    """As Argo judges a DAG: every step nothing depends on has succeeded."""
    upstream = {name for step in dag.steps for name in step.upstream}
    return all(result.steps[s.name].status == SUCCEEDED for s in dag.steps if s.name not in upstream)


class _Executor:
    def __init__(self, dag: d.Dag, layout: d.Layout, logs: Path, result: RunResult, out: TextIO):
        self.dag, self.layout, self.logs, self.result, self.out = dag, layout, logs, result, out
        self.server: subprocess.Popen | None = None
        self.server_log: TextIO | None = None
        self.relay: threading.Thread | None = None
        self.running: set[subprocess.Popen] = set()
        self.stopped = False  # set by stop(); no process starts after it
        self.lock = threading.Lock()  # stop() against a worker starting a process

    def run_step(self, step: d.Step) -> StepResult:
        blocked = [n for n in step.needs if self.result.steps[n].status != SUCCEEDED]
        if blocked:
            self._say(f"[skip] {step.name}: {', '.join(blocked)} did not succeed")
            return StepResult(step.name, SKIPPED)
        log = self.logs / f"{step.name}.log"
        self._say(f"[run ] {step.name}")
        start = time.monotonic()
        ok = self._deploy(log) if step.kind == d.DEPLOY else self._command(self._argv(step), log) == 0
        seconds = time.monotonic() - start
        status = SUCCEEDED if ok else FAILED
        self._say(f"[{'ok' if ok else 'FAIL':<4}] {step.name} ({seconds:.0f} s)" + ("" if ok else f": see {log}"))
        return StepResult(step.name, status, seconds, log)

    def _argv(self, step: d.Step) -> list[str]:
        p = self.dag.pipeline
        if step.kind == d.TRAIN:
            assert step.candidate is not None
            command = d.train_command(step.candidate, self.layout)
            if command[0] in INTERPRETERS:  # this environment's interpreter, as `hvdk8s run x.py` uses
                command = command[1:]
            return ["hvdk8s", "run", "-np", str(p.local.ranks), *command]
        if step.kind == d.INGEST:
            return d.ingest_argv(p, self.layout)
        if step.kind == d.SELECT:
            return d.select_argv(p, self.layout)
        if step.kind == d.LOADTEST:
            run_dir = Path(self.layout.run_dir)
            return d.loadtest_argv(p, self.result.url or "", json_out=str(run_dir / LOADTEST_JSON),
                                   plot_out=str(run_dir / "latency.png"))
        raise ValueError(f"step {step.name}: unknown kind {step.kind!r}")

    def _command(self, argv: list[str], log: Path) -> int:
        """Run an ``hvdk8s ...`` command line with this environment's hvdk8s; output to ``log``."""
        full = [*HVDK8S, *argv[1:]] if argv[0] == "hvdk8s" else argv
        env = {**os.environ, "HVDK8S_METRICS_PORT": "0", "PYTHONUNBUFFERED": "1"}  # jobs side by side: no port clash
        with log.open("w") as f:
            f.write("$ " + " ".join(argv) + "\n")
            f.flush()
            proc = self._start(full, stdout=f, stderr=subprocess.STDOUT, env=env)
            if proc is None:
                return -signal.SIGTERM
            try:
                return proc.wait()
            finally:
                with self.lock:
                    self.running.discard(proc)

    def _start(self, argv: list[str], **popen: Any) -> subprocess.Popen | None:
        """``argv`` in its own process group (stopping it stops mpirun and every rank too), added to
        ``running`` (the server stays there); None once ``stop()`` has begun, so nothing starts that it
        would miss."""
        with self.lock:
            if self.stopped:
                return None
            proc = subprocess.Popen(argv, start_new_session=True, **popen)
            self.running.add(proc)
            return proc

    def _deploy(self, log: Path) -> bool:
        """``hvdk8s serve`` on a free port; ready once it prints its URL."""
        p = self.dag.pipeline
        argv = [*HVDK8S, "serve", self.layout.models, "--name", p.serving.model_name, "--port", "0"]
        f = self.server_log = log.open("w")
        f.write("$ hvdk8s " + " ".join(argv[len(HVDK8S):]) + "\n")
        f.flush()
        self.server = self._start(argv, stdout=subprocess.PIPE, stderr=f, text=True)
        if self.server is None:
            f.close()
            return False
        stdout = self.server.stdout
        assert stdout is not None
        ready = threading.Event()

        def relay() -> None:  # keeps reading, so a full pipe never blocks the server
            for line in stdout:
                f.write(line)
                f.flush()
                if not ready.is_set() and "http://" in line:
                    # The ready line ends with URL/v1/models/NAME; the base path before it may contain anything.
                    self.result.url = line[line.rindex("http://"):].split("/v1/models/")[0]
                    ready.set()

        self.relay = threading.Thread(target=relay, daemon=True)
        self.relay.start()
        deadline = time.monotonic() + SERVER_START_SECONDS
        while not ready.wait(0.2):
            if self.server.poll() is not None or time.monotonic() > deadline:
                return False
        assert self.result.url is not None  # relay sets it before ready
        return self._warm_up(self.result.url, f)

    def _warm_up(self, url: str, log: TextIO) -> bool:
        """Deployed = answers a prediction. The first one builds the model's graph (about a second),
        which would otherwise be timed by the load test as the tail of its latency distribution."""
        from hvdk8s.serving.clients import rest_client as client
        from hvdk8s.serving.clients.loadtest import digits_png

        try:
            client.predict(url, digits_png(1), model=self.dag.pipeline.serving.model_name)
        except client.PredictError as err:
            log.write(f"warm-up prediction failed: {err}\n")
            return False
        return True

    def stop(self) -> None:
        """Stop the server and any job still running (the local exit handler); start nothing after."""
        with self.lock:
            self.stopped = True
            procs = list(self.running)
        for proc in procs:
            if proc.poll() is None:
                _signal_group(proc, signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    _signal_group(proc, signal.SIGKILL)
                    proc.wait()
        if self.relay:
            self.relay.join(timeout=5)
        if self.server_log:
            self.server_log.close()

    def _say(self, line: str) -> None:
        print(line, file=self.out, flush=True)


def _signal_group(proc: subprocess.Popen, sig: signal.Signals) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
