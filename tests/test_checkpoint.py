"""Checkpoints: rank 0 only, atomic, and a killed job resumes where it stopped."""
from __future__ import annotations

import functools
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from multiprocessing.connection import Connection
from pathlib import Path

import keras
import numpy as np
import pytest

from hvdk8s.train import checkpoint

from conftest import HVDK8S, REPO, hvdk8s_cli, job_env, run_ranks


def test_only_rank_0_writes_and_old_checkpoints_are_pruned(tmp_path: Path) -> None:
    proc = run_ranks(2, "checkpoint_per_rank.py", str(tmp_path))
    assert [p.name for _, p in checkpoint.list_checkpoints(tmp_path / "rank0")] == ["ckpt-0002.keras", "ckpt-0003.keras"]
    assert not (tmp_path / "rank1").exists()
    # restore_latest given a checkpoint for its folder: rank 0 finds out, and both ranks raise it
    said = (f"refused: checkpoint folder {tmp_path / 'rank0' / 'ckpt-0003.keras'}: is a file; expected the folder "
            f"holding the ckpt-NNNN.keras checkpoints (Checkpoint's directory), such as {tmp_path / 'rank0'}")
    assert sorted(line for line in proc.stdout.splitlines() if "refused:" in line) == [f"[0] {said}", f"[1] {said}"]


def tiny_model() -> keras.Model:
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile("sgd", "mse")
    return model


def test_failed_save_keeps_previous_checkpoint_and_leaves_no_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_model()
    good = checkpoint.save_atomic(model, checkpoint.checkpoint_path(tmp_path, 1))
    before = good.read_bytes()

    def crash_midway(path: os.PathLike[str]) -> None:
        Path(path).write_bytes(b"half a zip")
        raise OSError("disk full")

    monkeypatch.setattr(model, "save", crash_midway)
    with pytest.raises(OSError, match="disk full"):
        checkpoint.save_atomic(model, checkpoint.checkpoint_path(tmp_path, 1))
    assert good.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-0001.keras"]


def test_listing_ignores_temporaries_and_other_files(tmp_path: Path) -> None:
    for name in ("ckpt-0002.keras", "ckpt-0010.keras", ".tmp-99-ckpt-0011.keras", "notes.txt", "ckpt-3.keras"):
        (tmp_path / name).write_text("x")
    assert [e for e, _ in checkpoint.list_checkpoints(tmp_path)] == [2, 10]
    assert checkpoint.list_checkpoints(tmp_path / "missing") == []


def _write_half(final: Path, names: Connection) -> None:
    """A checkpoint write in progress: its temporary, named as save_atomic names it, half written."""
    tmp = checkpoint.temporary_path(final)
    tmp.write_bytes(b"half a zip")
    names.send(tmp.name)
    time.sleep(300)


def writer(final: Path) -> tuple[multiprocessing.process.BaseProcess, str]:
    """A writer process, forked from this one: its own pid, and no second Keras import."""
    fork = multiprocessing.get_context("fork")
    names, child_end = fork.Pipe(duplex=False)
    proc = fork.Process(target=_write_half, args=(final, child_end), daemon=True)
    proc.start()
    assert names.poll(60), "the writer named no temporary"
    return proc, names.recv()


def killed_writer(final: Path) -> str:
    """The temporary a writer SIGKILLed mid-write leaves behind."""
    proc, name = writer(final)
    proc.kill()
    proc.join()
    return name


def test_only_stale_temporaries_are_removed(tmp_path: Path) -> None:
    dead = killed_writer(checkpoint.checkpoint_path(tmp_path, 4))
    live, live_name = writer(checkpoint.checkpoint_path(tmp_path, 5))
    try:
        old = time.time() - checkpoint.ABANDONED_AFTER_S - 60
        for name, mtime in [(".tmp-other-pod-77-ckpt-0003.keras", None), (".tmp-other-pod-78-ckpt-0002.keras", old),
                            (".tmp-99-ckpt-0001.keras", old), ("ckpt-0001.keras", old), (".tmp-1-model.keras", old)]:
            (tmp_path / name).write_text("x")
            if mtime:
                os.utime(tmp_path / name, (mtime, mtime))
        removed = checkpoint.remove_stale_temporaries(tmp_path)
        assert sorted(p.name for p in removed) == sorted([dead, ".tmp-other-pod-78-ckpt-0002.keras", ".tmp-99-ckpt-0001.keras"])
        # a live writer's, and a recent one from another host, whose writer cannot be asked, stay
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            [live_name, ".tmp-other-pod-77-ckpt-0003.keras", "ckpt-0001.keras", ".tmp-1-model.keras"])
    finally:
        live.kill()
        live.join()


def kill_session(sid: int) -> None:
    """SIGKILL every process of session ``sid`` and wait until none is left."""
    def members() -> list[int]:
        pids = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid and fields[0] != "Z":  # fields after the name: state, ppid, pgrp, session
                pids.append(int(stat.parent.name))
        return pids

    deadline = time.monotonic() + 30
    while (pids := members()) and time.monotonic() < deadline:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
    assert not members(), "processes of the killed job survived"


@pytest.mark.e2e
def test_killed_job_resumes_from_last_checkpoint(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    args = ["run", "-np", "2", "examples/train_digits.py", "--checkpoint-dir", str(ckpt), "--warmup-epochs", "0"]
    job = subprocess.Popen(
        [HVDK8S, *args, "--epochs", "60"], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, env=job_env(),
    )
    try:
        deadline = time.monotonic() + 240
        while not checkpoint.checkpoint_path(ckpt, 3).exists():
            assert job.poll() is None, "training ended before it could be killed"
            assert time.monotonic() < deadline, "no checkpoint after 240 s"
            time.sleep(0.2)
    finally:
        kill_session(job.pid)  # mpirun and every rank, as a pod kill would: mpirun's ranks may not share its group
        job.wait()
    killed_at = checkpoint.list_checkpoints(ckpt)[-1][0]
    assert 3 <= killed_at < 60
    leftover = killed_writer(checkpoint.checkpoint_path(ckpt, killed_at + 1))  # as a kill mid-write leaves it

    resumed = hvdk8s_cli(*args, "--epochs", str(killed_at + 2))
    assert f"resumed from {checkpoint.checkpoint_path(ckpt, killed_at)} (epoch {killed_at})" in resumed.stdout
    epochs_run = [int(e) for e in re.findall(r"^\[0\] Epoch (\d+)/\d+: 100%", resumed.stdout, re.M)]
    assert epochs_run == [killed_at + 1, killed_at + 2]
    assert checkpoint.list_checkpoints(ckpt)[-1][0] == killed_at + 2
    assert not (ckpt / leftover).exists()


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("demo")
    run_ranks_demo = hvdk8s_cli(
        "run", "-np", "2", "examples/train_digits.py", "--epochs", "12",
        "--save", str(out / "model.keras"), "--metrics-out", str(out / "metrics.json"),
    )
    assert re.search(r"^\[0\] Epoch 12/12: 100%", run_ranks_demo.stdout, re.M)
    assert not re.search(r"^\[1\] (Epoch|test accuracy)", run_ranks_demo.stdout, re.M)  # rank 0 only
    assert f"[0] saved the model to {out / 'model.keras'}" in run_ranks_demo.stdout
    # Quiet by default: none of TensorFlow's start-up lines, Keras's shuffle warning or GPU news on a CPU machine.
    noise = ("absl::InitializeLog", "cpu_feature_guard", "shuffle=True", "GPU telemetry")
    said = run_ranks_demo.stdout + run_ranks_demo.stderr
    assert not [line for line in said.splitlines() if any(n in line for n in noise)], said[-3000:]
    return out


def test_demo_training_reaches_95_percent_on_held_out_digits(demo_run: Path) -> None:
    metrics = json.loads((demo_run / "metrics.json").read_text())
    assert metrics["accuracy"] >= 0.95, metrics


def test_saved_model_loads_with_plain_keras(demo_run: Path) -> None:
    code = (
        "import sys, keras\n"
        f"m = keras.models.load_model({str(demo_run / 'model.keras')!r})\n"
        "assert 'hvdk8s' not in sys.modules and 'horovod' not in sys.modules\n"
        "print(type(m.optimizer).__name__, int(m.optimizer.iterations.numpy()))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    name, iterations = proc.stdout.split()
    assert name == "SGD"
    assert int(iterations) == 12 * 22  # 12 epochs of 22 steps: optimizer state was saved


@pytest.mark.filterwarnings("ignore:.*device and thread pinning skipped:UserWarning")
def test_a_checkpoint_numbered_below_the_newest_one_warns(tmp_path: Path) -> None:
    """Keras's epoch names the checkpoint: a fit that restarts its epochs at 0 (Horovod's elastic
    ``fit(epochs=N - state.epoch)``) writes numbers below those already there, which pruning removes first."""
    import hvdk8s

    hvdk8s.init(quiet=True)
    model, data = tiny_model(), (np.ones((4, 3), np.float32), np.ones((4, 2), np.float32))
    fit = functools.partial(model.fit, *data, verbose=0, callbacks=[checkpoint.Checkpoint(tmp_path, keep=2)])
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="hvdk8s.Checkpoint")
        fit(epochs=3)
        fit(initial_epoch=3, epochs=4)  # resumed at the epoch the newest checkpoint holds
        fit(initial_epoch=3, epochs=4)  # an elastic round rolled back between a checkpoint and its commit
    assert [n for n, _ in checkpoint.list_checkpoints(tmp_path)] == [3, 4]
    with pytest.warns(UserWarning) as warned:
        fit(epochs=2)
    assert [str(w.message) for w in warned if "hvdk8s.Checkpoint" in str(w.message)] == [
        f"hvdk8s.Checkpoint: {tmp_path} already holds ckpt-0004.keras, newer than the ckpt-0001.keras written now, "
        "which sorts before it: pruning removes it first and a resume never reads it. This fit's epochs do not "
        "count the earlier ones: pass fit(initial_epoch=) the epoch resumed at (in every elastic round too), "
        "or use an empty folder"
    ]  # once per fit
    assert [n for n, _ in checkpoint.list_checkpoints(tmp_path)] == [3, 4]


@pytest.mark.unit
def test_restore_refuses_a_checkpoint_file_for_the_folder(tmp_path: Path) -> None:
    """A checkpoint's own path used to give 0 (a fresh start): the resume was lost without a word. (restore_latest
    reads with load_latest on rank 0 and raises on every rank: test_only_rank_0_writes_and_old_checkpoints_are_pruned.)"""
    model = tiny_model()
    path = checkpoint.save_atomic(model, checkpoint.checkpoint_path(tmp_path, 7))
    with pytest.raises(ValueError) as refused:
        checkpoint.load_latest(model, path)
    assert str(refused.value) == (f"checkpoint folder {path}: is a file; expected the folder holding the "
                                  f"ckpt-NNNN.keras checkpoints (Checkpoint's directory), such as {tmp_path}")
    assert checkpoint.load_latest(model, tmp_path) == 7


@pytest.mark.unit
def test_a_checkpoint_of_another_architecture_is_named(tmp_path: Path) -> None:
    checkpoint.save_atomic(tiny_model(), checkpoint.checkpoint_path(tmp_path, 3))
    other = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(2)])
    other.compile("sgd", "mse")
    with pytest.raises(ValueError) as refused:
        checkpoint.load_latest(other, tmp_path)
    assert re.fullmatch(
        rf"checkpoint ckpt-0003\.keras in {re.escape(str(tmp_path))}: does not fit the model \(saved from another "
        r"architecture\?\); Keras: A total of 2 objects could not be loaded\. Example error message for object "
        r"<Dense name=\w+, built=True>:", str(refused.value))


@pytest.mark.unit
@pytest.mark.parametrize("arguments, error, message", [
    ({"every_epochs": "2"}, TypeError, "every_epochs: expected a whole number, got str '2'"),
    ({"every_epochs": 1.5}, TypeError, "every_epochs: expected a whole number, got float 1.5"),
    ({"every_epochs": 0}, ValueError, "every_epochs=0: must be >= 1"),
    ({"keep": "3"}, TypeError, "keep: expected a whole number, got str '3'"),
    ({"keep": 0}, ValueError, "keep=0: must be >= 1"),
])
def test_checkpoint_refuses_counts_that_are_not_whole_numbers_above_0(
    tmp_path: Path, arguments: dict, error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as refused:
        checkpoint.Checkpoint(tmp_path, **arguments)
    assert str(refused.value) == message


@pytest.mark.unit
def test_load_model_says_what_is_wrong_with_the_file(tmp_path: Path) -> None:
    """Keras called a text file named .keras "File not found", h5py a missing .h5 "Unable to synchronously open"."""
    import hvdk8s

    (text := tmp_path / "x.keras").write_text("not a model")
    (notes := tmp_path / "y.h5").write_text("not a model")
    (other := tmp_path / "model.txt").write_text("not a model")
    for path, message in [
        (text, f"model {text}: not a valid .keras file: a .keras file is a zip archive and this one (11 bytes) is not "
               "a complete one (truncated, still being written, or not written by Keras)"),
        (tmp_path / "x.h5", f"model {tmp_path / 'x.h5'}: no such file"),
        (notes, f"model {notes}: not a valid .h5 file: a legacy Keras model is an HDF5 file and this one (11 bytes) "
                "is not one"),
        (other, f"model {other}: expected a .keras file (written by model.save('name.keras')) or a legacy .h5/.hdf5 "
                "file; this one's name ends in '.txt'"),
    ]:
        with pytest.raises(ValueError) as refused:
            hvdk8s.load_model(path)
        assert str(refused.value) == message
    tiny_model().save(tmp_path / "unzipped", zipped=False)  # a folder, which Keras loads itself
    assert hvdk8s.load_model(tmp_path / "unzipped").count_params() == tiny_model().count_params()


@pytest.mark.unit
def test_load_model_refuses_custom_optimizers_that_are_not_optimizer_classes(tmp_path: Path) -> None:
    import hvdk8s

    tiny_model().save(path := tmp_path / "m.keras")
    for custom, message in [
        (["Adam"], "custom_optimizers: expected optimizer classes (keras.optimizers.Optimizer subclasses), "
                   "got str 'Adam'"),
        ([keras.layers.Dense], "custom_optimizers: expected optimizer classes (keras.optimizers.Optimizer "
                               f"subclasses), got type {keras.layers.Dense!r}"),
        ("Adam", "custom_optimizers: expected a list of optimizer classes, got 'Adam'"),
    ]:
        with pytest.raises(TypeError) as refused:
            hvdk8s.load_model(path, custom_optimizers=custom)
        assert str(refused.value) == message


class _Nesterov(keras.optimizers.SGD):
    """An optimizer class Keras knows only when it is passed in: not registered."""


@pytest.mark.unit
def test_load_model_takes_custom_optimizers_from_any_iterable(tmp_path: Path) -> None:
    import hvdk8s
    from hvdk8s.train import loading

    assert loading._optimizer_classes(cls for cls in [_Nesterov]) == [_Nesterov]  # a generator, read once
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(_Nesterov(0.1, momentum=0.9), "mse")
    model.save(path := tmp_path / "m.keras")
    loaded = hvdk8s.load_model(path, custom_optimizers=(cls for cls in [_Nesterov]))
    assert isinstance(loaded.optimizer, _Nesterov) and loaded.optimizer.momentum == 0.9
