"""The gradient reduction alone, interleaved in one process: hvdk8s's ``reduce_gradients`` against Horovod's
``DistributedGradientTape`` reduction (``_make_allreduce_grads_fn``, what the raw loop runs) and no reduction.

    .venv/bin/hvdk8s run -np 2 benchmarks/reports/step/reduce_cost.py --model ResNet50 --rounds 9

Fixed random gradients shaped like the model's; each is a ``tf.function`` of the reduction only. Rank 0 prints the
median wall-clock and process-CPU ms per call of each.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="ResNet50")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--calls", type=int, default=5, help="calls per window")
    args = p.parse_args()

    import horovod.tensorflow as hvd_tf
    import keras
    import tensorflow as tf

    import hvdk8s as hvd
    from hvdk8s import collectives

    hvd.init(quiet=True)
    model = getattr(keras.applications, args.model)(weights=None)
    grads = [tf.random.normal(v.shape) for v in model.trainable_variables]
    variables = [v.value for v in model.trainable_variables]
    reduction = collectives.GradientReduction.create(name="bench")
    tape_reduce = hvd_tf._make_allreduce_grads_fn("DGT", "", "", hvd_tf.Compression.none, False, hvd_tf.Average,
                                                  1.0, None, hvd_tf.global_process_set)
    fns = {
        "none": tf.function(lambda: [tf.identity(g) for g in grads]),
        "hvdk8s": tf.function(lambda: collectives.reduce_gradients(reduction, grads, variables)),
        "horovod": tf.function(lambda: tape_reduce(grads, variables)),
    }
    for fn in fns.values():
        fn()
    wall: dict[str, list[float]] = {k: [] for k in fns}
    cpu: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(args.rounds):
        for name in fns if r % 2 == 0 else list(fns)[::-1]:
            start, start_cpu = time.perf_counter(), time.process_time()
            for _ in range(args.calls):
                fns[name]()
            wall[name].append((time.perf_counter() - start) / args.calls * 1e3)
            cpu[name].append((time.process_time() - start_cpu) / args.calls * 1e3)
    if hvd.rank() == 0:
        print("REDUCE " + json.dumps({"model": args.model, "size": hvd.size(),
                                      "ms_wall": {k: statistics.median(v) for k, v in wall.items()},
                                      "ms_cpu": {k: statistics.median(v) for k, v in cpu.items()}}), flush=True)


if __name__ == "__main__":
    main()
