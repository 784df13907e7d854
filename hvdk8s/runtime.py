"""Process-level set-up: Horovod init, device pinning and thread budgets.

Everything that must happen once per process, before TensorFlow builds its
runtime, lives here so the rest of the library can assume it has happened.
"""
from __future__ import annotations

import os
import socket
from collections import Counter

import horovod.tensorflow as hvd
import tensorflow as tf

_initialized = False


def init(*, threads_per_rank: int | None = None, quiet: bool = False) -> None:
    """Initialise Horovod and give this rank its share of the machine.

    On GPU hosts each rank sees only the GPU of its local rank (memory growth
    on), the layout NCCL and the MPI Operator's ``slotsPerWorker`` assume. On
    CPU hosts the cores are split between the ranks of the host, otherwise N
    ranks each start ``cores`` threads and the host is oversubscribed N times.
    ``threads_per_rank`` (or ``HVDK8S_THREADS_PER_RANK``) overrides the split.
    Unless ``quiet``, rank 0 prints where the ranks run, so a job that came up
    on fewer hosts than planned is visible at once. Safe to call more than once.
    """
    global _initialized
    if _initialized:
        return
    hvd.init()
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        gpu = gpus[hvd.local_rank() % len(gpus)]
        tf.config.experimental.set_memory_growth(gpu, True)
        tf.config.set_visible_devices(gpu, "GPU")
    else:
        threads = threads_per_rank or int(os.environ.get("HVDK8S_THREADS_PER_RANK", 0))
        set_threads(threads or max(1, (os.cpu_count() or 1) // hvd.local_size()))
    _initialized = True
    if not quiet:
        hosts = hvd.allgather_object(socket.gethostname(), name="hvdk8s.hosts")
        if hvd.rank() == 0:
            print(f"hvdk8s: {placement(hosts)}", flush=True)


def set_threads(threads: int) -> None:
    """TensorFlow's thread pools for one process: ``threads`` intra-op, at most 2 inter-op.

    Must run before TensorFlow starts its runtime (``init`` calls it); the
    benchmarks give non-Horovod processes the same budget through it.
    """
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(max(1, min(2, threads)))


def placement(hosts: list[str]) -> str:
    """'4 ranks on 2 hosts (a: 2, b: 2)' from the host name of each rank."""
    counts = Counter(hosts)
    listing = ", ".join(f"{host}: {n}" for host, n in sorted(counts.items()))
    ranks = "rank" if len(hosts) == 1 else "ranks"
    hosts_word = "host" if len(counts) == 1 else "hosts"
    return f"{len(hosts)} {ranks} on {len(counts)} {hosts_word} ({listing})"


def initialized() -> bool:
    """True once ``init()`` has run in this process."""
    return _initialized


def rank() -> int:
    """Global rank of this process (0 … size-1)."""
    return hvd.rank()


def size() -> int:
    """Number of processes in the job."""
    return hvd.size()


def local_rank() -> int:
    """Rank of this process among the processes on its host."""
    return hvd.local_rank()


def local_size() -> int:
    """Number of processes on this host."""
    return hvd.local_size()


def is_chief() -> bool:
    """True on rank 0, the one rank that writes checkpoints, logs and exports."""
    return hvd.rank() == 0


def shutdown() -> None:
    """Shut Horovod down; ``init()`` may then start it again in this process.

    (Elastic resets restart Horovod without this: TensorFlow's thread pools,
    set once by ``init``, cannot change after start-up.)
    """
    global _initialized
    hvd.shutdown()
    _initialized = False
