"""Resuming from checkpoints whose path ends in .h5, as Horovod's ImageNet example keeps it (project issue #31).

Keras 3 saves a model given a .h5 path as legacy HDF5 and cannot train on from one: its legacy loader builds the
optimizer for none of the model's variables. ``hvdk8s migrate`` rewrites such checkpoint paths to .keras (argparse
defaults included) and ``hvdk8s.load_model`` refuses .h5 models with what to do instead. The last two tests (e2e:
``make test-e2e``) run tests/mpi_scripts/resume_checkpoint.py, a Horovod-style script, on 2 ranks through
``hvdk8s migrate`` and ``run``.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import HVDK8S, SCRIPTS, job_env


@pytest.fixture(scope="module")
def hvd():
    import hvdk8s

    hvdk8s.init(quiet=True)
    return hvdk8s


def compiled(hvd, distributed: bool = True):
    import keras

    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(keras.layers.Dense(3)(inputs)))
    opt = keras.optimizers.SGD(0.1, momentum=0.9)
    model.compile(hvd.DistributedOptimizer(opt) if distributed else opt, "sparse_categorical_crossentropy")
    return model


DATA = (np.random.default_rng(0).normal(size=(16, 4)).astype("float32"), np.arange(16) % 2)


def test_keras_itself_cannot_train_on_from_a_legacy_h5_model(hvd, tmp_path: Path) -> None:
    """Why hvdk8s.load_model refuses .h5 (if a Keras release fixes this, the refusal can become a load)."""
    import keras

    model = compiled(hvd, distributed=False)
    model.fit(*DATA, epochs=1, verbose=0)
    model.save(tmp_path / "plain.h5")
    loaded = keras.models.load_model(tmp_path / "plain.h5")
    assert len(loaded.optimizer.variables) == 2  # iteration and learning rate: no momentum for any weight
    with pytest.raises((ValueError, NotImplementedError)):  # "Unknown variable" (3.15), hidden behind numpy() (3.8)
        loaded.fit(*DATA, epochs=1, verbose=0)


@pytest.mark.parametrize("save", ["model.save .h5", "model.save .hdf5", "ModelCheckpoint .h5"])
def test_load_model_refuses_a_legacy_h5_model_saying_what_to_do(hvd, tmp_path: Path, save: str) -> None:
    import keras

    model = compiled(hvd)
    if save == "ModelCheckpoint .h5":
        model.fit(*DATA, epochs=2, verbose=0, callbacks=[keras.callbacks.ModelCheckpoint(str(tmp_path / "ck-{epoch}.h5"))])
        path = tmp_path / "ck-2.h5"
    else:
        model.fit(*DATA, epochs=1, verbose=0)
        path = tmp_path / ("m.h5" if save.endswith(".h5") else "m.hdf5")
        model.save(path)
    with pytest.raises(ValueError) as refused:  # not the NotImplementedError of fit on what Keras loads
        hvd.load_model(path)
    message = str(refused.value)
    assert message.startswith(f"{path} is a legacy HDF5 whole-model save")
    for advice in ("cannot resume training", ".keras", "hvdk8s migrate", "compile=False"):
        assert advice in message


def test_load_model_of_an_h5_model_saved_without_optimizer_is_keras_s(hvd, tmp_path: Path) -> None:
    import keras

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.save(tmp_path / "arch.h5")
    loaded = hvd.load_model(tmp_path / "arch.h5")
    assert getattr(loaded, "optimizer", None) is None
    assert all(np.array_equal(a, b) for a, b in zip(model.get_weights(), loaded.get_weights()))


def test_the_keras_checkpoint_migrate_writes_instead_resumes_distributed(hvd, tmp_path: Path) -> None:
    import keras

    from hvdk8s.train.optimizer import is_distributed

    model = compiled(hvd)
    model.fit(*DATA, epochs=2, verbose=0, callbacks=[keras.callbacks.ModelCheckpoint(str(tmp_path / "ck-{epoch}.keras"))])
    loaded = hvd.load_model(tmp_path / "ck-2.keras")
    assert is_distributed(loaded.optimizer) and int(loaded.optimizer.iterations.numpy()) == 2
    for saved, restored in zip(model.optimizer.variables, loaded.optimizer.variables):
        assert np.array_equal(saved.numpy(), restored.numpy())
    loaded.fit(*DATA, epochs=3, initial_epoch=2, verbose=0)
    assert int(loaded.optimizer.iterations.numpy()) == 3


# --- the Horovod-style script on 2 ranks -----------------------------------------------------------------------


def migrated_script(tmp_path: Path) -> Path:
    """tests/mpi_scripts/resume_checkpoint.py migrated in ``tmp_path``: its .h5 default becomes .keras, with a note."""
    script = Path(shutil.copy(SCRIPTS / "resume_checkpoint.py", tmp_path / "train.py"))
    proc = subprocess.run([HVDK8S, "migrate", "--write", "train.py"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    line = next(i for i, text in enumerate(script.read_text().splitlines(), 1) if "--checkpoint-format" in text)
    assert f"train.py:{line}: note: --checkpoint-format: default rewritten to .keras" in proc.stderr
    assert 'default="./checkpoint-{epoch}.keras"' in script.read_text()
    return script


def run(tmp_path: Path, *args: str, check: bool = True, ranks: int = 2) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([HVDK8S, "run", "-np", str(ranks), "train.py", *args], cwd=tmp_path, capture_output=True,
                          text=True, timeout=240, env=job_env())  # fmt: skip
    assert not check or proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    return proc


def per_rank(out: str, pattern: str) -> dict[str, tuple[str, ...]]:
    return {m[0]: m[1:] for m in re.findall(rf"^\[(\d)\] {pattern}$", out, re.M)}


@pytest.mark.e2e
def test_migrated_horovod_script_resumes_from_its_last_checkpoint_on_2_ranks(tmp_path: Path) -> None:
    migrated_script(tmp_path)
    first = run(tmp_path, "--epochs", "2").stdout  # a job stopped after epoch 2
    assert per_rank(first, r"resume_from_epoch (\d+)") == {"0": ("0",), "1": ("0",)}, first[-3000:]
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-1.keras", "checkpoint-2.keras"]

    second = run(tmp_path, "--epochs", "3").stdout  # restarted: rank 0 loads checkpoint-2 and tells rank 1
    assert per_rank(second, r"resume_from_epoch (\d+)") == {"0": ("2",), "1": ("2",)}, second[-3000:]
    assert re.search(r"^\[0\] Epoch 3/3$", second, re.M) and "Epoch 1/3" not in second, second[-3000:]
    trained = per_rank(second, r"trained \[(.*)\] iterations (\d+) checksum (\S+)")
    # epoch 3 only, the optimizer's step count goes on from checkpoint-2's 16, and both ranks hold the same weights
    assert trained.keys() == {"0", "1"} and trained["0"] == trained["1"], second[-3000:]
    assert trained["0"][:2] == ("2", "24")
    assert (tmp_path / "checkpoint-3.keras").exists()


@pytest.mark.e2e
def test_an_h5_checkpoint_format_given_on_the_command_line_is_refused_on_resume(tmp_path: Path) -> None:
    migrated_script(tmp_path)
    # one rank writes the checkpoint as rank 0 of two does (one TensorFlow start-up fewer); the resume runs on 2
    run(tmp_path, "--epochs", "1", "--checkpoint-format", "./ck-{epoch}.h5", ranks=1)
    assert (tmp_path / "ck-1.h5").exists()  # Keras 3 saves it, as legacy HDF5
    resumed = run(tmp_path, "--epochs", "2", "--checkpoint-format", "./ck-{epoch}.h5", check=False)
    out = resumed.stdout + resumed.stderr
    assert resumed.returncode != 0
    assert "[0] ValueError: ./ck-1.h5 is a legacy HDF5 whole-model save" in out, out[-5000:]
    assert "NotImplementedError" not in out and "ValueError: Unknown variable" not in out
