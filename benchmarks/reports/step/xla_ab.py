"""Whether XLA would make the CPU step do less work: one ``keras.applications`` training step, plain ``tf.function``
against ``tf.function(jit_compile=True)``, in alternating windows of one process at one intra-op thread.

    .venv/bin/python benchmarks/reports/step/xla_ab.py --model MobileNetV2 --batch 8

No Horovod: XLA cannot compile Horovod's collectives, so hvdk8s could only compile the gradient computation apart
from the reduction; this measures whether that part gains at all on CPU. Prints seconds per step of every window
and the plain / XLA ratio per round (> 1: XLA faster).
"""
from __future__ import annotations

import argparse
import time

import keras
import tensorflow as tf


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="MobileNetV2")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=3, help="steps per window")
    p.add_argument("--rounds", type=int, default=6)
    args = p.parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(1)  # a CPU rank's share at N=2 on this 2-core machine
    model = getattr(keras.applications, args.model)(weights=None)
    optimizer = keras.optimizers.SGD(0.01)
    loss_fn = keras.losses.SparseCategoricalCrossentropy()
    x = tf.random.uniform((args.batch, 224, 224, 3))
    y = tf.random.uniform((args.batch, 1), maxval=999, dtype=tf.int64)

    def step() -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
        return loss

    variants = {"plain": tf.function(step), "xla": tf.function(step, jit_compile=True)}
    for fn in variants.values():  # trace and compile, then one warm step
        fn(), fn()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(args.rounds):
        for name in list(variants)[:: 1 if r % 2 == 0 else -1]:
            start = time.perf_counter()
            for _ in range(args.steps):
                variants[name]().numpy()
            times[name].append((time.perf_counter() - start) / args.steps)
    for name, values in times.items():
        print(name, " ".join(f"{v:.3f}" for v in values))
    print("plain/xla per round", " ".join(f"{a / b:.3f}" for a, b in zip(times["plain"], times["xla"])))


if __name__ == "__main__":
    main()
