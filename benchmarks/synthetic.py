"""Horovod's own synthetic benchmarks in the suite: ``--workloads horovod-synthetic:<Model>``.

Two scripts copied from Horovod's repository (``horovod_examples/``, each with its origin and every change
marked): the raw ``horovod.tensorflow`` loop (``tensorflow2_synthetic_benchmark.py`` with the fixes Keras 3
forces) and the Keras ``fit`` version as ``hvdk8s migrate`` ports it (``tensorflow2_keras_synthetic_benchmark.py``).
Each launch is the script run as a user runs it (mpirun, ``--no-cuda``, no thread settings from the suite:
the raw loop keeps TensorFlow's defaults, hvdk8s applies its own policy); rank 0 prints one img/s figure per
iteration, which is all the suite reads. The two scripts run the same number of steps: the raw loop's first
step and warm-up batches are one iteration, as the Keras version's first epoch (which it skips itself).
Pure functions: the suite launches, ``analysis.synthetic`` summarises.
"""
from __future__ import annotations

import re
from pathlib import Path

PREFIX = "horovod-synthetic:"
EXAMPLES = Path(__file__).resolve().with_name("horovod_examples")
SCRIPTS = {"raw": "tensorflow2_synthetic_benchmark.py", "hvdk8s": "tensorflow2_keras_synthetic_benchmark.py"}
# Batch per rank: small enough for a 2-core machine (a ResNet50 step at 4 images per rank took about 1 s at N=2).
BATCH = {"MobileNetV2": 8, "ResNet50": 4}
DEFAULT_BATCH = 8
# mpirun's --tag-output prefix ("[1,0]<stdout>:"), which lands mid-line when a rank's output arrives in pieces
# ("...per CPU[1,0]<stdout>:\n"); only rank 0 prints the iterations in both scripts.
_TAG = re.compile(r"\[\d+,\d+\]<std(?:out|err)>:")
_ITER = re.compile(r"Iter #(\d+): ([0-9.]+) img/sec per (?:CPU|GPU)")
_MODEL = re.compile(r"^[A-Z][A-Za-z0-9]*$")


def model_of(workload: str) -> str | None:
    """``MobileNetV2`` for ``horovod-synthetic:MobileNetV2``; None for a suite workload; ValueError for a bad name."""
    if not workload.startswith(PREFIX):
        return None
    model = workload[len(PREFIX):]
    if not _MODEL.match(model):
        raise ValueError(f"workload {workload!r}: expected {PREFIX}<a keras.applications model, e.g. ResNet50>")
    return model


def batch(model: str) -> int:
    return BATCH.get(model, DEFAULT_BATCH)


def script(which: str) -> Path:
    return EXAMPLES / SCRIPTS[which]


def script_args(which: str, model: str, batches_per_iter: int, iters: int) -> list[str]:
    """Arguments giving both scripts ``iters`` timed iterations after one iteration's worth of warm-up steps."""
    common = ["--model", model, "--batch-size", str(batch(model)), "--num-batches-per-iter", str(batches_per_iter), "--no-cuda"]
    if which == "raw":  # first_batch step + (batches_per_iter - 1) warm-up batches, then ``iters`` timed
        return [*common, "--num-warmup-batches", str(batches_per_iter - 1), "--num-iters", str(iters)]
    return [*common, "--num-iters", str(iters + 1)]  # epoch 0 is its warm-up, not counted


def order(r: int) -> tuple[str, str]:
    """Which script runs first in round ``r``: alternating, so drift in load within a round cancels over rounds."""
    return ("raw", "hvdk8s") if r % 2 == 0 else ("hvdk8s", "raw")


def iter_rates(log: str, which: str, iters: int) -> list[float]:
    """Rank 0's img/s per rank of every timed iteration, from a launch's output; ValueError if they are not all there."""
    found = [(int(k), float(v)) for k, v in _ITER.findall(_TAG.sub("", log))]
    rates = [v for k, v in found if which == "raw" or k > 0]  # the Keras version's epoch 0 is its warm-up
    if len(rates) != iters:
        raise ValueError(f"{SCRIPTS[which]}: expected {iters} timed iterations in its output, found {len(rates)}")
    return rates
