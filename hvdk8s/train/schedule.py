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

from hvdk8s.train import keras_compat


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
            for buffer in keras_compat.sgd_momentums(optimizer):
                buffer.assign(buffer * tf.cast(ratio, buffer.dtype))
            return tf.constant(True)

        tf.cond(tf.logical_and(self.active, tf.not_equal(lr, self.last_lr)), scaled, lambda: tf.constant(False))
        self.last_lr.assign(lr)


class RateTable:
    """The rates of the current epoch's batches (NaN: the callbacks leave that batch's rate as it is).

    ``step`` counts the steps run since the epoch's rates were written, so it
    is the index of the next batch. The step counts itself (``set_next``)
    rather than reading the optimizer's ``iterations``, which a
    ``LossScaleOptimizer``'s skipped step does not advance; every backward pass
    (``backward_passes_per_step``) and every step of a ``steps_per_execution``
    call counts.
    """

    def __init__(self) -> None:
        with tf.init_scope():
            self.rates = tf.Variable([math.nan], dtype=tf.float64, shape=tf.TensorShape([None]), trainable=False)
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False)
        self._values: list[float] = []

    def write(self, rates: Mapping[int, float]) -> None:
        """Set these batches' rates in the epoch beginning now; per epoch, by each rate callback.

        The first writer after a step starts the epoch's table afresh; callbacks
        write in their list order, so a later callback's rate for a batch wins,
        as its later assignment does in Horovod.
        """
        if int(self.step.numpy()):  # steps ran since the last write: a new epoch
            self._values = []
            self.step.assign(0)
        self._values += [math.nan] * (max(rates, default=-1) + 1 - len(self._values))
        for batch, rate in rates.items():
            self._values[batch] = rate
        self.rates.assign(self._values or [math.nan])

    def first(self) -> float | None:
        """The epoch's first batch's rate, if a callback set one (assigned eagerly when that batch starts)."""
        return None if not self._values or math.isnan(self._values[0]) else self._values[0]

    def set_next(self, optimizer: keras.optimizers.Optimizer) -> None:
        """Traced into the step after the update (or the loss scale's skip): the next batch's rate."""
        lr = optimizer.learning_rate
        self.step.assign_add(1)
        i = self.step.read_value()
        n = tf.size(self.rates, out_type=tf.int64)
        rate = tf.gather(self.rates, tf.minimum(i, n - 1))
        keep = tf.logical_or(i >= n, tf.math.is_nan(rate))
        lr.assign(tf.where(keep, tf.convert_to_tensor(lr), tf.cast(rate, lr.dtype)))


class RateSchedule:
    """A ``DistributedOptimizer``'s in-step rate machinery, which hvdk8s's rate callbacks register with.

    Each part is created by the first callback that asks for it and traced
    into the optimizer's step from then on (``before_update``,
    ``after_update``); until then the step holds none of it. The optimizer
    traces both to wait for the step's gradients, so a step call that got no
    batch (``fit``'s last one in an epoch of data of unknown length) neither
    counts in the table nor corrects momentum.
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
