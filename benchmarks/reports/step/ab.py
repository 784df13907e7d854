"""Interleaved, in-process A/B of one training step: hvdk8s ``fit`` against the raw Horovod loop at equal threads.

    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
      mpirun -np 2 .venv/bin/python benchmarks/reports/step/ab.py --model ResNet50 --batch 4

Every variant trains its own copy of the same ``keras.applications`` model on the same batch, in the same process,
so the thread pools are equal by construction. Windows of ``--steps`` steps rotate through the variants (the order
reversed every other round), and each variant's time is reported as a ratio to the raw loop's window in the same
round, so drift in machine load cancels. Variants:

* ``raw``: Horovod's synthetic loop (``DistributedGradientTape`` around a ``GradientTape``, Keras SGD);
* ``opt``: the same ``tf.function`` step with ``hvdk8s.DistributedOptimizer`` instead of the tape (the reduction
  and update path alone, without Keras's ``train_step``);
* ``step``: the model's ``train_function`` as ``fit`` calls it (``hvdk8s.train.fit_step``), on a dataset iterator;
* ``fit``: one ``model.fit`` with Horovod's broadcast and metric-average callbacks, each epoch of ``--steps`` steps
  timed from its begin to its end as ``synthetic_fit`` times it (the per-step and per-epoch Python of ``fit`` and
  the callbacks on top of ``step``); the other variants' windows run between its epochs.

Rank 0 prints one JSON line: wall-clock and process CPU seconds per step of every window, by variant.
"""
from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

VARIANTS = ("raw", "opt", "step", "fit")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="ResNet50")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=3, help="steps per window")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--variants", default=",".join(VARIANTS))
    args = p.parse_args()

    import horovod.tensorflow as hvd_tf
    import keras
    import tensorflow as tf

    import hvdk8s as hvd

    hvd.init(quiet=True)
    variants = args.variants.split(",")
    images = tf.random.uniform([args.batch, 224, 224, 3], seed=hvd.rank())
    labels = tf.random.uniform([args.batch], maxval=1000, dtype=tf.int64, seed=hvd.rank())

    def build() -> Any:
        keras.utils.set_random_seed(1)
        return getattr(keras.applications, args.model)(weights=None)

    def loss_of(model: Any) -> tf.Tensor:
        return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(labels, model(images, training=True)))

    fns: dict[str, Callable[[int], None]] = {}
    if "raw" in variants:
        raw_model, raw_opt = build(), keras.optimizers.SGD(0.01)
        raw_vars = [v.value for v in raw_model.trainable_variables]

        @tf.function
        def raw_step() -> None:
            with tf.GradientTape() as tape:
                loss = loss_of(raw_model)
            grads = hvd_tf.DistributedGradientTape(tape).gradient(loss, raw_vars)
            raw_opt.apply_gradients(zip(grads, raw_model.trainable_variables))

        fns["raw"] = lambda n: [raw_step() for _ in range(n)] and None
    if "opt" in variants:
        opt_model, opt_opt = build(), hvd.DistributedOptimizer(keras.optimizers.SGD(0.01))

        @tf.function
        def opt_step() -> None:
            with tf.GradientTape() as tape:
                loss = loss_of(opt_model)
            grads = tape.gradient(loss, opt_model.trainable_variables)
            opt_opt.apply_gradients(zip(grads, opt_model.trainable_variables))

        fns["opt"] = lambda n: [opt_step() for _ in range(n)] and None
    data = tf.data.Dataset.from_tensors((images, labels)).repeat()
    if "step" in variants:
        step_model = build()
        step_model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)),
                           loss="sparse_categorical_crossentropy")
        # fit with Horovod's callbacks installs the train_function it calls per step (hvdk8s.train.fit_step)
        step_model.fit(data, steps_per_epoch=1, epochs=1, verbose=0,
                       callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
        step_it = iter(data)

        def run_step(n: int) -> None:
            for _ in range(n):
                logs = step_model.train_function(step_it)
            tf.nest.map_structure(lambda t: t.numpy(), logs)

        fns["step"] = run_step
    if "fit" in variants:
        fit_model = build()
        fit_model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)),
                          loss="sparse_categorical_crossentropy")
    times: dict[str, list[float]] = {v: [] for v in variants}
    cpu: dict[str, list[float]] = {v: [] for v in variants}

    def window(name: str, run: Callable[[], None]) -> None:
        start, start_cpu = time.perf_counter(), time.process_time()
        run()
        times[name].append((time.perf_counter() - start) / args.steps)
        cpu[name].append((time.process_time() - start_cpu) / args.steps)

    others = [v for v in variants if v != "fit"]
    for name in others:  # trace and warm up
        fns[name](2)
    if "fit" not in variants:
        for r in range(args.rounds):
            for name in others if r % 2 == 0 else others[::-1]:
                window(name, lambda: fns[name](args.steps))
    else:
        class Rotation(keras.callbacks.Callback):
            """Times each epoch as synthetic_fit does (begin to end, after Horovod's callbacks); between epochs
            runs one window of every other variant, before or after the next epoch in alternate rounds."""

            def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
                if epoch > 0 and epoch % 2 == 0:
                    for name in others:
                        window(name, lambda: fns[name](args.steps))
                self.start, self.start_cpu = time.perf_counter(), time.process_time()

            def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
                if epoch > 0:  # epoch 0 traces and warms up
                    times["fit"].append((time.perf_counter() - self.start) / args.steps)
                    cpu["fit"].append((time.process_time() - self.start_cpu) / args.steps)
                if epoch % 2 == 1:
                    for name in others[::-1]:
                        window(name, lambda: fns[name](args.steps))

        callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback(),
                     Rotation()]
        fit_model.fit(data, steps_per_epoch=args.steps, epochs=args.rounds + 1, verbose=0, callbacks=callbacks)
    if hvd.rank() == 0:
        print("AB " + json.dumps({"model": args.model, "batch": args.batch, "size": hvd.size(), "times": times,
                                  "cpu": cpu}), flush=True)


if __name__ == "__main__":
    main()
