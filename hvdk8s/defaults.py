"""``hvdk8s.default_callbacks()``: Horovod's callbacks plus hvdk8s's own, in the order they must run."""
from __future__ import annotations

import os

import keras

from hvdk8s.callbacks import BroadcastGlobalVariablesCallback, LearningRateWarmupCallback, MetricAverageCallback
from hvdk8s.checkpoint import Checkpoint
from hvdk8s.observability import observability_callbacks


def default_callbacks(
    *,
    initial_lr: float | None = None,
    warmup_epochs: int = 0,
    momentum_correction: bool = True,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    checkpoint_every: int = 1,
    keep_checkpoints: int = 3,
    metrics: bool = True,
    metrics_port: int | None = None,
    progress: bool = True,
    tensorboard_dir: str | os.PathLike[str] | None = None,
    batch_size: int | None = None,
) -> list[keras.callbacks.Callback]:
    """The callbacks a data-parallel ``fit`` needs, in order; put user callbacks after them.

    State is broadcast from rank 0 before the ranks can diverge, epoch logs are
    averaged before anything reads them (with the metrics callback's figures,
    one allreduce per epoch), then (optional) Horovod's warm-up to
    ``initial_lr`` (the scaled rate, as in Horovod) over ``warmup_epochs``
    (with Horovod's ``momentum_correction``, on by default as in Horovod),
    rank-0 checkpoints, and observability: Prometheus metrics from every rank
    on ``metrics_port`` (else ``HVDK8S_METRICS_PORT``, default 9090) + local
    rank, a progress bar on rank 0 (pass ``verbose=0`` to ``fit``), TensorBoard
    on rank 0 when ``tensorboard_dir`` is given. ``batch_size`` (per rank) is
    needed only when a custom ``train_step`` bypasses Keras's loss tracker.
    Build the list the same way on every rank.
    """
    metric_average = MetricAverageCallback()
    out: list[keras.callbacks.Callback] = [BroadcastGlobalVariablesCallback(0), metric_average]
    if warmup_epochs:
        if initial_lr is None:
            raise ValueError("default_callbacks(): warmup_epochs needs initial_lr (the rate after warm-up)")
        out.append(LearningRateWarmupCallback(initial_lr, warmup_epochs=warmup_epochs,
                                              momentum_correction=momentum_correction))
    if checkpoint_dir is not None:
        out.append(Checkpoint(checkpoint_dir, every_epochs=checkpoint_every, keep=keep_checkpoints))
    out += observability_callbacks(
        metrics=metrics, progress=progress, tensorboard_dir=tensorboard_dir, port=metrics_port, batch_size=batch_size,
        metric_average=metric_average,
    )
    return out
