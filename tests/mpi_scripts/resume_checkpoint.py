"""A Horovod Keras 2 script that resumes from its latest checkpoint (tests/test_resume_h5.py migrates a copy).

Its checkpoint path is an argparse default ending in .h5, as Horovod's ImageNet example keeps it: rank 0 saves
one per epoch with ModelCheckpoint; on a restart rank 0 looks for the newest, loads it with hvd.load_model and
broadcasts the epoch to resume from. Prints, per rank, the epoch it resumed from, the epochs it trained, its
optimizer's step count and a checksum of its weights.
"""
import argparse
import os

import horovod.tensorflow.keras as hvd
import keras
import numpy as np
from sklearn.datasets import load_digits

parser = argparse.ArgumentParser(description="resume from the latest checkpoint")
parser.add_argument("--checkpoint-format", default="./checkpoint-{epoch}.h5", help="checkpoint file format")
parser.add_argument("--epochs", type=int, default=3, help="train up to this epoch")
args = parser.parse_args()

hvd.init()

resume_from_epoch = 0
if hvd.rank() == 0:  # only rank 0 saves checkpoints, so only rank 0 looks for them
    for try_epoch in range(args.epochs, 0, -1):
        if os.path.exists(args.checkpoint_format.format(epoch=try_epoch)):
            resume_from_epoch = try_epoch
            break
resume_from_epoch = int(hvd.broadcast(resume_from_epoch, 0, name="resume_from_epoch"))
print("resume_from_epoch", resume_from_epoch, flush=True)

digits = load_digits()
x = (digits.data / 16.0).astype("float32")[hvd.rank() :: hvd.size()]
y = digits.target.astype("int64")[hvd.rank() :: hvd.size()]

if resume_from_epoch > 0 and hvd.rank() == 0:
    model = hvd.load_model(args.checkpoint_format.format(epoch=resume_from_epoch))
else:
    # a Sequential: loaded, its variables are named dense/kernel, built, sequential/dense/kernel
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    opt = keras.optimizers.SGD(lr=0.05 * hvd.size(), momentum=0.9)
    model.compile(loss="sparse_categorical_crossentropy", optimizer=hvd.DistributedOptimizer(opt),
                  metrics=["accuracy"])

callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback()]
if hvd.rank() == 0:
    callbacks.append(keras.callbacks.ModelCheckpoint(args.checkpoint_format))

history = model.fit(x, y, batch_size=32, steps_per_epoch=8, epochs=args.epochs, initial_epoch=resume_from_epoch,
                    callbacks=callbacks, verbose=2 if hvd.rank() == 0 else 0)
checksum = float(sum(np.sum(w, dtype="float64") for w in model.get_weights()))
print("trained", history.epoch, "iterations", int(model.optimizer.iterations), "checksum", repr(checksum), flush=True)
