"""A small 2-rank training run that tests/test_observability.py scrapes.

Trains with the observability callbacks, writes ``ready.<rank>.json`` (bound
port, pid, History) into OUT, then keeps the process (and so its metrics
endpoint) alive until the test creates ``OUT/release``.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import hvdk8s

hvdk8s.init()

import keras  # noqa: E402
import numpy as np  # noqa: E402

from hvdk8s.observe import metrics  # noqa: E402
from hvdk8s.observe.observability import observability_callbacks  # noqa: E402

SAMPLES, BATCH = 256, 16  # 128 per rank: 8 steps per epoch


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--tensorboard", type=Path)
    args = p.parse_args()

    rng = np.random.default_rng(0)
    x = rng.normal(size=(SAMPLES, 8)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("int32")
    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2, activation="softmax")]
    )
    optimizer = hvdk8s.DistributedOptimizer(keras.optimizers.SGD(0.05))
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
    # Spelled out rather than hvdk8s.default_callbacks() so the test does not depend on its defaults.
    metric_average = hvdk8s.callbacks.MetricAverageCallback()
    callbacks = [
        hvdk8s.callbacks.BroadcastGlobalVariablesCallback(0),
        metric_average,
        *observability_callbacks(tensorboard_dir=args.tensorboard, metric_average=metric_average),
    ]
    history = model.fit(hvdk8s.data.from_arrays(x, y, BATCH), epochs=args.epochs, callbacks=callbacks, verbose=0)

    ready = {"rank": hvdk8s.rank(), "port": metrics.exporter().port, "pid": os.getpid(), "history": history.history}
    tmp = args.out / f".ready.{hvdk8s.rank()}.tmp"
    tmp.write_text(json.dumps(ready))
    tmp.replace(args.out / f"ready.{hvdk8s.rank()}.json")
    deadline = time.monotonic() + 120
    while not (args.out / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.1)


if __name__ == "__main__":
    main()
