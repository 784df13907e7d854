"""Train a fixed model on fixed data, once per case; each rank saves each case's final weights.

Run with N ranks and per-rank batch B, or 1 rank and batch N×B: with SGD and
averaged gradients both must end at the same weights. One launch runs several
cases one after another (``OUT 'NAME --batch 8 ...' ...``), each from its own
seed, model and optimizer, so that a test module pays TensorFlow's and
Horovod's start-up once per rank count, not once per case.
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import hvdk8s

hvdk8s.init()

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, required=True)
p.add_argument("--steps", type=int, default=6)
p.add_argument("--passes", type=int, default=1, help="backward_passes_per_step")
p.add_argument("--mode", choices=["fit", "tape"], default="fit")
p.add_argument("--steps-per-execution", type=int, default=1, help="Keras compile(steps_per_execution=...)")
p.add_argument("--seed-per-rank", action="store_true", help="different initial weights on each rank")


def train(args: argparse.Namespace) -> tuple[list[np.ndarray], int, list[np.ndarray]]:
    """One case's final weights, the optimizer's step count and the seeded initial weights (before any broadcast)."""
    seed = 7 + (hvdk8s.rank() if args.seed_per_rank else 0)
    keras.utils.set_random_seed(seed)
    (x, y), _ = hvdk8s.data.load_digits(image_size=12)
    global_batch = args.batch * hvdk8s.size()
    n = global_batch * args.steps
    data = hvdk8s.data.from_arrays(x[:n], y[:n], args.batch, shuffle=False)

    model = keras.Sequential([
        keras.Input((12, 12, 1)),
        keras.layers.Conv2D(4, 3, activation="tanh", kernel_initializer=keras.initializers.GlorotUniform(seed)),
        keras.layers.Flatten(),
        keras.layers.Dense(10, activation="softmax", kernel_initializer=keras.initializers.GlorotUniform(seed + 1)),
    ])
    initial = model.get_weights()
    loss_fn = keras.losses.SparseCategoricalCrossentropy()

    if args.mode == "fit":
        opt = hvdk8s.DistributedOptimizer(
            keras.optimizers.SGD(0.5), backward_passes_per_step=args.passes, average_aggregated_gradients=True
        )
        model.compile(optimizer=opt, loss=loss_fn, steps_per_execution=args.steps_per_execution)
        model.fit(data, epochs=1, callbacks=hvdk8s.default_callbacks(), verbose=0)
        return model.get_weights(), int(opt.iterations.numpy()), initial
    opt = keras.optimizers.SGD(0.5)
    opt.build(model.trainable_variables)
    hvdk8s.collectives.broadcast_variables(model.variables)

    @tf.function
    def step(xb: tf.Tensor, yb: tf.Tensor) -> None:
        with hvdk8s.DistributedGradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply(grads, model.trainable_variables)

    for xb, yb in data:
        step(xb, yb)
    return model.get_weights(), int(opt.iterations.numpy()), initial


out = Path(sys.argv[1])
for case in sys.argv[2:]:
    name, *flags = shlex.split(case)
    weights, iterations, initial = train(p.parse_args(flags))
    (out / name).mkdir(parents=True, exist_ok=True)
    np.savez(out / name / f"rank{hvdk8s.rank()}.npz", *weights, iterations=iterations)
    np.savez(out / name / f"rank{hvdk8s.rank()}.initial.npz", *initial)
