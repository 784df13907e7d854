"""hvdk8s: Horovod data-parallel training for Keras 3, on a laptop or as a Kubeflow MPIJob.

A training script reads like a Horovod Keras script::

    import hvdk8s, keras
    hvdk8s.init()
    opt = hvdk8s.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvdk8s.size()))
    model.compile(optimizer=opt, loss=..., metrics=[...])
    model.fit(hvdk8s.data.from_arrays(x, y, 64), callbacks=hvdk8s.callbacks(), verbose=0)

Names are imported on first use, so ``import hvdk8s`` (and the CLI's
Kubernetes commands) do not load TensorFlow or Horovod until needed.
"""
from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "init": "hvdk8s.runtime",
    "shutdown": "hvdk8s.runtime",
    "rank": "hvdk8s.runtime",
    "size": "hvdk8s.runtime",
    "local_rank": "hvdk8s.runtime",
    "local_size": "hvdk8s.runtime",
    "is_chief": "hvdk8s.runtime",
    "initialized": "hvdk8s.runtime",
    "Average": "hvdk8s.collectives",
    "Sum": "hvdk8s.collectives",
    "DistributedOptimizer": "hvdk8s.optimizer",
    "DistributedGradientTape": "hvdk8s.optimizer",
    "callbacks": "hvdk8s.keras_callbacks",
    "BroadcastInitialState": "hvdk8s.keras_callbacks",
    "MetricAverage": "hvdk8s.keras_callbacks",
    "LearningRateWarmup": "hvdk8s.keras_callbacks",
    "LearningRateSchedule": "hvdk8s.keras_callbacks",
    "Checkpoint": "hvdk8s.checkpoint",
    "restore_latest": "hvdk8s.checkpoint",
    "save_atomic": "hvdk8s.checkpoint",
    "observability_callbacks": "hvdk8s.observability",
    "TrainingMetrics": "hvdk8s.metrics",
    "ProgressBar": "hvdk8s.progress",
}
_SUBMODULES = {"data", "models", "collectives", "elastic", "launcher", "mpijob", "serving"}

__all__ = sorted(_EXPORTS) + sorted(_SUBMODULES)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    if name in _SUBMODULES:
        return importlib.import_module(f"hvdk8s.{name}")
    raise AttributeError(f"module 'hvdk8s' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
