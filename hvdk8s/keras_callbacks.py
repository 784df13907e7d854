"""Keras callbacks that make ``model.fit`` behave as one job across ranks.

Order matters and ``hvdk8s.callbacks()`` gets it right: state is broadcast
before the first step, metrics are averaged before any later callback (early
stopping, checkpoints, the progress display) reads the epoch's logs.
"""
from __future__ import annotations

import numbers
import os
import warnings
from collections.abc import Callable

import keras

from hvdk8s import collectives, runtime
from hvdk8s.checkpoint import Checkpoint
from hvdk8s.observability import observability_callbacks


class BroadcastInitialState(keras.callbacks.Callback):
    """Copy rank 0's model and optimizer variables to every rank at train start.

    The optimizer is built first, so its slots (momentum, Adam moments) and
    iteration count are identical too, not only the weights. Horovod's ops
    cannot be XLA-compiled, so XLA is switched off for the model's train step.
    """

    def __init__(self, root_rank: int = 0) -> None:
        super().__init__()
        self.root_rank = root_rank
        self._done = False

    def set_model(self, model: keras.Model) -> None:
        super().set_model(model)
        if getattr(model, "jit_compile", False):
            warnings.warn("hvdk8s: XLA (jit_compile) cannot compile Horovod collectives; turning it off", stacklevel=2)
            model.jit_compile = False

    def on_train_begin(self, logs: dict | None = None) -> None:
        if self._done:
            return
        optimizer = self.model.optimizer
        if not optimizer.built:
            optimizer.build(self.model.trainable_variables)
        collectives.broadcast_variables(list(self.model.variables) + list(optimizer.variables), self.root_rank)
        self._done = True


class MetricAverage(keras.callbacks.Callback):
    """Replace each numeric epoch log (loss, metrics, val_*) by its mean over ranks."""

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if logs:
            numeric = {k: v for k, v in logs.items() if isinstance(v, numbers.Real)}
            logs.update(collectives.average_scalars(numeric))


def warmup_lr(base_lr: float, size: int, epoch: float, warmup_epochs: float) -> float:
    """Goyal et al. (2017) linear warm-up: ``base_lr`` at epoch 0 to ``base_lr × size``.

    ``epoch`` is fractional (epoch + batch / steps_per_epoch); after the
    warm-up the result stays at ``base_lr × size``.
    """
    progress = min(1.0, epoch / warmup_epochs) if warmup_epochs > 0 else 1.0
    return base_lr * (1.0 + (size - 1) * progress)


class _PerBatchLearningRate(keras.callbacks.Callback):
    """Sets the optimizer's learning rate before every batch from ``lr_at(epoch)``."""

    def __init__(self, steps_per_epoch: int | None = None) -> None:
        super().__init__()
        self.steps_per_epoch = steps_per_epoch
        self._epoch = 0

    def lr_at(self, epoch: float) -> float | None:
        raise NotImplementedError

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.steps_per_epoch = self.steps_per_epoch or self.params.get("steps")
        if not self.steps_per_epoch:
            raise ValueError(f"{type(self).__name__}: steps_per_epoch is unknown; pass it explicitly")

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._epoch = epoch

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        lr = self.lr_at(self._epoch + batch / self.steps_per_epoch)
        if lr is not None:
            self.model.optimizer.learning_rate = lr

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if logs is not None:
            logs["learning_rate"] = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))


class LearningRateWarmup(_PerBatchLearningRate):
    """Ramp the learning rate per batch from ``base_lr`` to ``base_lr × size`` over ``warmup_epochs``."""

    def __init__(self, base_lr: float, warmup_epochs: float = 5, steps_per_epoch: int | None = None) -> None:
        super().__init__(steps_per_epoch)
        self.base_lr = base_lr
        self.warmup_epochs = warmup_epochs

    def lr_at(self, epoch: float) -> float | None:
        if epoch > self.warmup_epochs:
            return None  # later schedules own the rate from here on
        return warmup_lr(self.base_lr, runtime.size(), epoch, self.warmup_epochs)


class LearningRateSchedule(_PerBatchLearningRate):
    """Set the rate to ``base_lr × size × multiplier(epoch)`` for epochs in [start, end).

    ``multiplier`` is a constant or a function of the (fractional, unless
    ``staircase``) epoch, as in Horovod's schedule callback.
    """

    def __init__(
        self,
        base_lr: float,
        multiplier: float | Callable[[float], float],
        start_epoch: int = 0,
        end_epoch: int | None = None,
        staircase: bool = True,
        steps_per_epoch: int | None = None,
    ) -> None:
        super().__init__(steps_per_epoch)
        self.base_lr = base_lr
        self.multiplier = multiplier if callable(multiplier) else (lambda _epoch: multiplier)
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase

    def lr_at(self, epoch: float) -> float | None:
        if epoch < self.start_epoch or (self.end_epoch is not None and epoch >= self.end_epoch):
            return None
        at = float(int(epoch)) if self.staircase else epoch
        return self.base_lr * runtime.size() * self.multiplier(at)


def callbacks(
    *,
    base_lr: float | None = None,
    warmup_epochs: float = 0,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    checkpoint_every: int = 1,
    keep_checkpoints: int = 3,
    metrics: bool = True,
    metrics_port: int | None = None,
    progress: bool = True,
    tensorboard_dir: str | os.PathLike[str] | None = None,
    batch_size: int | None = None,
) -> list[keras.callbacks.Callback]:
    """The hvdk8s callbacks in the order they must run; put user callbacks after them.

    Observability is on by default: Prometheus metrics from every rank on
    ``metrics_port`` (else ``HVDK8S_METRICS_PORT``, default 9090) + local rank,
    a progress bar on rank 0 (pass ``verbose=0`` to ``fit``), and TensorBoard
    logs on rank 0 when ``tensorboard_dir`` is given. ``batch_size`` (per rank)
    is needed only when a custom ``train_step`` bypasses Keras's loss tracker.
    Build the list the same way on every rank.
    """
    out: list[keras.callbacks.Callback] = [BroadcastInitialState(), MetricAverage()]
    if warmup_epochs:
        if base_lr is None:
            raise ValueError("callbacks(): warmup_epochs needs base_lr (the single-worker learning rate)")
        out.append(LearningRateWarmup(base_lr, warmup_epochs))
    if checkpoint_dir is not None:
        out.append(Checkpoint(checkpoint_dir, every_epochs=checkpoint_every, keep=keep_checkpoints))
    out += observability_callbacks(
        metrics=metrics, progress=progress, tensorboard_dir=tensorboard_dir, port=metrics_port, batch_size=batch_size
    )
    return out
