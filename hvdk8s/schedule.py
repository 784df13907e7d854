"""The in-step half of Horovod's learning-rate callbacks: each batch's rate, and SGD's momentum correction.

Horovod's rate callbacks assign the optimizer's rate in ``on_train_batch_begin``,
an eager TensorFlow assignment after every step: 180-300 µs per batch on the
2-core development VM (the first eager op after a compiled step waits ~150 µs),
2-3.5% of the digits CNN's step. Here a rate callback writes the rates of its
epoch's batches once per epoch (``RateTable.write``), and every step of a
``DistributedOptimizer`` sets the next batch's rate after its own update
(~14 µs inside the step), so the rate in the variable when a batch starts is
the one Horovod's callback would have assigned there.

Each ``DistributedOptimizer`` owns a ``RateSchedule`` (its ``rate_schedule``),
empty until a rate callback registers with it, so a step without rate
callbacks traces nothing of this. The table and the correction are plain
objects, invisible to Keras's and TensorFlow's tracking, so checkpoints and
exported models hold only the optimizer's own state. A train function compiled
before one of them existed does not contain it: rebuild it
(``fit_step.rebuild(model)``) when registering says it was created.
"""
from __future__ import annotations

import math
from collections.abc import Mapping

import keras
import tensorflow as tf


class MomentumCorrection:
    """Horovod's ``momentum_correction`` for SGD, inside the compiled step.

    While any rate callback that corrects momentum is in its epoch range
    (``set_active``, called per epoch, not per batch), each step first scales
    SGD's momentum buffers by this step's rate over the last step's (Goyal et
    al. 2017). Horovod changes the momentum hyperparameter for that one step
    instead; Keras 3 compiles ``momentum`` into the step as a constant, and for
    SGD without Nesterov both give the same update.
    """

    def __init__(self, optimizer: keras.optimizers.Optimizer) -> None:
        with tf.init_scope():
            lr = optimizer.learning_rate
            self.active = tf.Variable(False, trainable=False)
            self.last_lr = tf.Variable(tf.convert_to_tensor(lr), trainable=False)
        self._owners: set[object] = set()

    def set_active(self, owner: object, active: bool) -> None:
        """``owner`` (a rate callback) corrects in this epoch or not; the step corrects while any does."""
        if active:
            self._owners.add(owner)
        else:
            self._owners.discard(owner)
        self.active.assign(bool(self._owners))

    def scale(self, optimizer: keras.optimizers.Optimizer) -> None:
        """Traced into the step before the update."""
        lr = tf.cast(tf.convert_to_tensor(optimizer.learning_rate), self.last_lr.dtype)

        def scaled() -> tf.Tensor:
            ratio = tf.math.divide_no_nan(lr, self.last_lr) + tf.cast(tf.equal(self.last_lr, 0), lr.dtype)
            for buffer in optimizer.momentums:
                buffer.assign(buffer * tf.cast(ratio, buffer.dtype))
            return tf.constant(True)

        tf.cond(tf.logical_and(self.active, tf.not_equal(lr, self.last_lr)), scaled, lambda: tf.constant(False))
        self.last_lr.assign(lr)


class RateTable:
    """The rates of the current epoch's batches (NaN: the callbacks leave that batch's rate as it is).

    ``start`` is the optimizer's ``iterations`` when the epoch began; batch
    ``b`` of the epoch is the step with ``iterations - start == b``, which also
    holds with ``backward_passes_per_step`` (every pass counts) and within one
    ``steps_per_execution`` call.
    """

    def __init__(self) -> None:
        with tf.init_scope():
            self.rates = tf.Variable([math.nan], dtype=tf.float64, shape=tf.TensorShape([None]), trainable=False)
            self.start = tf.Variable(0, dtype=tf.int64, trainable=False)
        self._epoch_start: int | None = None
        self._values: list[float] = []

    def write(self, optimizer: keras.optimizers.Optimizer, rates: Mapping[int, float]) -> None:
        """Set these batches' rates in the epoch beginning now; per epoch, by each rate callback in range.

        Callbacks write in their list order, so a later callback's rate for a
        batch wins, as its later assignment does in Horovod.
        """
        now = int(optimizer.iterations.numpy())
        if now != self._epoch_start:  # the first writer of this epoch
            self._epoch_start, self._values = now, []
            self.start.assign(now)
        self._values += [math.nan] * (max(rates, default=-1) + 1 - len(self._values))
        for batch, rate in rates.items():
            self._values[batch] = rate
        self.rates.assign(self._values or [math.nan])

    def first(self) -> float | None:
        """The epoch's first batch's rate, if a callback set one (assigned eagerly when that batch starts)."""
        return None if not self._values or math.isnan(self._values[0]) else self._values[0]

    def set_next(self, optimizer: keras.optimizers.Optimizer) -> None:
        """Traced into the step after the update (``iterations`` already counts it): the next batch's rate."""
        lr = optimizer.learning_rate
        i = tf.cast(optimizer.iterations, tf.int64) - self.start
        n = tf.size(self.rates, out_type=tf.int64)
        rate = tf.gather(self.rates, tf.clip_by_value(i, 0, n - 1))
        keep = tf.logical_or(tf.logical_or(i < 0, i >= n), tf.math.is_nan(rate))
        lr.assign(tf.where(keep, tf.convert_to_tensor(lr), tf.cast(rate, lr.dtype)))


class RateSchedule:
    """A ``DistributedOptimizer``'s in-step rate machinery, which hvdk8s's rate callbacks register with.

    Each part is created by the first callback that asks for it and traced
    into the optimizer's step from then on (``before_update``,
    ``after_update``); until then the step holds none of it.
    """

    def __init__(self, optimizer: keras.optimizers.Optimizer) -> None:
        self._optimizer = optimizer
        self.table: RateTable | None = None
        self.correction: MomentumCorrection | None = None

    def rate_table(self) -> tuple[RateTable | None, bool]:
        """(the rate table, whether it was created now): ``None`` where the rate is not a variable (a schedule)."""
        if self.table is not None or not isinstance(self._optimizer.learning_rate, keras.Variable):
            return self.table, False
        self.table = RateTable()
        return self.table, True

    def momentum_correction(self) -> tuple[MomentumCorrection | None, bool]:
        """(the momentum correction, whether it was created now): ``None`` unless SGD with momentum, no Nesterov."""
        opt = self._optimizer
        if self.correction is not None or not (
            isinstance(opt, keras.optimizers.SGD) and opt.momentum and not opt.nesterov
        ):
            return self.correction, False
        self.correction = MomentumCorrection(opt)
        return self.correction, True

    def before_update(self) -> None:
        """Traced into the optimizer's step before its update."""
        if self.correction is not None:
            self.correction.scale(self._optimizer)

    def after_update(self) -> None:
        """Traced into the optimizer's step after its update."""
        if self.table is not None:
            self.table.set_next(self._optimizer)
