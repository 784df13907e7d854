"""Interleaved A/B of ``LeanTrainFunction``'s per-step dispatch: every call through the ``tf.function`` (before)
against direct calls of the concrete step after an iterator's first call (after), on one model in one process.

    .venv/bin/python benchmarks/reports/step/dispatch_ab.py --rounds 10 --steps 200

The same installed ``train_function`` runs both ways on one iterator, windows alternating (the order reversed
every other round); prints the median ms per step of each and the per-round ratios (before / after).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="cnn", help="an hvdk8s.models name")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--steps", type=int, default=200, help="steps per window")
    args = p.parse_args()

    import keras
    import tensorflow as tf

    import hvdk8s as hvd

    hvd.init(quiet=True)
    model = getattr(hvd.models, args.model)(args.model, input_shape=(8, 8, 1), seed=3)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01, momentum=0.9)),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    x = tf.random.uniform([args.batch, 8, 8, 1])
    y = tf.random.uniform([args.batch], maxval=10, dtype=tf.int64)
    data = tf.data.Dataset.from_tensors((x, y)).repeat()
    model.fit(data, steps_per_epoch=2, epochs=1, verbose=0, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    lean, iterator = model.train_function, iter(data)
    ways = {"before": lambda: lean.step(iterator), "after": lambda: lean(iterator)}
    times: dict[str, list[float]] = {k: [] for k in ways}
    for r in range(args.rounds + 1):
        for name in ways if r % 2 == 0 else list(ways)[::-1]:
            start = time.perf_counter()
            for _ in range(args.steps):
                logs = ways[name]()
            float(logs["loss"])
            if r:  # round 0 warms up
                times[name].append((time.perf_counter() - start) / args.steps * 1e3)
    ratios = [b / a for b, a in zip(times["before"], times["after"])]
    if hvd.rank() == 0:
        print("DISPATCH " + json.dumps({
            "model": args.model, "size": hvd.size(),
            "ms_per_step": {k: statistics.median(v) for k, v in times.items()},
            "before_over_after": [statistics.median(ratios), min(ratios), max(ratios)],
        }), flush=True)


if __name__ == "__main__":
    main()
