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

from .common import argcheck
from .common.errors import UserError
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

    On GPU hosts each rank sees only the GPU of its local rank (memory growth on), the layout NCCL and the MPI
    Operator's ``slotsPerWorker`` assume, and TensorFlow keeps its own thread pools: there the host threads
    launch kernels, feed the input pipeline and wait on collectives while the math runs on the GPU, so a cap
    would only slow the feeding. On CPU hosts the thread policy ``HVDK8S_THREAD_POLICY`` applies (one of
    ``hvdk8s.threads.THREAD_POLICIES``). Its default, ``split-intra``, gives each rank its share of the cores
    as intra-op threads (cores / local_size) and keeps TensorFlow's inter-op pool, because TensorFlow's own
    pools start as many compute threads as there are cores in every rank, so the ranks of one host would
    oversubscribe its cores; at one rank per host it is TensorFlow's default. The measurements behind that
    choice are in ``benchmarks/reports/threads/README.md``.

    Unless ``quiet``, rank 0 prints where the ranks run, so a job that came up on fewer hosts than planned is
    visible at once (not under Horovod's elastic driver, where a worker joining a running job would wait in
    that collective for ranks that are training). Safe to call more than once; after ``shutdown()`` it starts
    Horovod again. Devices and threads are set once per process, since TensorFlow cannot change them after
    start-up: called after TensorFlow has started, it warns and leaves them as they are.

    Args:
        comm: Horovod's: an mpi4py communicator, or a list of ranks, to run on a subset of
            ``MPI_COMM_WORLD``; None for all ranks.
        process_sets: Horovod's: the process sets to register at start-up, or ``"dynamic"`` to add and
            remove them later.
        threads_per_rank: On CPU hosts, this many intra-op threads per rank (and at most 2 inter-op),
            whatever the policy; None reads ``HVDK8S_THREADS_PER_RANK``, and without it the policy decides.
            Ignored on GPU hosts.
        quiet: Do not print the ranks' placement.

    Raises:
        TypeError: ``threads_per_rank`` is not a whole number (checked before Horovod starts).
        UserError: More ranks on this host than GPUs visible to them (see ``gpu_of_rank``).
        ValueError: ``threads_per_rank`` is below 1 (checked before Horovod starts);
            ``HVDK8S_THREADS_PER_RANK`` is not a whole number, or ``HVDK8S_THREAD_POLICY`` names no policy.

    Example:
        ```python
        import hvdk8s as hvd

        hvd.init()
        print(hvd.rank(), hvd.size())
        ```
    """
    global _devices_set
    if threads_per_rank is not None:
        threads_per_rank = argcheck.whole("threads_per_rank", threads_per_rank)
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

    Args:
        gpus: The GPUs visible on this host, in order.
        rank_on_host: This rank's local rank.
        ranks_on_host: The number of ranks on this host (local size).

    Returns:
        ``gpus[rank_on_host]``.

    Raises:
        UserError: ``ranks_on_host`` is larger than the number of GPUs.
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

    Must run before TensorFlow starts its runtime; the benchmarks give
    non-Horovod processes the same budget as ``init`` gives a rank through it.

    Args:
        threads: Intra-op threads (the inter-op pool gets ``min(2, threads)``, at least 1).
    """
    _set_pools(*thread_pools("split", threads, 1, threads))


def placement(hosts: list[str]) -> str:
    """A one-line summary of where the ranks run.

    Args:
        hosts: The host name of each rank, in rank order.

    Returns:
        E.g. ``"4 ranks on 2 hosts (a: 2, b: 2)"``.
    """
    counts = Counter(hosts)
    listing = ", ".join(f"{host}: {n}" for host, n in sorted(counts.items()))
    ranks = "rank" if len(hosts) == 1 else "ranks"
    hosts_word = "host" if len(counts) == 1 else "hosts"
    return f"{len(hosts)} {ranks} on {len(counts)} {hosts_word} ({listing})"


def is_chief() -> bool:
    """Whether this process is rank 0, the one rank that writes checkpoints, logs and exports.

    Returns:
        True on rank 0 (``hvdk8s.init()`` must have run).
    """
    return hvd.rank() == 0


def shutdown() -> None:
    """Shut Horovod down; ``init()`` may then start it again in this process."""
    hvd.shutdown()
