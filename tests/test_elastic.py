"""Elastic training for real: a host loses a slot mid-run and the job carries on with fewer ranks."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
from horovod.runner.elastic.discovery import HostState

from hvdk8s import elastic
from hvdk8s.launcher import mpirun
from hvdk8s.mpijob.render import BLACKLIST_COOLDOWN as MPIJOB_COOLDOWN
from hvdk8s.train.checkpoint import list_checkpoints

from collective_errors import GLOO_RESET, MISMATCHED_SHAPES, MPI_FAILED, PROCESS_SET_REMOVED, raised, recorded
from conftest import HVDK8S, REPO, SCRIPTS, discovery_script, hvdk8s_cli, job_env, output_of


@pytest.mark.e2e
def test_job_survives_losing_a_rank_and_resumes_from_the_last_commit(tmp_path: Path) -> None:
    """With checkpoints and the default warm-up, as mpijob/examples/elastic.yaml runs it."""
    hosts, discover = discovery_script(tmp_path, "localhost:2\n")
    checkpoints = tmp_path / "ckpt"
    argv = [
        HVDK8S, "run", "-np", "2", "--min-np", "1", "--max-np", "2",
        "--host-discovery-script", str(discover), "--network-interface", "lo",
        "examples/train_digits.py", "--elastic", "--epochs", "12", "--checkpoint-dir", str(checkpoints),
    ]  # fmt: skip
    lines: list[str] = []
    with subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=job_env(),
                          start_new_session=True) as job:
        for line in output_of(job):
            lines.append(line)
            if re.match(r"^\[0\] Epoch 2/12: 100%", line):
                hosts.write_text("localhost:1\n")  # the discovery script now offers one slot
    out = "".join(lines)
    assert job.returncode == 0, out[-3000:]
    assert "[0] elastic: training on 2 ranks from epoch 0" in out
    resumed = re.search(r"^\[0\] elastic: training on 1 ranks from epoch (\d+)", out, re.M)
    assert resumed, out[-3000:]
    done = int(resumed.group(1))
    assert 2 <= done < 9, out[-3000:]
    # Keras's epoch stays global across the reset: one rank now processes the whole epoch, twice the
    # steps of a 2-rank epoch, and epoch 12 of 12 ends the job
    assert re.search(rf"^\[0\] Epoch {done + 1}/12: 100%\S* 44/44", out, re.M), out[-3000:]
    assert re.search(r"^\[0\] Epoch 12/12: 100%\S* 44/44", out, re.M), out[-3000:]
    # so the checkpoints written after the reset carry global epoch numbers, and keep=3 prunes the old ones
    assert [n for n, _ in list_checkpoints(checkpoints)] == [10, 11, 12]
    accuracy = float(re.search(r"test accuracy (\d\.\d+)", out).group(1))
    assert accuracy >= 0.9


# The README's local elastic command (examples/discover_local.sh lists localhost:1 and 127.0.0.1:1).
README_ELASTIC = [
    "run", "-np", "2", "--min-np", "1", "--max-np", "2", "--host-discovery-script", "examples/discover_local.sh",
    "--network-interface", "lo", "examples/train_digits.py", "--elastic",
]  # fmt: skip
STEPS_PER_EPOCH = 22  # 1437 training digits, batches of 32 per rank, on 2 ranks


def descendants(root: int) -> set[int]:
    """The processes under ``root`` (from /proc's parent links)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def worker_pids(root: int, host: str) -> list[int]:
    """The training processes under ``root`` that horovodrun started on ``host`` (their HOROVOD_HOSTNAME)."""
    found = []
    for pid in descendants(root):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if f"HOROVOD_HOSTNAME={host}".encode() in env and b"train_digits.py" in cmdline:
            found.append(pid)
    return found


@pytest.mark.e2e
def test_readme_local_elastic_command_survives_a_killed_worker() -> None:
    lines: list[str] = []
    killed: list[int] = []
    with subprocess.Popen([HVDK8S, *README_ELASTIC], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, env=job_env(), start_new_session=True) as job:
        for line in output_of(job):
            lines.append(line)
            # horovodrun prefixes a worker's lines with its process index, not its (changing) rank
            if not killed and re.match(r"^\[\d\] Epoch 2/12: 100%", line):
                time.sleep(1.0)  # into epoch 3
                killed = worker_pids(job.pid, "127.0.0.1")
                for pid in killed:
                    os.kill(pid, signal.SIGKILL)
    out = "".join(lines)
    assert killed, out[-3000:]
    assert job.returncode == 0, out[-3000:]
    assert re.search(r"^\[\d\] elastic: training on 2 ranks from epoch 0, step 0$", out, re.M), out[-3000:]
    resumed = re.search(r"^\[\d\] elastic: training on 1 ranks from epoch (\d+), step (\d+)$", out, re.M)
    assert resumed, out[-3000:]
    epoch, step = int(resumed.group(1)), int(resumed.group(2))
    # The survivor went back to its last commit, taken after every batch and at each epoch end: all of
    # epochs 1-2 and what it committed after. The epoch count and the optimizer's step count come from the
    # same commit, so the step lies within the epoch; it is the epoch's end (epoch + 1 whole epochs) when
    # the kill fell between an epoch's last batch commit and its epoch-end commit.
    assert 2 * STEPS_PER_EPOCH <= step < 12 * STEPS_PER_EPOCH
    assert epoch * STEPS_PER_EPOCH <= step <= (epoch + 1) * STEPS_PER_EPOCH
    accuracy = float(re.search(r"test accuracy (\d\.\d+)", out).group(1))
    assert accuracy >= 0.9


def test_horovodrun_argv_exact_and_bounds_checked() -> None:
    argv = mpirun.horovodrun_argv(
        4, ["python", "t.py"], min_np=2, max_np=8, slots=2, discovery_script="/etc/mpi/discover_hosts.sh"
    )
    assert argv == [
        "horovodrun", "-np", "4", "--min-np", "2", "--max-np", "8", "--slots", "2",
        "--host-discovery-script", "/etc/mpi/discover_hosts.sh", "python", "t.py",
    ]  # fmt: skip
    try:
        mpirun.horovodrun_argv(4, ["t"], min_np=5, max_np=8, discovery_script="d")
    except ValueError as err:
        assert "min_np (5) <= np (4)" in str(err)
    else:
        raise AssertionError("bounds not checked")
    assert mpirun.horovodrun_argv(1, ["t"], min_np=1, max_np=2, discovery_script="d", blacklist_cooldown=(2, 4)) == [
        "horovodrun", "-np", "1", "--min-np", "1", "--max-np", "2", "--blacklist-cooldown-range", "2", "4",
        "--host-discovery-script", "d", "t",
    ]  # fmt: skip
    with pytest.raises(ValueError, match=r"blacklist cooldown: need 1 <= min \(5\) <= max \(2\) <= 3600 seconds"):
        mpirun.horovodrun_argv(1, ["t"], min_np=1, max_np=2, discovery_script="d", blacklist_cooldown=(5, 2))


@pytest.mark.parametrize("cooldown", [(1, 3600), (10, 300), MPIJOB_COOLDOWN, (0, 5), (10, 3601), (10, 7200), (5, 2)])
def test_blacklist_cooldown_is_refused_exactly_when_horovod_would(cooldown: tuple[int, int]) -> None:
    """Horovod checks the range in its driver's discovery thread (a traceback); hvdk8s before starting it."""
    try:
        HostState(cooldown)  # Horovod 0.28.1's own check (HostState._validate_cooldown_range)
        horovod_accepts = True
    except ValueError:
        horovod_accepts = False
    low, high = cooldown
    assert (mpirun.blacklist_cooldown_problem(cooldown) is None) == (horovod_accepts and low <= high)


# What each error is, and what elastic.run must do with it: True resets to the last commit, False fails the job.
FAILURES = {
    # recorded for real: a peer SIGKILLed mid-step (Horovod's background loop died of Gloo's
    # "Connection reset by peer" and shut down) ...
    "graph allreduce after a peer was killed": (recorded("graph_allreduce_peer_killed"), True),
    # ... and during a commit, where the broadcast of check_host_updates runs eagerly
    "eager broadcast in a commit after a peer was killed": (recorded("eager_broadcast_in_commit_peer_killed"), True),
    # the crash: Gloo's own text, no "Horovod" anywhere in it (the node is named after the optimizer)
    # a hang (rank 1 SIGSTOPped, as behind a cut link) ends in Gloo's timeout
    "Gloo timeout in a commit's broadcast": (recorded("eager_broadcast_in_commit_gloo_timeout"), True),
    "Gloo connection reset in the step's allreduce": (recorded("graph_allreduce_peer_killed", GLOO_RESET), True),
    "MPI transport failure in the step's allreduce": (recorded("graph_allreduce_peer_killed", MPI_FAILED), True),
    "process set removed under an eager broadcast": (
        recorded("eager_broadcast_in_commit_peer_killed", PROCESS_SET_REMOVED, "AbortedError"), True),
    # the script's own mistakes fail the job, Horovod's ops included
    "mismatched shapes across ranks (a script bug)": (
        recorded("graph_allreduce_peer_killed", MISMATCHED_SHAPES, "FailedPreconditionError"), False),
}


@pytest.mark.parametrize("name", FAILURES)
def test_collective_failures_are_classified_by_type_and_origin(name: str) -> None:
    (error_type, message, files), resets = FAILURES[name]
    assert elastic.is_collective_failure(raised(error_type, message, files)) is resets


def caught(func) -> BaseException:
    try:
        func()
    except Exception as err:  # noqa: BLE001
        return err
    raise AssertionError("nothing raised")


def user_py_function_fails() -> None:
    def boom(x):
        raise ValueError("bad record")

    tf.function(lambda x: tf.py_function(boom, [x], tf.float32))(tf.constant(1.0))


def user_op_fails() -> None:
    tf.function(lambda x: tf.debugging.check_numerics(x, "loss"))(tf.constant(np.nan))


def collective_failure_wrapped_by_the_script() -> None:
    error_type, message, files = recorded("graph_allreduce_peer_killed", GLOO_RESET)
    try:
        raise raised(error_type, message, files)
    except tf.errors.UnknownError as err:
        raise RuntimeError("training step failed") from err


@pytest.mark.parametrize("make, resets", [
    (user_py_function_fails, False),  # an UnknownError too, from an op the script defined
    (user_op_fails, False),
    (lambda: [][1], False),
    (lambda: (_ for _ in ()).throw(HostsUpdatedInterrupt(False)), False),  # Horovod's run_fn handles it itself
    (lambda: (_ for _ in ()).throw(HorovodInternalError("allreduce failed")), True),
    (collective_failure_wrapped_by_the_script, True),
])  # fmt: skip
def test_errors_raised_here_for_real_are_classified(make, resets: bool) -> None:
    assert elastic.is_collective_failure(caught(make)) is resets


def one_rank_elastic(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``hvdk8s run`` of an elastic job on one slot: Horovod over Gloo, which can shut down and init again."""
    _, discover = discovery_script(tmp_path, "localhost:1\n")
    return hvdk8s_cli("run", "-np", "1", "--min-np", "1", "--max-np", "1", "--host-discovery-script", str(discover),
                      "--network-interface", "lo", *args, check=False, timeout=180)


@pytest.mark.parametrize("failure, status", [
    ("gloo-reset", "Read error [127.0.0.1]:29068: Connection reset by peer"),
    ("gloo-timeout", "Timed out waiting 30000ms for send operation to complete"),
])  # fmt: skip
def test_a_failed_collective_resets_to_the_last_commit(tmp_path: Path, failure: str, status: str) -> None:
    proc = one_rank_elastic(tmp_path, str(SCRIPTS / "elastic_reset.py"), failure)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    starts = json.loads(proc.stdout.split("starts ", 1)[1].splitlines()[0])
    assert starts == [{"epoch": 0, "kernel": [1.0, 1.0]}, {"epoch": 1, "kernel": [2.0, 2.0]}]
    reset = re.search(r"^\[0\] hvdk8s.elastic: a collective failed \(UnknownError: .*\); resetting to the last commit$",
                      proc.stdout, re.M)
    assert reset and reset.group(0).count(status) == 1, proc.stdout[-3000:]


def test_an_error_in_the_script_fails_the_job(tmp_path: Path) -> None:
    proc = one_rank_elastic(tmp_path, str(SCRIPTS / "elastic_reset.py"), "script-bug")
    assert proc.returncode != 0
    assert "[0] ValueError: bad record 17" in proc.stdout
    assert "starts" not in proc.stdout and "a collective failed" not in proc.stdout
    assert proc.stderr.strip().splitlines()[-1] == "hvdk8s run: job failed: rank 0 raised ValueError: bad record 17"


@pytest.mark.parametrize("make, error, message", [
    (lambda: elastic.KerasState(None), TypeError, "model: expected a keras.Model, got NoneType None"),
    (lambda: elastic.KerasState(_model(), optimizer="sgd"), TypeError,
     "optimizer: expected a keras.optimizers.Optimizer or None (the model's), got str 'sgd'"),
    (lambda: elastic.CommitStateCallback(None, batches_per_commit=0), ValueError, "batches_per_commit=0: must be >= 1"),
    (lambda: elastic.CommitStateCallback(None, batches_per_commit="2"), TypeError,
     "batches_per_commit: expected a whole number, got str '2'"),
])
def test_elastic_state_and_commits_refuse_bad_arguments_when_made(make, error: type[Exception], message: str) -> None:
    """Before: an AttributeError inside Horovod's ObjectState, or (batches_per_commit=0) commits at epoch ends only."""
    with pytest.raises(error) as refused:
        make()
    assert str(refused.value) == message


def _model():
    import keras

    return keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
