"""The observability callbacks in the order they must run.

``hvdk8s.default_callbacks()`` appends these after ``MetricAverageCallback``, whose
allreduce also averages the metrics callback's epoch figures: the job
throughput lands in the rank-averaged epoch logs, which the progress bar and
TensorBoard after it then show.
"""
from __future__ import annotations

import os
from typing import Any

import keras

from hvdk8s import runtime
from hvdk8s.callbacks import MetricAverageCallback
from hvdk8s.observe.metrics import TrainingMetrics
from hvdk8s.observe.progress import ProgressBar


def chief_tensorboard(log_dir: str | os.PathLike[str], **kwargs: Any) -> list[keras.callbacks.Callback]:
    """Keras's TensorBoard callback on rank 0, nothing elsewhere.

    Every rank writing to one log dir would give N copies of each curve (and
    racing event files); rank 0's logs are the job's once ``MetricAverageCallback`` ran.

    Args:
        log_dir: TensorBoard's log folder.
        **kwargs: Passed on to ``keras.callbacks.TensorBoard``.

    Returns:
        ``[TensorBoard(...)]`` on rank 0, ``[]`` on the other ranks.
    """
    return [keras.callbacks.TensorBoard(log_dir=os.fspath(log_dir), **kwargs)] if runtime.is_chief() else []


def observability_callbacks(
    *,
    metrics: bool = True,
    progress: bool = True,
    tensorboard_dir: str | os.PathLike[str] | None = None,
    port: int | None = None,
    batch_size: int | None = None,
    metric_average: MetricAverageCallback | None = None,
) -> list[keras.callbacks.Callback]:
    """Prometheus metrics (every rank), rank-0 progress bar and TensorBoard, in the order they must run.

    Call it identically on every rank: the metrics callback joins an allreduce
    at each epoch end, the ``metric_average`` callback's (placed before these)
    when one is given, else one of its own. ``default_callbacks()`` includes
    these; call this directly to build your own list.

    Args:
        metrics: Include ``TrainingMetrics`` (Prometheus metrics from every rank).
        progress: Include ``ProgressBar`` (rank 0 only; pass ``verbose=0`` to ``fit``).
        tensorboard_dir: Include Keras's TensorBoard callback on rank 0, writing there; None for none.
        port: Base metrics port (rank serves on base + local rank); None reads ``HVDK8S_METRICS_PORT``
            (default 9090), 0 picks a free port per rank.
        batch_size: The per-rank batch size, needed only by models whose custom ``train_step`` bypasses
            Keras's loss tracker.
        metric_average: The ``MetricAverageCallback`` that runs before these; the metrics callback's epoch
            figures then travel in its allreduce instead of a second one.

    Returns:
        The callbacks, to put after ``MetricAverageCallback`` in ``fit``'s list.
    """
    out: list[keras.callbacks.Callback] = []
    if metrics:
        training_metrics = TrainingMetrics(port=port, batch_size=batch_size)
        if metric_average is not None:
            metric_average.add_figures(training_metrics.figures_for_average)
        out.append(training_metrics)
    if progress:
        out.append(ProgressBar(batch_size=batch_size))
    if tensorboard_dir is not None:
        out += chief_tensorboard(tensorboard_dir)
    return out
