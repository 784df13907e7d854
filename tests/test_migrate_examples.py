"""Horovod's Keras examples run on hvdk8s after ``hvdk8s migrate --write``, on 2 ranks.

Each test copies an example, as published in Horovod's repository, from ../shared/peer/horovod/examples into a
temporary folder (never into the repository), migrates the copy and trains it with ``hvdk8s run``; without
../shared every test here skips, naming it. The scripts are
changed by ``migrate`` only; the harness on PYTHONPATH (tests/horovod_examples/sitecustomize.py) serves
scikit-learn's digits as MNIST or as 32x32 ImageNet-style folders and caps ``fit`` at
HVDK8S_EXAMPLE_MAX_EPOCHS epochs of HVDK8S_EXAMPLE_MAX_STEPS steps, so the 24- and 90-epoch examples fit the
test budget.
"""
from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import HVDK8S, SHARED, discovery_script, job_env, needs_shared, output_of

pytestmark = needs_shared("peer/horovod/examples")
EXAMPLES = SHARED / "peer" / "horovod" / "examples"
HARNESS = Path(__file__).resolve().parent / "horovod_examples"


def migrated(tmp_path: Path, name: str) -> Path:
    """A migrated copy of example ``name`` in ``tmp_path``; migrate must leave nothing to do by hand."""
    script = shutil.copy(EXAMPLES / name, tmp_path / name)
    proc = subprocess.run([HVDK8S, "migrate", "--write", name], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "import hvdk8s as hvd" in Path(script).read_text()
    return Path(script)


def example_env(max_epochs: int, max_steps: int) -> dict[str, str]:
    env = job_env()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HARNESS), env.get("PYTHONPATH")]))
    env["HVDK8S_EXAMPLE_MAX_EPOCHS"] = str(max_epochs)
    env["HVDK8S_EXAMPLE_MAX_STEPS"] = str(max_steps)
    return env


def run_example(tmp_path: Path, argv: list[str], env: dict[str, str]) -> str:
    proc = subprocess.run([HVDK8S, "run", *argv], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    return proc.stdout


def test_keras_mnist_advanced_trains_on_2_ranks_with_identical_weights(tmp_path: Path) -> None:
    migrated(tmp_path, "keras_mnist_advanced.py")
    out = run_example(tmp_path, ["-np", "2", "keras_mnist_advanced.py", "--epochs", "2"], example_env(2, 4))
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-1.keras", "checkpoint-2.keras"]
    # Both ranks evaluate the whole test set: the same loss (a float, to rounding of the evaluation's sums)
    # only if their weights are the same; accuracy, a count of right answers, could agree by chance.
    losses = {rank: float(loss) for rank, loss in re.findall(r"^\[(\d)\] Test loss: (\S+)", out, re.M)}
    assert losses.keys() == {"0", "1"} and math.isclose(losses["0"], losses["1"], rel_tol=1e-6), out[-3000:]
    scores = dict(re.findall(r"^\[(\d)\] Test accuracy: (\S+)", out, re.M))
    assert scores.keys() == {"0", "1"} and scores["0"] == scores["1"], out[-3000:]


@pytest.mark.e2e
def test_tensorflow2_keras_mnist_trains_on_2_ranks(tmp_path: Path) -> None:
    migrated(tmp_path, "tensorflow2_keras_mnist.py")
    out = run_example(tmp_path, ["-np", "2", "tensorflow2_keras_mnist.py"], example_env(2, 4))
    assert re.search(r"^\[0\] Epoch 2/2", out, re.M), out[-3000:]
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-1.keras", "checkpoint-2.keras"]


@pytest.mark.e2e
def test_tensorflow2_keras_mnist_elastic_with_mixed_precision_trains_on_2_ranks(tmp_path: Path) -> None:
    """``--use-mixed-precision``: compile wraps the DistributedOptimizer in Keras's LossScaleOptimizer, and the
    example's warm-up fit has no hvdk8s callback; a rank deciding alone to skip a step would hang the job."""
    migrated(tmp_path, "tensorflow2_keras_mnist_elastic.py")
    env = {**example_env(2, 2), "HOROVOD_STALL_CHECK_TIME_SECONDS": "5", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "30"}
    out = run_example(tmp_path, ["-np", "2", "tensorflow2_keras_mnist_elastic.py", "--use-mixed-precision"], env)
    assert re.search(r"^\[0\] Epoch 2/2", out, re.M) and re.search(r"^\[1\] Epoch 2/2", out, re.M), out[-3000:]
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-1.keras", "checkpoint-2.keras"]


@pytest.mark.e2e
def test_keras_imagenet_resnet50_resumes_from_its_default_checkpoint(tmp_path: Path) -> None:
    """The example's default ``--checkpoint-format`` (``./checkpoint-{epoch}.h5``, rewritten to .keras by migrate):
    a second run finds epoch 1's checkpoint, ``hvd.load_model`` restores model and optimizer on rank 0, the
    broadcast reaches rank 1, and training goes on at epoch 2 with the optimizer's step count carried over."""
    migrated(tmp_path, "keras_imagenet_resnet50.py")
    env = {**example_env(2, 2), "HVDK8S_EXAMPLE_IMAGES": "64"}
    argv = ["-np", "2", "keras_imagenet_resnet50.py", "--batch-size", "8", "--val-batch-size", "8"]
    run_example(tmp_path, [*argv, "--epochs", "1"], env)  # Keras prints no "Epoch 1/1" header for one epoch
    assert [p.name for p in tmp_path.glob("checkpoint-*")] == ["checkpoint-1.keras"]
    second = run_example(tmp_path, [*argv, "--epochs", "2"], env)
    assert re.search(r"^\[0\] Epoch 2/2", second, re.M) and not re.search(r"Epoch 1/2", second), second[-3000:]
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-1.keras", "checkpoint-2.keras"]
    # 2 steps per epoch: a run that started over would save 2 optimizer steps in checkpoint-2 as well
    assert [optimizer_iterations(tmp_path / f"checkpoint-{e}.keras") for e in (1, 2)] == [2, 4]
    scores = dict(re.findall(r"^\[(\d)\] Test accuracy: (\S+)", second, re.M))
    assert set(scores) <= {"0"} and scores, second[-3000:]  # the example prints on rank 0 only


def optimizer_iterations(checkpoint: Path) -> int:
    """The optimizer's ``iterations`` saved in a ``.keras`` file (its weights archive, read without Keras)."""
    import io
    import zipfile

    import h5py

    with zipfile.ZipFile(checkpoint) as archive, h5py.File(io.BytesIO(archive.read("model.weights.h5"))) as weights:
        return int(weights["optimizer/vars/0"][()])


@pytest.mark.e2e
def test_tensorflow2_keras_mnist_elastic_grows_from_1_to_2_ranks(tmp_path: Path) -> None:
    migrated(tmp_path, "tensorflow2_keras_mnist_elastic.py")
    hosts, discover = discovery_script(tmp_path, "localhost:1\n")
    argv = [
        HVDK8S, "run", "-np", "1", "--min-np", "1", "--max-np", "2", "--host-discovery-script", str(discover),
        "--network-interface", "lo", "tensorflow2_keras_mnist_elastic.py",
    ]  # fmt: skip
    lines: list[str] = []
    env = {**example_env(3, 6), "HVDK8S_EXAMPLE_HOLD_FOR_RANKS": "2"}  # training waits for the joining worker
    with subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                          start_new_session=True) as job:  # fmt: skip
        for line in output_of(job):
            lines.append(line)
            if re.match(r"^\[0\] Epoch 1/[2-9]", line):  # the real fit (not the 1-step warm-up fits) has begun
                hosts.write_text("localhost:2\n")  # a second slot appears: a worker joins mid-run
    out = "".join(lines)
    assert job.returncode == 0, out[-5000:]
    joined = next(i for i, line in enumerate(lines) if re.match(r"^\[0\] Epoch 1/[2-9]", line))
    assert any(line.startswith("[1] Epoch") for line in lines[joined:]), out[-5000:]  # rank 1 trained after joining
    assert list(tmp_path.glob("checkpoint-*.keras")), out[-3000:]
