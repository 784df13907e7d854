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
from hvdk8s.metrics import TrainingMetrics
from hvdk8s.progress import ProgressBar


def chief_tensorboard(log_dir: str | os.PathLike[str], **kwargs: Any) -> list[keras.callbacks.Callback]:
    """Keras's TensorBoard callback on rank 0, nothing elsewhere.

    Every rank writing to one log dir would give N copies of each curve (and
    racing event files); rank 0's logs are the job's once ``MetricAverageCallback`` ran.
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
    """Prometheus metrics (every rank), rank-0 progress bar and TensorBoard.

    ``port``: base metrics port (rank serves on base + local_rank); None reads
    ``HVDK8S_METRICS_PORT`` (default 9090), 0 picks a free port per rank.
    ``batch_size`` (per rank) is needed only by models whose custom
    ``train_step`` bypasses Keras's loss tracker. Call it identically on every
    rank: the metrics callback joins an allreduce at each epoch end, the
    ``metric_average`` callback's (placed before these) when one is given,
    else one of its own.
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
