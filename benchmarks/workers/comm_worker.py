"""Process entry point of the communication microbenchmarks.

    python -m hvdk8s.benchmarks.workers.comm_worker allreduce --job job.json --out r.json   (mpirun ranks)
    python -m hvdk8s.benchmarks.workers.comm_worker ps --job job.json --out r.json          (TF_CONFIG chief)

``allreduce`` times Horovod allreduce of one float32 tensor per message size
and, for fusion, many small tensors submitted at once (separately, as hvdk8s
does by default, or as one grouped allreduce, as its ``groups=`` asks). ``ps``
times a parameter-server step that only moves data: every worker pulls M bytes
of variables and pushes an M-byte gradient back (a bias-free dense layer on a
batch of one, plain SGD). Raw seconds per iteration are written for every
repeat; nothing is summarised here.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from hvdk8s.common import atomic


def _calibrated_iters(once: float, min_seconds: float) -> int:
    return max(1, min(10_000, math.ceil(min_seconds / max(once, 1e-6))))


def allreduce(job: dict[str, Any]) -> dict[str, Any]:
    import horovod.tensorflow as hvd
    import tensorflow as tf

    from hvdk8s.runtime import set_threads

    hvd.init()
    set_threads(int(job["threads"]))
    barrier_t = tf.zeros([1])

    def barrier() -> None:
        hvd.allreduce(barrier_t, op=hvd.Sum, name="barrier").numpy()

    def timed(fn: Any, args: tuple, tag: str) -> dict[str, Any]:
        fn(*args)  # trace and warm up the fusion buffer
        start = time.perf_counter()
        fn(*args)
        iters = hvd.broadcast_object(_calibrated_iters(time.perf_counter() - start, job["min_seconds"]), 0, name=f"it.{tag}")
        per_iter = []
        for _ in range(int(job["repeats"])):
            barrier()
            start = time.perf_counter()
            for _ in range(iters):
                fn(*args)
            per_iter.append((time.perf_counter() - start) / iters)
        return {"iters": iters, "seconds_per_iter": per_iter}

    sweep = []
    for size in job["sizes"]:
        tensor = tf.ones([size // 4], tf.float32)
        fn = tf.function(lambda t, _s=size: hvd.allreduce(t, op=hvd.Sum, name=f"sweep.{_s}"))
        sweep.append({"bytes": int(size), **timed(fn, (tensor,), f"s{size}")})
    fusion = []
    for nbytes in job["fusion_tensor_bytes"]:
        tensors = [tf.ones([nbytes // 4], tf.float32) for _ in range(job["fusion_tensors"])]
        separate = tf.function(
            lambda ts, _b=nbytes: [hvd.allreduce(t, op=hvd.Sum, name=f"sep.{_b}.{i}") for i, t in enumerate(ts)]
        )
        grouped = tf.function(lambda ts, _b=nbytes: hvd.grouped_allreduce(ts, op=hvd.Sum, name=f"grp.{_b}"))
        for mode, fn in (("separate", separate), ("grouped", grouped)):
            fusion.append(
                {"tensors": len(tensors), "tensor_bytes": int(nbytes), "mode": mode, **timed(fn, (tensors,), f"{mode}{nbytes}")}
            )
    return {
        "ranks": hvd.size(),
        "fusion_threshold": os.environ.get("HOROVOD_FUSION_THRESHOLD", "default (128 MiB)"),
        "controller": "mpi" if hvd.mpi_enabled() else "gloo",
        "sweep": sweep,
        "fusion": fusion,
        "rank0": hvd.rank() == 0,
    }


def ps(job: dict[str, Any]) -> dict[str, Any]:
    import keras
    import tensorflow as tf

    from hvdk8s.runtime import set_threads

    set_threads(int(job["threads"]))
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    spec = resolver.cluster_spec().as_dict()
    workers, servers = len(spec["worker"]), len(spec["ps"])
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    out = []
    for size in job["sizes"]:
        # ``servers`` equal layers, so variables split evenly across the PS tasks (round-robin placement).
        width = max(1, int(math.sqrt(size / 4 / servers)))
        with strategy.scope():
            layers = [keras.layers.Dense(width, use_bias=False) for _ in range(servers)]
            for layer in layers:
                layer.build((1, width))
            opt = keras.optimizers.SGD(1e-6)
            variables = [layer.kernel for layer in layers]
            opt.build(variables)
        x = tf.ones([1, width])

        @tf.function
        def step() -> tf.Tensor:
            def replica() -> tf.Tensor:
                with tf.GradientTape() as tape:
                    loss = tf.add_n([tf.reduce_sum(layer(x)) for layer in layers])
                opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
                return loss

            return strategy.run(replica)

        def rounds(n: int) -> None:
            for _ in range(n * workers):
                coordinator.schedule(step)
            coordinator.join()

        rounds(2)
        per_round = []
        for _ in range(int(job["repeats"])):
            start = time.perf_counter()
            rounds(int(job["steps"]))
            per_round.append((time.perf_counter() - start) / int(job["steps"]))
        out.append({"bytes": int(width * width * 4 * servers), "seconds_per_round": per_round})
    return {"workers": workers, "servers": servers, "sizes": out, "rank0": True}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=("allreduce", "ps"))
    p.add_argument("--job", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--server", action="store_true", help="TF cluster task that only serves")
    args = p.parse_args(argv)
    job = json.loads(args.job.read_text())
    if args.server:
        from .worker import serve

        serve(int(job["threads"]))
        return 0
    result = allreduce(job) if args.mode == "allreduce" else ps(job)
    if result.pop("rank0"):
        atomic.write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
