"""Horovod's synthetic benchmark as Keras ``fit`` on hvdk8s (the benchmark: ``synthetic``).

    mpirun -np 2 python -m hvdk8s.benchmarks.workers.synthetic_fit --model ResNet50 --batch-size 32

A Horovod Keras script on hvdk8s: ``hvd.init()`` (its CPU thread policy applies), the optimizer wrapped in
``hvd.DistributedOptimizer``, Horovod's broadcast and metric-average callbacks. Each epoch is one iteration of
``--num-batches-per-iter`` steps, timed by a callback on rank 0; the first epoch is the warm-up (printed as
``Iter #0``, not counted).
"""
from __future__ import annotations

import time

import keras
import tensorflow as tf

import hvdk8s as hvd

from ..config import synthetic


class IterationTimer(keras.callbacks.Callback):
    """img/s per rank of every epoch, printed as it ends; the summary of all but the first when training ends."""

    def __init__(self, images_per_epoch: int, size: int, device: str) -> None:
        super().__init__()
        self.images_per_epoch, self.size, self.device = images_per_epoch, size, device
        self.rates: list[float] = []

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.start = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        rate = self.images_per_epoch / (time.perf_counter() - self.start)
        print(synthetic.iteration_line(epoch, rate, self.device), flush=True)
        if epoch > 0:
            self.rates.append(rate)

    def on_train_end(self, logs: dict | None = None) -> None:
        if self.rates:
            print("\n".join(synthetic.summary_lines(self.rates, self.size, self.device)), flush=True)


def main(argv: list[str] | None = None) -> None:
    args = synthetic.parse_args(False, argv)
    hvd.init()
    device = "GPU" if tf.config.list_logical_devices("GPU") else "CPU"
    model, images, labels = synthetic.model_and_batch(args.model, args.batch_size)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(synthetic.LEARNING_RATE)),
                  loss="sparse_categorical_crossentropy")
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback()]
    if hvd.rank() == 0:
        print(synthetic.header(args.model, args.batch_size, hvd.size(), device), flush=True)
        callbacks.append(IterationTimer(args.batch_size * args.num_batches_per_iter, hvd.size(), device))
    data = tf.data.Dataset.from_tensors((images, labels)).repeat()
    model.fit(data, steps_per_epoch=args.num_batches_per_iter, epochs=args.num_iters, verbose=0, callbacks=callbacks)


if __name__ == "__main__":
    main()
