"""Horovod's synthetic benchmark as a raw ``horovod.tensorflow`` loop on Keras 3 (the benchmark: ``synthetic``).

    mpirun -np 2 python -m hvdk8s.benchmarks.workers.synthetic_loop --model ResNet50 --batch-size 32

The loop a careful user writes: one ``tf.function`` step with ``hvd.DistributedGradientTape``, given the Keras
variables' ``tf.Variable`` values (the tape keys gradients by ``Variable.ref()``, which Keras 3 variables lack);
rank 0's model and optimizer variables broadcast after the first step, when the optimizer's exist. The loss is the
batch mean (Horovod's script differentiates the per-example losses, their sum: the same work). TensorFlow keeps its
own thread pools unless ``--intra-op-threads`` says otherwise. Timed as Horovod's script times it: ``timeit``
(garbage collection paused) around each iteration's steps.
"""
from __future__ import annotations

import timeit

import horovod.tensorflow as hvd
import keras
import tensorflow as tf

from ..config import synthetic


def main(argv: list[str] | None = None) -> None:
    args = synthetic.parse_args(True, argv)
    if args.intra_op_threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.intra_op_threads)
    hvd.init()
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:  # one GPU per rank, at its local rank, as Horovod pins them
        tf.config.experimental.set_memory_growth(gpus[hvd.local_rank()], True)
        tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")
    device = "GPU" if gpus else "CPU"
    model, images, labels = synthetic.model_and_batch(args.model, args.batch_size)
    opt = keras.optimizers.SGD(synthetic.LEARNING_RATE)
    trainable = [v.value for v in model.trainable_variables]

    @tf.function
    def step() -> None:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(labels, model(images, training=True)))
        gradients = hvd.DistributedGradientTape(tape).gradient(loss, trainable)
        opt.apply_gradients(zip(gradients, model.trainable_variables))

    chief = hvd.rank() == 0
    if chief:
        print(synthetic.header(args.model, args.batch_size, hvd.size(), device), flush=True)
    step()
    hvd.broadcast_variables([v.value for v in model.variables + opt.variables], root_rank=0)
    timeit.timeit(step, number=args.num_warmup_batches)
    rates = []
    for k in range(args.num_iters):
        seconds = timeit.timeit(step, number=args.num_batches_per_iter)
        rates.append(args.batch_size * args.num_batches_per_iter / seconds)
        if chief:
            print(synthetic.iteration_line(k, rates[-1], device), flush=True)
    if chief:
        print("\n".join(synthetic.summary_lines(rates, hvd.size(), device)), flush=True)


if __name__ == "__main__":
    main()
