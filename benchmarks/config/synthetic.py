"""Horovod's synthetic benchmarks as the suite's workloads: ``--workloads horovod-synthetic:<Model>``.

The benchmark of Horovod's ``examples/tensorflow2/tensorflow2_synthetic_benchmark.py`` (the raw loop) and
``tensorflow2_keras_synthetic_benchmark.py`` (Keras ``fit``), v0.28.1: a ``keras.applications`` model built with
``weights=None``, one batch of uniform random 224x224x3 images with random labels among the model's 1000 classes,
plain SGD at learning rate 0.01 (not scaled by the number of ranks), and rank 0 printing each timed iteration's
images per second per rank (``Iter #k: R img/sec per CPU``). Written here as two modules that take those scripts'
flags, each run under mpirun as a user runs it (``python -m hvdk8s.benchmarks.workers.synthetic_loop`` / ``synthetic_fit``):
``synthetic_loop`` is the raw ``horovod.tensorflow`` loop with TensorFlow's thread defaults (``--intra-op-threads``
to set its pool), ``synthetic_fit`` is Keras ``fit`` on hvdk8s, which applies its own CPU thread policy. The suite
launches the loop twice where the two differ (N > 1): as a user gets it (script ``raw``), and with hvdk8s's
intra-op split given by ``--intra-op-threads`` (script ``raw_split``, the one line a careful user writes), so hvdk8s
is compared with the loop at equal threads and the thread policy's own gain is a row of its own. It reads only
rank 0's per-iteration rates. Every script runs the same number of steps: the loop's first step and warm-up
batches are one iteration, as the ``fit`` version's first epoch, which it prints as ``Iter #0`` and does not count.

With ``synthetic_peer`` (a folder holding Horovod's two scripts), every round also launches Horovod's own scripts with
the same flags: the raw one with the two changes Keras 3 forces (``PEER_FIXES``), the Keras one as ``hvdk8s migrate``
ports it, both written to a temporary folder for the run and never kept; ``analysis.synthetic`` says whether the
suite's versions agree with them (``analysis.agrees``).

Pure functions, importable without TensorFlow except ``model_and_batch``: the suite launches, ``analysis`` summarises.
"""
from __future__ import annotations

import argparse
import difflib
import os
import re
import statistics
from pathlib import Path
from typing import Any

from hvdk8s.threads import DEFAULT_CPU_THREAD_POLICY, thread_pools

PREFIX = "horovod-synthetic:"
IMAGE_SHAPE = (224, 224, 3)
CLASSES = 1000  # a keras.applications model's default head
LEARNING_RATE = 0.01
# Batch per rank: small enough for a 2-core machine (a ResNet50 step at 4 images per rank took about 1 s at N=2).
BATCH = {"MobileNetV2": 8, "ResNet50": 4}
DEFAULT_BATCH = 8
# The suite's modules by script name (``raw_split``: the loop at hvdk8s's thread split); the counterparts among
# Horovod's own scripts, and their files.
MODULES = {"raw": "synthetic_loop", "raw_split": "synthetic_loop", "hvdk8s": "synthetic_fit"}
SPLIT = "raw_split"
PEER_OF = {"raw": "horovod_raw", "hvdk8s": "horovod_keras"}
PEER_FILES = {"horovod_raw": "tensorflow2_synthetic_benchmark.py",
              "horovod_keras": "tensorflow2_keras_synthetic_benchmark.py"}
FIT_SCRIPTS = ("hvdk8s", "horovod_keras")  # Keras fit: epoch 0 is the warm-up iteration
# Horovod's raw script on Keras 3 (TensorFlow >= 2.16): (its text, the fix, why), each applied where it occurs once.
PEER_FIXES = (
    ("tape.gradient(loss, model.trainable_variables)",
     "tape.gradient(loss, [v.value for v in model.trainable_variables])",
     "DistributedGradientTape keys gradients by Variable.ref(), which Keras 3 variables lack; pass their tf.Variables"),
    ("opt.variables()", "opt.variables", "a Keras 3 optimizer's variables are a list, not a method"),
)
# mpirun's --tag-output prefix ("[1,0]<stdout>:"), which lands mid-line when a rank's output arrives in pieces
# ("...per CPU[1,0]<stdout>:\n"); only rank 0 prints the iterations in every script.
_TAG = re.compile(r"\[\d+,\d+\]<std(?:out|err)>:")
_ITER = re.compile(r"Iter #(\d+): ([0-9.]+) img/sec per (?:CPU|GPU)")
_MODEL = re.compile(r"^[A-Z][A-Za-z0-9]*$")
# keras.applications' models, the same in every Keras this package supports (3.8 to 3.15: keras/applications/__init__.py,
# keras/api/applications/ in 3.8), so a misspelt one is refused before any launch without importing Keras.
MODELS = (
    "ConvNeXtBase", "ConvNeXtLarge", "ConvNeXtSmall", "ConvNeXtTiny", "ConvNeXtXLarge",
    "DenseNet121", "DenseNet169", "DenseNet201",
    "EfficientNetB0", "EfficientNetB1", "EfficientNetB2", "EfficientNetB3", "EfficientNetB4", "EfficientNetB5",
    "EfficientNetB6", "EfficientNetB7",
    "EfficientNetV2B0", "EfficientNetV2B1", "EfficientNetV2B2", "EfficientNetV2B3", "EfficientNetV2L", "EfficientNetV2M",
    "EfficientNetV2S",
    "InceptionResNetV2", "InceptionV3",
    "MobileNet", "MobileNetV2", "MobileNetV3Large", "MobileNetV3Small",
    "NASNetLarge", "NASNetMobile",
    "ResNet50", "ResNet101", "ResNet152", "ResNet50V2", "ResNet101V2", "ResNet152V2",
    "VGG16", "VGG19", "Xception",
)


def model_of(workload: str) -> str | None:
    """``MobileNetV2`` for ``horovod-synthetic:MobileNetV2``; None for a suite workload; ValueError for a bad name or
    a model keras.applications does not have (``MODELS``)."""
    if not workload.startswith(PREFIX):
        return None
    model = workload[len(PREFIX):]
    if not _MODEL.match(model):
        raise ValueError(f"workload {workload!r}: expected {PREFIX}<a keras.applications model, e.g. ResNet50>")
    if model not in MODELS:
        near = difflib.get_close_matches(model, MODELS, n=1)
        raise ValueError(f"workload {workload!r}: keras.applications has no model {model!r}"
                         + (f" (did you mean {near[0]}?)" if near else "") + f"; expected one of {', '.join(MODELS)}")
    return model


def batch(model: str) -> int:
    return BATCH.get(model, DEFAULT_BATCH)


def parser(loop: bool) -> argparse.ArgumentParser:
    """Horovod's scripts' flags (``--num-warmup-batches`` only in the loop), plus ``--intra-op-threads`` in the loop."""
    what = "the raw horovod.tensorflow loop" if loop else "Keras fit on hvdk8s"
    p = argparse.ArgumentParser(
        description=f"Horovod's synthetic benchmark as {what}: run under mpirun; rank 0 prints img/s per rank of every "
        "timed iteration", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default="ResNet50", help="a keras.applications model")
    p.add_argument("--batch-size", type=int, default=32, help="images per rank and step")
    if loop:
        p.add_argument("--num-warmup-batches", type=int, default=10, help="untimed steps after the first")
    p.add_argument("--num-batches-per-iter", type=int, default=10, help="steps per timed iteration")
    p.add_argument("--num-iters", type=int, default=10,
                   help="timed iterations" + ("" if loop else ", the first of them the warm-up"))
    p.add_argument("--no-cuda", action="store_true", help="train on the CPU even where a GPU is visible")
    if loop:
        p.add_argument("--intra-op-threads", type=int, default=0,
                       help="TensorFlow intra-op threads per rank (0: TensorFlow's default)")
    return p


def parse_args(loop: bool, argv: list[str] | None) -> argparse.Namespace:
    """The flags, checked; with ``--no-cuda`` the GPUs are hidden here, before TensorFlow starts."""
    args = parser(loop).parse_args(argv)
    if args.no_cuda:
        os.environ["CUDA_VISIBLE_DEVICES"] = "-1"
    return args


def model_and_batch(model: str, batch_size: int) -> tuple[Any, Any, Any]:
    """The model as Horovod's scripts build it, and one random batch: images in [0, 1), labels among its 1000 classes
    (Horovod's scripts draw them below 999: the same work)."""
    import keras
    import tensorflow as tf

    try:
        net = getattr(keras.applications, model)(weights=None)
    except AttributeError:
        raise SystemExit(f"--model {model}: keras.applications has no such model (e.g. ResNet50)") from None
    images = tf.random.uniform([batch_size, *IMAGE_SHAPE])
    labels = tf.random.uniform([batch_size], minval=0, maxval=CLASSES, dtype=tf.int64)
    return net, images, labels


def header(model: str, batch_size: int, size: int, device: str) -> str:
    return f"Model: {model}, batch size {batch_size} per rank, {size} {device} rank(s)"


def iteration_line(k: int, img_per_s: float, device: str) -> str:
    return f"Iter #{k}: {img_per_s:.3f} img/sec per {device}"


def summary_lines(rates: list[float], size: int, device: str) -> list[str]:
    """Mean and 1.96 standard deviations of the timed iterations, per rank and for all ranks, as Horovod reports."""
    mean, conf = statistics.fmean(rates), 1.96 * statistics.pstdev(rates)
    return [f"Img/sec per {device}: {mean:.3f} +-{conf:.3f}",
            f"Total img/sec on {size} {device}(s): {size * mean:.3f} +-{size * conf:.3f}"]


def split_threads(cores: int, local_size: int) -> int:
    """The intra-op threads ``hvdk8s.init`` gives each of ``local_size`` CPU ranks on ``cores`` cores by default."""
    intra, _inter = thread_pools(DEFAULT_CPU_THREAD_POLICY, cores, local_size)
    return intra or cores


def script_args(which: str, model: str, batches_per_iter: int, iters: int, cores: int = 1, local_size: int = 1) -> list[str]:
    """Arguments giving every script ``iters`` timed iterations after one iteration's worth of warm-up steps;
    ``raw_split`` also gets hvdk8s's intra-op threads for ``local_size`` ranks on a host of ``cores``."""
    common = ["--model", model, "--batch-size", str(batch(model)), "--num-batches-per-iter", str(batches_per_iter),
              "--no-cuda"]
    if which == SPLIT:
        common += ["--intra-op-threads", str(split_threads(cores, local_size))]
    if which not in FIT_SCRIPTS:  # first step + (batches_per_iter - 1) warm-up batches, then ``iters`` timed
        return [*common, "--num-warmup-batches", str(batches_per_iter - 1), "--num-iters", str(iters)]
    return [*common, "--num-iters", str(iters + 1)]  # epoch 0 is its warm-up, not counted


def order(r: int, peer: bool = False, split: bool = False) -> tuple[str, ...]:
    """Which scripts round ``r`` launches, in order: the loop, with ``split`` the loop at hvdk8s's thread split, then
    ``fit`` (the loop and ``fit`` each beside Horovod's own with ``peer``), reversed every other round, so drift in
    load within a round cancels over rounds. At one rank per host the split is TensorFlow's own pool: no ``split``."""
    ours = tuple(s for s in MODULES if split or s != SPLIT)
    scripts = tuple(s for mine in ours for s in ((mine, PEER_OF[mine]) if peer and mine in PEER_OF else (mine,)))
    return scripts if r % 2 == 0 else scripts[::-1]


def script_name(which: str) -> str:
    return PEER_FILES.get(which) or MODULES[which]


def iter_rates(log: str, which: str, iters: int) -> list[float]:
    """Rank 0's img/s per rank of every timed iteration, from a launch's output; ValueError if they are not all there."""
    found = [(int(k), float(v)) for k, v in _ITER.findall(_TAG.sub("", log))]
    rates = [v for k, v in found if which not in FIT_SCRIPTS or k > 0]  # a fit script's epoch 0 is its warm-up
    if len(rates) != iters:
        raise ValueError(f"{script_name(which)}: expected {iters} timed iterations in its output, found {len(rates)}")
    return rates


def peer_sources(folder: Path) -> dict[str, str]:
    """Horovod's two scripts from ``folder`` as they run on Keras 3, by script: the raw one with ``PEER_FIXES``,
    the Keras one as ``hvdk8s migrate`` rewrites it. ValueError naming the file where one is missing, a fix does not
    apply, or migrate leaves work to do by hand."""
    texts = {}
    for which, name in PEER_FILES.items():
        try:
            texts[which] = (folder / name).read_text()
        except OSError as err:
            raise ValueError(f"synthetic_peer: cannot read Horovod's {name} in {folder} ({err.strerror or err}); "
                             "expected Horovod's examples/tensorflow2 folder") from None
    raw = texts["horovod_raw"]
    for old, new, why in PEER_FIXES:
        if raw.count(old) != 1:
            raise ValueError(f"{folder / PEER_FILES['horovod_raw']}: expected `{old}` once (to fix: {why}), found it "
                             f"{raw.count(old)} times; is it Horovod v0.28.1's script?")
        raw = raw.replace(old, new)
    try:
        from hvdk8s.migrate.codemod import migrate_source
    except ModuleNotFoundError as err:
        if err.name != "libcst":
            raise
        raise ValueError("synthetic_peer: porting Horovod's Keras script needs `hvdk8s migrate`'s libcst: "
                         "pip install 'hvdk8s[migrate]'") from None
    path = folder / PEER_FILES["horovod_keras"]
    ported = migrate_source(texts["horovod_keras"], str(path))
    if ported.manual:
        left = "; ".join(f"line {f.line}: {f.message}" for f in ported.findings if f.manual)
        raise ValueError(f"{path}: hvdk8s migrate leaves work to do by hand ({left})")
    return {"horovod_raw": raw, "horovod_keras": ported.code}
