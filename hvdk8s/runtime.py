"""Process-level set-up: Horovod init, device pinning and thread budgets.

Everything that must happen once per process, before TensorFlow builds its
runtime, lives here so the rest of the library can assume it has happened.
"""
from __future__ import annotations

import os
import socket
import warnings
from collections import Counter
from collections.abc import Sequence
from typing import Any, TypeVar

import horovod.tensorflow as hvd
import tensorflow as tf

# Horovod's process-level queries and build flags, unchanged (horovod.tensorflow.keras exports them too).
from horovod.tensorflow import (  # noqa: F401  (re-exported)
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    rocm_built,
    size,
    start_timeline,
    stop_timeline,
)

from .errors import UserError
from .threads import DEFAULT_CPU_THREAD_POLICY, thread_pools

T = TypeVar("T")

_devices_set = False


def init(
    comm: Any = None,
    process_sets: Any = None,
    *,
    threads_per_rank: int | None = None,
    quiet: bool = False,
) -> None:
    """Initialise Horovod (``hvd.init(comm, process_sets)``) and give this rank its share of the machine.

    ``comm`` and ``process_sets`` are Horovod's: an mpi4py communicator (or a
    list of ranks) to run on a subset of ``MPI_COMM_WORLD``, and the process
    sets to register (or ``"dynamic"``).

    On GPU hosts each rank sees only the GPU of its local rank (memory growth
    on), the layout NCCL and the MPI Operator's ``slotsPerWorker`` assume
    (more ranks on a host than GPUs is a UserError, see :func:`gpu_of_rank`), and
    TensorFlow keeps its own thread pools: there the host threads launch
    kernels, run the input pipeline and wait on collectives while the math
    runs on the GPU, so a cap would only slow the feeding (reasoned, not
    measured: no GPU here). On CPU hosts the thread policy
    ``HVDK8S_THREAD_POLICY`` applies (``hvdk8s.threads.THREAD_POLICIES``).
    Its default, ``split-intra``, gives each rank its share of the cores as
    intra-op threads (cores / local_size) and keeps TensorFlow's inter-op
    pool: TensorFlow's own pools (``tf``, what a raw Horovod script runs
    with) start ``cores`` compute threads in every rank, so the ranks of one
    host oversubscribe its cores. On a quiet 2-core machine at 2 ranks it ran
    Horovod's synthetic benchmarks 1.08x (ResNet50) and 1.13x (MobileNetV2)
    as fast as the raw loop, against 0.95x and 1.00x with ``tf``
    (``hvdk8s bench --knobs threads_*``, benchmarks/reports/threads); at one
    rank per host it is TensorFlow's default.
    ``threads_per_rank`` (or ``HVDK8S_THREADS_PER_RANK``) overrides the
    policy: that many intra-op threads, at most 2 inter-op.
    Unless ``quiet``, rank 0 prints where the ranks run, so a job that came up
    on fewer hosts than planned is visible at once (not under Horovod's elastic
    driver: a worker joining a running job would wait in that collective for
    ranks that are training). Safe to call more than
    once; after ``shutdown()`` it starts Horovod again (devices and threads are
    set once per process: TensorFlow cannot change them after start-up).
    """
    global _devices_set
    if hvd.is_initialized():
        return
    hvd.init(comm=comm, process_sets=process_sets)
    if not _devices_set:
        try:
            _set_devices(threads_per_rank)
        except RuntimeError as err:  # TensorFlow already started: Horovod itself runs fine
            warnings.warn(f"hvdk8s.init(): device and thread pinning skipped ({err}); call init() before "
                          "any TensorFlow operation to get one GPU or a share of the cores per rank", stacklevel=2)
        _devices_set = True
    if not quiet and os.environ.get("HOROVOD_ELASTIC") != "1":
        hosts = hvd.allgather_object(socket.gethostname(), name="hvdk8s.hosts")
        if hvd.rank() == 0:
            print(f"hvdk8s: {placement(hosts)}", flush=True)


def _set_devices(threads_per_rank: int | None) -> None:
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        gpu = gpu_of_rank(gpus, hvd.local_rank(), hvd.local_size())
        tf.config.experimental.set_memory_growth(gpu, True)
        tf.config.set_visible_devices(gpu, "GPU")
    else:
        env = os.environ.get("HVDK8S_THREADS_PER_RANK", "").strip()
        if env and not env.isdigit():
            raise ValueError(f"HVDK8S_THREADS_PER_RANK={env!r}: expected a whole number of threads")
        policy = os.environ.get("HVDK8S_THREAD_POLICY", "").strip() or DEFAULT_CPU_THREAD_POLICY
        intra, inter = thread_pools(policy, os.cpu_count() or 1, hvd.local_size(), threads_per_rank or int(env or 0))
        _set_pools(intra, inter)


def gpu_of_rank(gpus: Sequence[T], rank_on_host: int, ranks_on_host: int) -> T:
    """The GPU at this rank's local rank, as Horovod pins them (v0.28.1
    examples/tensorflow2/tensorflow2_keras_mnist.py: ``gpus[hvd.local_rank()]``).

    More ranks on a host than GPUs is refused, on every rank of that host (so none
    waits in a collective for ranks that stopped): ranks sharing a GPU would split
    its memory and time without anyone having asked for it.
    """
    if ranks_on_host > len(gpus):
        raise UserError(
            f"{ranks_on_host} ranks on this host but {len(gpus)} GPU(s) visible to them: hvdk8s gives each rank its "
            f"own GPU. Start at most {len(gpus)} rank(s) per host: fewer ranks (hvdk8s run -np, or -H host:slots), "
            "or slotsPerWorker (hvdk8s render --slots) no larger than the GPUs each worker gets")
    return gpus[rank_on_host]


def _set_pools(intra: int | None, inter: int | None) -> None:
    if intra is not None:
        tf.config.threading.set_intra_op_parallelism_threads(intra)
    if inter is not None:
        tf.config.threading.set_inter_op_parallelism_threads(inter)


def set_threads(threads: int) -> None:
    """TensorFlow's thread pools for one process: ``threads`` intra-op, at most 2 inter-op.

    Must run before TensorFlow starts its runtime (``init`` calls it); the
    benchmarks give non-Horovod processes the same budget through it.
    """
    _set_pools(*thread_pools("split", threads, 1, threads))


def placement(hosts: list[str]) -> str:
    """'4 ranks on 2 hosts (a: 2, b: 2)' from the host name of each rank."""
    counts = Counter(hosts)
    listing = ", ".join(f"{host}: {n}" for host, n in sorted(counts.items()))
    ranks = "rank" if len(hosts) == 1 else "ranks"
    hosts_word = "host" if len(counts) == 1 else "hosts"
    return f"{len(hosts)} {ranks} on {len(counts)} {hosts_word} ({listing})"


def is_chief() -> bool:
    """True on rank 0, the one rank that writes checkpoints, logs and exports."""
    return hvd.rank() == 0


def shutdown() -> None:
    """Shut Horovod down; ``init()`` may then start it again in this process."""
    hvd.shutdown()
