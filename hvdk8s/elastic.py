"""Elastic training for Keras 3 on Horovod's elastic driver (``horovodrun --min-np/--max-np``).

Horovod's ``TensorFlowKerasState`` calls ``optimizer.variables()``, which is a
list in Keras 3, and its ``run`` only recognises failures of ops named
``HorovodAllreduce``/``Allgather``/``Broadcast``, so a failed
``HorovodGroupedAllreduce`` (what hvdk8s uses) never triggered a reset, and
any other ``UnknownError`` was swallowed. This module keeps Horovod's driver
protocol (``ObjectState``, ``run_fn``) and fixes both.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf
from horovod.tensorflow.elastic import HorovodInternalError, ObjectState, run_fn

from hvdk8s import collectives


class KerasState(ObjectState):
    """Model weights, optimizer state and any extra attributes (``epoch=0``) kept in sync.

    ``commit()`` copies the variables to host memory; after a worker is lost the
    survivors ``restore()`` the last commit, and ``sync()`` brings new workers
    to rank 0's state.
    """

    def __init__(self, model: keras.Model, optimizer: keras.optimizers.Optimizer | None = None, **kwargs: Any) -> None:
        self.model = model
        self.optimizer = optimizer or model.optimizer
        if not self.optimizer.built:
            self.optimizer.build(model.trainable_variables)
        self._values = self._read()
        super().__init__(bcast_object=collectives.broadcast_object, get_rank=hvd.rank, **kwargs)

    def _variables(self) -> list[keras.Variable]:
        return list(self.model.variables) + list(self.optimizer.variables)

    def _read(self) -> list[np.ndarray]:
        return [np.array(v.numpy()) for v in self._variables()]

    def save(self) -> None:
        self._values = self._read()
        super().save()

    def restore(self) -> None:
        for var, value in zip(self._variables(), self._values):
            var.assign(value)
        super().restore()

    def sync(self) -> None:
        collectives.broadcast_variables(self._variables())
        self._values = self._read()
        super().sync()


class CommitState(keras.callbacks.Callback):
    """Commit at every epoch end (recording the epoch) and check for host changes every N batches."""

    def __init__(self, state: KerasState, check_every_batches: int = 10) -> None:
        super().__init__()
        self.state = state
        self.check_every_batches = check_every_batches

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if (batch + 1) % self.check_every_batches == 0:
            self.state.check_host_updates()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.state.epoch = epoch + 1
        self.state.commit()


def _reset() -> None:
    hvd.shutdown()
    hvd.init()


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator: run ``func(state, ...)`` again, from the last commit, whenever workers change."""

    @functools.wraps(func)
    def wrapper(state: KerasState, *args: Any, **kwargs: Any) -> Any:
        try:
            return func(state, *args, **kwargs)
        except tf.errors.UnknownError as err:
            if "Horovod" in err.message:
                raise HorovodInternalError(err) from err
            raise

    return run_fn(wrapper, _reset)
