"""Numerical checks of the collectives on a real multi-rank job; writes JSON per rank."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import hvdk8s

hvdk8s.init()

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

out = Path(sys.argv[1])
rank, size = hvdk8s.rank(), hvdk8s.size()
result: dict = {"rank": rank, "size": size}

# Metric averaging, called directly: values differ per rank.
logs = {"loss": float(rank), "accuracy": 10.0 * rank, "note": "text stays"}
hvdk8s.callbacks.MetricAverageCallback().on_epoch_end(0, logs)
result["direct_average"] = logs

# fp16 compression through the optimizer: SGD(lr=1) on v=0 with gradient g_rank.
# 1 + 1e-4 * (rank + 1) is not representable in fp16, so the compressed mean
# differs from the exact one; both are recorded for the test to compare.
for compression in ("none", "fp16"):
    v = keras.Variable(np.zeros(3, "float32"))
    opt = hvdk8s.DistributedOptimizer(keras.optimizers.SGD(1.0), compression=compression)
    opt.build([v])
    grad = tf.constant(np.full(3, 1.0 + 1e-4 * (rank + 1), "float32"))
    opt.apply([grad], [v])
    result[f"update_{compression}"] = (-v.numpy()).tolist()

# Sum instead of Average.
v = keras.Variable(np.zeros(2, "float32"))
opt = hvdk8s.DistributedOptimizer(keras.optimizers.SGD(1.0), op=hvdk8s.Sum)
opt.build([v])
opt.apply([tf.constant([1.0, float(rank)])], [v])
result["update_sum"] = (-v.numpy()).tolist()


# Inside fit: logs averaged over ranks (History sees means of per-rank values).
class Record(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.raw: list[dict] = []

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.raw.append({k: float(v) for k, v in logs.items()})


keras.utils.set_random_seed(rank)  # different data per rank → different local metrics
x = np.random.rand(64, 4).astype("float32")
y = (x.sum(axis=1) > 2).astype("int64")
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
model.compile(hvdk8s.DistributedOptimizer(keras.optimizers.SGD(0.1)), "sparse_categorical_crossentropy", metrics=["accuracy"])
raw = Record()
callbacks = [hvdk8s.callbacks.BroadcastGlobalVariablesCallback(0), raw, hvdk8s.callbacks.MetricAverageCallback()]
history = model.fit(x, y, batch_size=16, epochs=4, callbacks=callbacks, verbose=0, shuffle=False)
result["raw_logs"] = raw.raw
result["history"] = {k: [float(v) for v in vals] for k, vals in history.history.items()}
result["weights"] = [w.tolist() for w in model.get_weights()]

out.mkdir(parents=True, exist_ok=True)
(out / f"rank{rank}.json").write_text(json.dumps(result))
