"""hvdk8s: Horovod data-parallel training for Keras 3, on a laptop or on Kubernetes.

A Horovod Keras script ports by changing its import::

    import hvdk8s as hvd                     # was: import horovod.tensorflow.keras as hvd
    hvd.init()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size()))
    model.compile(optimizer=opt, loss=..., metrics=[...])
    model.fit(x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                               hvd.callbacks.MetricAverageCallback()])

The top level, ``hvdk8s.callbacks`` and ``hvdk8s.elastic`` carry
``horovod.tensorflow.keras``'s names, signatures and defaults. hvdk8s's own
additions have names Horovod does not use: ``default_callbacks()`` (the
callbacks above plus checkpoints, metrics and a rank-0 progress bar),
``Checkpoint``, ``data``, ``models``, ``serving`` ...

Names are imported on first use, so ``import hvdk8s`` (and the CLI's
Kubernetes commands) do not load TensorFlow or Horovod until needed.
"""
from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_HOROVOD_RUNTIME = (
    "init", "shutdown", "is_initialized", "size", "local_size", "cross_size", "rank", "local_rank", "cross_rank",
    "start_timeline", "stop_timeline", "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled",
    "gloo_built", "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built",
)
_HOROVOD_COLLECTIVES = (
    "Average", "Sum", "Adasum", "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
    "allreduce", "allgather", "broadcast", "reducescatter", "broadcast_object", "allgather_object",
    "broadcast_variables", "broadcast_global_variables",
)
_EXPORTS = {
    **{name: "hvdk8s.runtime" for name in _HOROVOD_RUNTIME},
    **{name: "hvdk8s.collectives" for name in _HOROVOD_COLLECTIVES},
    "Compression": "horovod.tensorflow.compression",
    "DistributedOptimizer": "hvdk8s.optimizer",
    "PartialDistributedOptimizer": "hvdk8s.optimizer",
    "DistributedGradientTape": "hvdk8s.optimizer",
    "load_model": "hvdk8s.loading",
    # hvdk8s's own
    "is_chief": "hvdk8s.runtime",
    "default_callbacks": "hvdk8s.defaults",
    "Checkpoint": "hvdk8s.checkpoint",
    "restore_latest": "hvdk8s.checkpoint",
    "save_atomic": "hvdk8s.checkpoint",
    "observability_callbacks": "hvdk8s.observability",
    "TrainingMetrics": "hvdk8s.metrics",
    "ProgressBar": "hvdk8s.progress",
}
_SUBMODULES = {"callbacks", "data", "models", "collectives", "elastic", "launcher", "mpijob", "serving"}

__all__ = sorted(_EXPORTS) + sorted(_SUBMODULES)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    if name in _SUBMODULES:
        return importlib.import_module(f"hvdk8s.{name}")
    raise AttributeError(f"module 'hvdk8s' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
