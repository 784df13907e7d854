"""``hvdk8s.default_callbacks()``: Horovod's callbacks plus hvdk8s's own, in the order they must run."""
from __future__ import annotations

import os

import keras

from hvdk8s.callbacks import BroadcastGlobalVariablesCallback, LearningRateWarmupCallback, MetricAverageCallback
from hvdk8s.common import argcheck
from hvdk8s.observe.observability import observability_callbacks
from hvdk8s.train.checkpoint import Checkpoint


def default_callbacks(
    *,
    initial_lr: float | None = None,
    warmup_epochs: float = 0,
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

    State is broadcast from rank 0 before the ranks can diverge
    (``BroadcastGlobalVariablesCallback(0)``); epoch logs are averaged over the
    ranks before anything reads them (``MetricAverageCallback``, whose one
    allreduce per epoch also carries the metrics callback's figures); then
    come Horovod's learning-rate warm-up (optional), rank-0 checkpoints
    (optional) and the observability callbacks (``observability_callbacks``).
    Build the list the same way on every rank: several of these join a
    collective at each epoch end.

    Args:
        initial_lr: The learning rate after warm-up, already scaled by ``size()`` as in Horovod; required
            when ``warmup_epochs`` > 0.
        warmup_epochs: Epochs of Horovod's gradual warm-up (``LearningRateWarmupCallback``); 0 for none.
        momentum_correction: Horovod's momentum correction during the warm-up.
        checkpoint_dir: Folder for rank-0 checkpoints (``Checkpoint``); None for no checkpoints.
        checkpoint_every: Save a checkpoint every this many epochs.
        keep_checkpoints: How many of the newest checkpoints to keep.
        metrics: Serve Prometheus metrics from every rank (``TrainingMetrics``).
        metrics_port: Base port of the metrics endpoints (rank serves on base + local rank); None reads
            ``HVDK8S_METRICS_PORT`` (default 9090), 0 picks a free port per rank.
        progress: Show a progress bar on rank 0 (``ProgressBar``); pass ``verbose=0`` to ``fit``.
        tensorboard_dir: Write TensorBoard logs there on rank 0; None for no TensorBoard.
        batch_size: The per-rank batch size, needed only when a custom ``train_step`` bypasses Keras's loss
            tracker (the metrics then count examples from it).

    Returns:
        The callbacks, to pass to ``model.fit(callbacks=...)`` before any of your own.

    Raises:
        TypeError: ``warmup_epochs`` is not a number; ``checkpoint_every``, ``keep_checkpoints``,
            ``metrics_port`` or ``batch_size`` is not a whole number; with a warm-up, ``initial_lr`` is not a
            number.
        ValueError: ``warmup_epochs`` or ``metrics_port`` is negative; ``checkpoint_every``,
            ``keep_checkpoints`` or ``batch_size`` is below 1; with a warm-up, ``initial_lr`` is missing or
            negative.

    Example:
        ```python
        import hvdk8s as hvd

        hvd.init()
        model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size())), loss=...)
        model.fit(dataset, epochs=10, verbose=0,
                  callbacks=hvd.default_callbacks(initial_lr=0.01 * hvd.size(), warmup_epochs=2,
                                                  checkpoint_dir="checkpoints"))
        ```
    """
    argcheck.real("warmup_epochs", warmup_epochs, least=0)  # a float, as Horovod's ImageNet example passes
    argcheck.whole("checkpoint_every", checkpoint_every)
    argcheck.whole("keep_checkpoints", keep_checkpoints)
    if metrics_port is not None:
        argcheck.whole("metrics_port", metrics_port, least=0)
    if batch_size is not None:
        argcheck.whole("batch_size", batch_size)
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
