"""Every rank runs the Checkpoint callback on its own folder: only rank 0's may fill."""
import sys
from pathlib import Path

import hvdk8s

hvdk8s.init()

import keras  # noqa: E402
import numpy as np  # noqa: E402

base = Path(sys.argv[1])
x = np.random.rand(32, 4).astype("float32")
y = (x.sum(axis=1) > 2).astype("int64")
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
model.compile(hvdk8s.DistributedOptimizer(keras.optimizers.SGD(0.1)), "sparse_categorical_crossentropy")
callbacks = hvdk8s.default_callbacks(checkpoint_dir=base / f"rank{hvdk8s.rank()}", keep_checkpoints=2)
model.fit(x, y, batch_size=8, epochs=3, callbacks=callbacks, verbose=0)

try:  # rank 0 finds that this is a checkpoint, not their folder; every rank says so, none waits
    hvdk8s.restore_latest(model, base / "rank0" / "ckpt-0003.keras")
except ValueError as err:
    print(f"refused: {err}", flush=True)
