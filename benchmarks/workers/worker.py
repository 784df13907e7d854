"""Process entry point of the training benchmarks: one process of one strategy.

    python -m hvdk8s.benchmarks.workers.worker --strategy S --job job.json --out result.json

Started by ``launch`` as a single process, as mpirun ranks (hvdk8s, horovod)
or as the tasks of a TF_CONFIG cluster (tf_mwms workers; tf_ps chief, with
``--server`` for its workers and parameter servers). The chief times every
workload, then time to accuracy, and writes the raw timings as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from hvdk8s.common import atomic

from ..config.settings import HVDK8S_STRATEGIES, PAIRED_STRATEGIES, RAW_LOOP_STRATEGIES, STEPS_PER_EXECUTION, Settings


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--strategy", required=True)
    p.add_argument("--job", type=Path, required=True, help="JSON: settings, workloads, tta, seed")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--server", action="store_true", help="TF cluster task that only serves (ps, PS workers)")
    p.add_argument("--profile", action="store_true", help="per-phase breakdown and timeline instead of throughput (hvdk8s)")
    return p.parse_args(argv)


def serve(threads: int) -> None:
    """A TF_CONFIG task that hosts variables or runs scheduled steps until it is killed."""
    import tensorflow as tf

    from hvdk8s.runtime import set_threads

    set_threads(threads)
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(
        resolver.cluster_spec(), job_name=resolver.task_type, task_index=resolver.task_id, protocol="grpc", start=True
    )
    server.join()


def split_threads(local_size: int) -> None:
    """hvdk8s's default CPU thread policy (``hvdk8s.threads``), applied to a raw-loop process as a user would with
    ``tf.config.threading``; like ``hvdk8s.init``, only where there is no GPU."""
    from hvdk8s.runtime import _set_pools
    from hvdk8s.threads import DEFAULT_CPU_THREAD_POLICY, thread_pools

    _set_pools(*thread_pools(DEFAULT_CPU_THREAD_POLICY, os.cpu_count() or 1, local_size))


class Runtime:
    """Strategy-level set-up done once per process, before any model exists."""

    def __init__(self, strategy: str, threads: int | None) -> None:
        """``threads`` None: no thread count (a thread-policy knob: ``hvdk8s.init``'s policy; the raw loop's
        ``THREAD_STRATEGIES``: TensorFlow's defaults, or hvdk8s's split for ``horovod_split``)."""
        self.name = strategy
        self.strategy: Any = None
        self.coordinator: Any = None
        self.workers, self.chief = 1, True
        if strategy in HVDK8S_STRATEGIES:
            import hvdk8s

            hvdk8s.init(threads_per_rank=threads)
            self.workers, self.chief = hvdk8s.size(), hvdk8s.is_chief()
            return
        from hvdk8s.runtime import set_threads

        if threads:
            set_threads(threads)
        import tensorflow as tf

        if strategy in RAW_LOOP_STRATEGIES:
            import horovod.tensorflow as hvd

            hvd.init()
            self.workers, self.chief = hvd.size(), hvd.rank() == 0
            if strategy == "horovod_split" and not tf.config.list_physical_devices("GPU"):
                split_threads(hvd.local_size())
        elif strategy == "tf_mwms":
            ring = tf.distribute.experimental.CommunicationOptions(
                implementation=tf.distribute.experimental.CommunicationImplementation.RING
            )
            self.strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=ring)
            self.workers = self.strategy.num_replicas_in_sync
            # without TF_CONFIG (a one-task TFJob's pod) one local worker, task None: its own chief, as TensorFlow's is_chief
            self.chief = self.strategy.cluster_resolver.task_id in (None, 0)
        elif strategy == "tf_ps":
            resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
            self.strategy = tf.distribute.ParameterServerStrategy(resolver)
            self.coordinator = tf.distribute.coordinator.ClusterCoordinator(self.strategy)
            self.workers = len(resolver.cluster_spec().as_dict()["worker"])
        elif strategy != "single":
            raise ValueError(f"strategy {strategy!r}: unknown")

    def trainer(self, model_fn: Any, dataset_fn: Any, lr: float, batch: int, name: str | None = None) -> Any:
        """This runtime's trainer; ``name="horovod"`` in an hvdk8s process gives the raw loop on the same ranks."""
        from . import trainers

        name = name or self.name
        if name == "single" or name in HVDK8S_STRATEGIES:
            return trainers.KerasFitTrainer(model_fn, dataset_fn, lr, use_hvdk8s=name != "single",
                                            fp16=name == "hvdk8s_fp16", steps_per_execution=STEPS_PER_EXECUTION.get(name, 1))
        if name in RAW_LOOP_STRATEGIES:
            return trainers.HorovodLoopTrainer(model_fn, dataset_fn, lr)
        if name == "tf_mwms":
            return trainers.MirroredTrainer(self.strategy, model_fn, dataset_fn, lr, batch)
        return trainers.ParameterServerTrainer(self.strategy, self.coordinator, self.workers, model_fn, dataset_fn, lr)

    @property
    def synchronous(self) -> bool:
        return self.name != "tf_ps"

    def finish(self) -> None:
        """Hold MultiWorkerMirrored workers until all are done: one that exits first makes the
        others' coordination service report it as failed."""
        if self.name == "tf_mwms":
            import tensorflow as tf

            self.strategy.reduce(tf.distribute.ReduceOp.SUM, self.strategy.run(lambda: tf.constant(1.0)), axis=None)


def throughput(rt: Runtime, s: Settings, workload_name: str, seed: int) -> dict[str, Any]:
    """Windows of one workload; hvdk8s's alternate with a raw Horovod loop's in the same process.

    ``s.models`` fresh models (and raw loops) in turn, each warmed up and timed for
    ``s.windows`` windows, all windows pooled: the same model built twice in one
    process can run a few percent apart for its whole life, so one build per
    launch would carry that into the launch's figures.
    """
    from . import trainers, workloads

    wl = s.workload(workload_name)

    def make(name: str) -> Any:
        return rt.trainer(
            lambda: workloads.build_model(wl, seed),
            lambda rank, size, _seed: workloads.synthetic_dataset(wl, wl.batch_per_rank, seed + rank),
            0.001,
            wl.batch_per_rank,
            name=name,
        )

    windows: list[float] = []
    raw_windows: list[float] = []
    for _ in range(s.models):
        trainer = make(rt.name)
        paired = trainers.Alternate(make("horovod"), s.warmup_steps, s.steps) if rt.name in PAIRED_STRATEGIES else None
        windows += trainer.timed(s.warmup_steps, s.steps, s.windows, paired)
        raw_windows += paired.windows if paired else []
    params = int(sum(int(v.numpy().size) for v in trainer.model.trainable_variables))
    out = {
        "workload": wl.name,
        "description": wl.describe(),
        "params": params,
        "gradient_bytes": params * 4,
        "batch_per_rank": wl.batch_per_rank,
        "workers": trainer.workers,
        "models": s.models,
        "steps_per_window": s.steps,
        "examples_per_window": s.steps * wl.batch_per_rank * trainer.workers,
        "window_seconds": windows,
    }
    if raw_windows:
        out["paired_raw_window_seconds"] = raw_windows
    return out


def time_to_accuracy(rt: Runtime, s: Settings, seed: int) -> dict[str, Any]:
    """Epochs until the test accuracy reaches the target; eval time is excluded from the clock.

    Synchronous strategies scale the learning rate with the global batch
    (lr × N, Goyal et al. 2017); asynchronous PS workers each apply their own
    batch's gradient, so they keep the single-worker rate. An hvdk8s run also
    trains the raw Horovod loop on the same ranks and data, one epoch after
    each of its own: the epoch times of the two, side by side under the same
    load (``paired_raw_epoch_seconds``).
    """
    from . import trainers, workloads

    wl = s.workload("cnn")
    (x_train, y_train), (x_test, y_test) = workloads.digits()
    import keras

    keras.utils.set_random_seed(seed)
    workers = rt.workers
    lr = s.tta_lr * workers if rt.synchronous else s.tta_lr

    def make(name: str | None = None) -> Any:
        return rt.trainer(
            lambda: workloads.build_model(wl, seed),
            lambda rank, size, sd: workloads.digits_dataset(x_train, y_train, s.tta_batch, rank, size, sd),
            lr,
            s.tta_batch,
            name=name,
        )

    trainer = make()
    steps = len(x_train) // (s.tta_batch * workers)  # per worker, so one epoch is one pass in all
    paired = trainers.Alternate(make("horovod"), 0, steps) if rt.name == "hvdk8s" else None
    curve: list[dict[str, Any]] = []

    def evaluate(epoch: int, elapsed: float) -> bool:
        acc = trainer.accuracy(x_test, y_test)
        curve.append({"epoch": epoch, "train_seconds": elapsed, "test_accuracy": acc})
        return acc >= s.tta_target

    trainer.to_accuracy(steps, s.tta_max_epochs, evaluate, paired)
    reached = curve[-1]["epoch"] if curve[-1]["test_accuracy"] >= s.tta_target else None
    return {
        **({"paired_raw_epoch_seconds": paired.windows} if paired else {}),
        "target": s.tta_target,
        "lr": lr,
        "batch_per_rank": s.tta_batch,
        "workers": workers,
        "steps_per_epoch_per_worker": steps,
        "train_examples": int(len(x_train)),
        "test_examples": int(len(x_test)),
        "epochs_to_target": reached,
        "seconds_to_target": curve[-1]["train_seconds"] if reached else None,
        "curve": curve,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    job = json.loads(args.job.read_text())
    settings = Settings.from_json(job["settings"])
    if args.server:
        serve(settings.threads_per_rank)
        return 0
    started = time.time()
    rt = Runtime(args.strategy, None if job.get("own_threads") else settings.threads_per_rank)
    seed = int(job.get("seed", 0))
    result: dict[str, Any] = {"strategy": args.strategy, "pid": os.getpid(), "throughput": []}
    if "OMPI_COMM_WORLD_RANK" in os.environ:  # started by mpirun, which hands its -mca parameters to the ranks
        # the allreduce algorithm asked of Open MPI (auto: none, Open MPI decides)
        result["allreduce_algorithm"] = os.environ.get("OMPI_MCA_coll_tuned_allreduce_algorithm", "auto")
        # the TCP eager limit it was launched with (hvdk8s's launchers always set one; None: Open MPI's default)
        eager = os.environ.get("OMPI_MCA_btl_tcp_eager_limit")
        result["tcp_eager_limit"] = int(eager) if eager else None
    if args.profile:
        from . import profiling

        result["profile"] = [
            profiling.phases(settings, name, seed, args.out.with_name(f"{args.out.stem}.{name}.timeline.json"))
            for name in job["workloads"]
        ]
    for name in job["workloads"] if not args.profile else ():
        result["throughput"].append(throughput(rt, settings, name, seed))
        print(f"worker {args.strategy}: {name} done", flush=True)
    if job.get("tta"):
        result["time_to_accuracy"] = time_to_accuracy(rt, settings, seed)
    import tensorflow as tf

    # the pools this process ran with (0: TensorFlow's default), so a report can show what each strategy had
    result["threads"] = {"intra_op": tf.config.threading.get_intra_op_parallelism_threads(),
                         "inter_op": tf.config.threading.get_inter_op_parallelism_threads()}
    result["wall_seconds"] = time.time() - started
    from ..machine.envinfo import stack_versions

    result["stack"] = stack_versions(load_ops=False)  # which stack this launch ran (a stack knob's is not the suite's)
    if rt.chief:
        atomic.write_json(args.out, result)
    rt.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
