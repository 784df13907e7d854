"""``hvdk8s pipeline run`` interrupted: Ctrl-C and SIGTERM stop the running jobs, for real, instead of waiting for them.

Each test runs a pipeline whose one candidate is a real ``hvdk8s run -np 1`` job (mpirun and a rank) that records
its pid and session, then sleeps for ten minutes. A run that waits for it, as one did before the job was stopped
first, fails the test after ``HANG`` seconds (the job is then killed) rather than hanging the suite.
"""
from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from hvdk8s.pipeline import build, load_pipeline, local

from conftest import REPO, job_env

HANG = 30.0  # the job sleeps 600 s; stopping it takes well under a second
SLEEPER = (
    "import os, sys, time\n"
    "path = sys.argv[1]\n"
    "with open(path + '.tmp', 'w') as f:\n"
    "    f.write(f'{os.getpid()} {os.getsid(0)}')\n"
    "os.rename(path + '.tmp', path)\n"
    "time.sleep(600)\n"
)


def sleeping_pipeline(tmp_path: Path) -> tuple[Path, Path]:
    """A pipeline file whose candidate sleeps; and the file where it writes '<pid> <session id>'."""
    ids, script = tmp_path / "job.ids", tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    data = {
        "name": "sleepy", "image": "img:1", "sharedVolume": {"claimName": "shared"},
        "candidates": [{"name": "sleeper", "job": {"command": ["python", str(script), str(ids)]}}],
        "serving": {"modelName": "digits"}, "local": {"ranks": 1},
    }
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(data))
    return tmp_path / "p.yaml", ids


def job_ids(ids: Path, gone: threading.Event) -> tuple[int, int] | None:
    """(rank pid, job session id) once the rank has started; None if ``gone`` is set first."""
    while not ids.exists():
        if gone.wait(0.1):
            return None
    pid, sid = map(int, ids.read_text().split())
    return pid, sid


def live_in_session(sid: int) -> list[int]:
    """Processes of session ``sid`` that are not zombies (a container's pid 1 may never reap orphans)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # state ppid pgrp session ...
        except OSError:
            continue  # ended meanwhile
        if fields[0] != "Z" and int(fields[3]) == sid:
            pids.append(int(stat.parent.name))
    return pids


def assert_job_gone(pid: int, sid: int) -> None:
    """The rank, mpirun and the launcher are gone (given a moment for a signalled rank to exit)."""
    deadline = time.monotonic() + 10
    while live_in_session(sid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert live_in_session(sid) == [], f"the job (session {sid}, rank pid {pid}) is still running"


def kill_session(sid: int) -> None:
    for pid in live_in_session(sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_ctrl_c_stops_the_running_job_instead_of_waiting_for_it(tmp_path: Path) -> None:
    file, ids = sleeping_pipeline(tmp_path)
    dag = build(load_pipeline(file))
    returned, hung, job = threading.Event(), threading.Event(), []

    def press_ctrl_c() -> None:
        started = job_ids(ids, returned)
        if started is None:
            return  # run ended without the job: the test fails on that
        job.extend(started)
        os.kill(os.getpid(), signal.SIGINT)  # what the terminal sends, to this process only (jobs: own sessions)
        if not returned.wait(HANG):
            hung.set()
            kill_session(job[1])  # so that run returns and the test fails instead of hanging

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own, whatever pytest's parent did
    presser = threading.Thread(target=press_ctrl_c, daemon=True)
    presser.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            local.run(dag, tmp_path / "out", base_dir=tmp_path, cores=2, out=io.StringIO())
    finally:
        returned.set()
        presser.join()
        signal.signal(signal.SIGINT, previous)
    assert not hung.is_set(), f"run waited for the job instead of stopping it ({HANG:.0f} s)"
    assert_job_gone(*job)


def test_sigterm_stops_the_running_job_and_exits_143(tmp_path: Path) -> None:
    file, ids = sleeping_pipeline(tmp_path)
    pipeline = subprocess.Popen(
        [sys.executable, "-m", "hvdk8s.cli", "pipeline", "run", str(file), "--out", str(tmp_path / "out")],
        cwd=REPO, env=job_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ended, sid = threading.Event(), None
    threading.Thread(target=lambda: (pipeline.wait(), ended.set()), daemon=True).start()
    try:
        started = job_ids(ids, ended)
        assert started is not None, f"the candidate job never started:\n{pipeline.communicate()[0]}"
        pid, sid = started
        pipeline.send_signal(signal.SIGTERM)  # `timeout`, a CI runner cancelling, kubectl delete
        output, _ = pipeline.communicate(timeout=HANG)
        assert pipeline.returncode == 128 + signal.SIGTERM, output
        assert_job_gone(pid, sid)
    finally:
        pipeline.kill()
        pipeline.communicate()
        if sid is not None:
            kill_session(sid)
