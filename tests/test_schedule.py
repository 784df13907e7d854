"""Horovod's rate callbacks with the rate set inside the step: every step trains with its batch's rate.

In-process, one Horovod rank (the reduction is a no-op there).
``test_horovod_api.py`` compares the rate seen at each batch's start with
Horovod's own callback code on two ranks.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

# In the test process TensorFlow may already run (earlier in-process tests), so init cannot pin threads.
pytestmark = [pytest.mark.unit, pytest.mark.filterwarnings("ignore:.*device and thread pinning skipped:UserWarning")]

STEPS, EPOCHS = 6, 3


@pytest.fixture(scope="module")
def hvd():
    import hvdk8s

    hvdk8s.init(quiet=True)
    return hvdk8s


def rate(epoch: int, batch: int) -> float:
    """Horovod's non-staircase schedule below: 0.3 / (1 + epoch + batch / steps)."""
    return 0.3 / (1 + epoch + batch / STEPS)


@pytest.mark.parametrize("steps_per_execution", [1, 3])
def test_each_step_trains_with_its_batchs_rate(hvd, steps_per_execution: int) -> None:
    """w is one weight with gradient 1 per step, so SGD leaves w0 - (the sum of the rates the steps used).

    With 3 steps per compiled call the batch hooks run once per call; the
    steps in between still train with their own batch's rate.
    """
    import keras
    import tensorflow as tf

    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")])
    model.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(1.0)), loss=lambda y, pred: tf.reduce_mean(pred),
                  steps_per_execution=steps_per_execution)
    ones = np.ones((STEPS, 1), np.float32)
    schedule = hvd.callbacks.LearningRateScheduleCallback(0.3, multiplier=lambda e: 1 / (1 + e), staircase=False)
    model.fit(ones, ones, batch_size=1, epochs=EPOCHS, shuffle=False, verbose=0, callbacks=[schedule])
    used = [np.float32(rate(e, b)) for e in range(EPOCHS) for b in range(STEPS)]
    np.testing.assert_allclose(model.get_weights()[0].item(), -np.sum(used, dtype=np.float32), rtol=1e-6)
    assert float(model.optimizer.learning_rate.numpy()) == np.float32(rate(EPOCHS - 1, STEPS - 1))


def test_rate_table_sets_only_rates_of_its_epoch(hvd) -> None:
    import keras

    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.5))
    opt.build([keras.Variable(np.zeros(2, np.float32))])
    table, created = opt.rate_schedule.rate_table()
    assert created and opt.rate_schedule.rate_table() == (table, False)
    table.write({0: 0.1, 1: 0.2, 3: 0.4})
    table.write({1: 0.25})  # a later callback in the same epoch (no step between): its batch wins
    assert table.first() == 0.1
    seen = []
    for _ in range(5):  # after batches 0..3, then past the epoch
        table.set_next(opt)
        seen.append(float(opt.learning_rate.numpy()))
    # batch 1: 0.25; batch 2 has no rate (kept); batch 3: 0.4; then nothing to set
    assert seen == [np.float32(0.25), np.float32(0.25), np.float32(0.4), np.float32(0.4), np.float32(0.4)]
    table.write({})  # steps ran since: a new epoch, with no rates
    assert table.first() is None and math.isnan(float(table.rates.numpy()[0])) and int(table.step.numpy()) == 0


def test_no_table_where_the_rate_is_a_schedule(hvd) -> None:
    import keras

    decay = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=10, decay_rate=0.9)
    assert hvd.DistributedOptimizer(keras.optimizers.SGD(decay)).rate_schedule.rate_table() == (None, False)


def test_rate_machinery_and_pass_state_are_the_optimizers_own(hvd, tmp_path) -> None:
    """The optimizer declares its state (nothing hung on its ``__dict__`` from outside); its rate schedule
    is empty, so its step traces none of it, until a rate callback registers; checkpoints hold Keras's state only."""
    import keras
    import tensorflow as tf

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, name="shared"), keras.layers.Dense(1)])
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), backward_passes_per_step=2)
    opt.register_local_var(model.layers[0].kernel)
    model.compile(opt, loss="mse")
    assert (opt.rate_schedule.table, opt.rate_schedule.correction) == (None, None)
    ones = np.ones((8, 2), np.float32)
    warmup = hvd.callbacks.LearningRateWarmupCallback(0.1, warmup_epochs=1)
    model.fit(ones, ones[:, :1], batch_size=2, verbose=0, callbacks=[warmup])
    assert opt.rate_schedule.table is warmup._rates and opt.rate_schedule.correction is warmup._correction
    assert opt.distributed_state.accumulators is not None and len(opt.distributed_state.local_keys) == 1
    assert not [key for key in vars(opt) if key.startswith("_hvdk8s")]
    assert int(opt.iterations.numpy()) == 4
    path = tf.train.Checkpoint(optimizer=opt).save(str(tmp_path / "ckpt"))
    saved = [name for name, _ in tf.train.list_variables(path) if name.startswith("optimizer/")]
    # iterations, rate and momentums, and references to the model's variables: no accumulator, table or correction
    assert len(opt.variables) == 2 + len(model.trainable_variables)
    assert len(saved) == len(opt.variables) + len(model.trainable_variables)


def fit_one_weight(hvd, policy: str, xs: np.ndarray, momentum: float, callback=None, epochs: int = EPOCHS,
                   unknown_length: bool = False, steps_per_execution: int = 1, watch=()):
    """fit the one-weight model of the first test under ``policy``, by default with its schedule, one batch per
    row of ``xs`` (from a dataset whose length Keras cannot know, with ``unknown_length``)."""
    import keras
    import tensorflow as tf

    keras.mixed_precision.set_global_policy(policy)
    try:
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")])
        model.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(1.0, momentum=momentum)),
                      loss=lambda y, pred: tf.reduce_mean(pred), steps_per_execution=steps_per_execution)
        schedule = callback or hvd.callbacks.LearningRateScheduleCallback(0.3, lambda e: 1 / (1 + e), staircase=False)
        callbacks = [schedule, *watch]
        if unknown_length:
            data = tf.data.Dataset.from_tensor_slices((xs, xs)).batch(1).filter(lambda *_: True)
            model.fit(data, epochs=epochs, verbose=0, callbacks=callbacks)
        else:
            model.fit(xs, xs, batch_size=1, epochs=epochs, shuffle=False, verbose=0, callbacks=callbacks)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    return model, schedule


def watcher(read):
    """A callback that records ``(epoch, batch, read(model))`` when each batch (step call) begins, and
    ``(epoch, "end", read(model))`` when each epoch ends."""
    import keras

    class Watcher(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[tuple] = []
            self.epoch = -1

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_begin(self, batch, logs=None):
            self.seen.append((self.epoch, batch, read(self.model)))

        def on_epoch_end(self, epoch, logs=None):
            self.seen.append((epoch, "end", read(self.model)))

    return Watcher()


def test_under_mixed_float16_the_rates_are_set_in_the_step_and_momentum_is_corrected(hvd) -> None:
    """``compile`` wraps the DistributedOptimizer in a LossScaleOptimizer: the callback registers with the
    inner optimizer's rate schedule, so the rate changes inside the step and SGD's momentum is corrected
    as in float32 (the gradient, 1 per step, is exact in float16)."""
    ones = np.ones((STEPS, 1), np.float32)
    reference, _ = fit_one_weight(hvd, "float32", ones, momentum=0.9)
    model, schedule = fit_one_weight(hvd, "mixed_float16", ones, momentum=0.9)
    inner = model.optimizer.inner_optimizer
    assert schedule._rates is not None and inner.rate_schedule.table is schedule._rates
    assert schedule._correction is not None and inner.rate_schedule.correction is schedule._correction
    np.testing.assert_allclose(model.get_weights()[0], reference.get_weights()[0], rtol=1e-6)


def test_a_step_the_loss_scale_skips_still_moves_the_rate_to_the_next_batch(hvd) -> None:
    """Batch 2 of each epoch overflows float16 and is skipped (``iterations`` does not count it); each later
    batch still trains with its own batch's rate, as Horovod's per-batch assignment gives it."""
    xs = np.ones((STEPS, 1), np.float32)
    xs[2] = 1000.0  # × the loss scale (2**15 and its halvings): inf in float16
    model, _ = fit_one_weight(hvd, "mixed_float16", xs, momentum=0.0)
    # the inner optimizer's count: Keras 3.8's LossScaleOptimizer has an iterations of its own, never advanced
    assert int(model.optimizer.inner_optimizer.iterations.numpy()) == EPOCHS * (STEPS - 1)
    used = [np.float32(rate(e, b)) for e in range(EPOCHS) for b in range(STEPS) if b != 2]
    np.testing.assert_allclose(model.get_weights()[0].item(), -np.sum(used, dtype=np.float32), rtol=1e-6)


def test_an_epoch_outside_the_range_keeps_the_last_rate_when_the_table_was_longer(hvd) -> None:
    """``steps_per_epoch=8`` over 4 batches: Horovod's callback assigns nothing in epoch 1 (past ``end_epoch``),
    so all its batches train with epoch 0's last rate, 1 / (1 + 3/8); none with the table's unused tail."""
    schedule = hvd.callbacks.LearningRateScheduleCallback(1.0, lambda e: 1 / (1 + e), end_epoch=1, staircase=False,
                                                          steps_per_epoch=8)
    model, _ = fit_one_weight(hvd, "float32", np.ones((4, 1), np.float32), 0.0, schedule, epochs=2)
    used = [np.float32(1 / (1 + b / 8)) for b in range(4)] + [np.float32(1 / (1 + 3 / 8))] * 4
    np.testing.assert_allclose(model.get_weights()[0].item(), -np.sum(used, dtype=np.float32), rtol=1e-6)
    assert float(model.optimizer.learning_rate.numpy()) == np.float32(1 / (1 + 3 / 8))


def past_end_epoch(hvd):
    """``end_epoch=1`` with ``steps_per_epoch=8`` (over 4 batches): the schedule of the tests below."""
    return hvd.callbacks.LearningRateScheduleCallback(1.0, lambda e: 1 / (1 + e), end_epoch=1, staircase=False,
                                                      steps_per_epoch=8)


@pytest.mark.filterwarnings("ignore:Your input ran out of data:UserWarning")  # Keras's, at an unknown length's end
@pytest.mark.parametrize("policy,steps_per_execution", [("float32", 1), ("mixed_float16", 1), ("float32", 3)])
def test_a_step_call_that_got_no_batch_leaves_the_rate(hvd, policy: str, steps_per_execution: int) -> None:
    """Data of unknown length: ``fit`` ends each epoch with a call whose ``next(iterator)`` raises OutOfRangeError,
    after ``on_train_batch_begin(4)``, where Horovod's callback assigns 1 / (1 + 4/8); past ``end_epoch`` it assigns
    nothing, so all of epoch 1 trains at that rate. The step's own rate update must not run in that call (in
    float32 it did, moving the rate on to the table's 1 / (1 + 5/8)). Under mixed_float16 (the loss scale's step)
    and with Keras's call of 3 steps (it reads its batches as optionals and runs no step without one) the same
    must hold."""
    import keras

    watch = watcher(lambda model: float(keras.ops.convert_to_numpy(model.optimizer.learning_rate)))
    model, _ = fit_one_weight(hvd, policy, np.ones((4, 1), np.float32), 0.0, past_end_epoch(hvd), epochs=2,
                              unknown_length=True, steps_per_execution=steps_per_execution, watch=[watch])
    last = np.float32(1 / (1 + 4 / 8))
    epoch1 = [rate for epoch, _, rate in watch.seen if epoch == 1]
    assert epoch1 and epoch1 == [last] * len(epoch1)
    used = [np.float32(1 / (1 + b / 8)) for b in range(4)] + [last] * 4
    np.testing.assert_allclose(model.get_weights()[0].item(), -np.sum(used, dtype=np.float32), rtol=1e-6)


@pytest.mark.filterwarnings("ignore:Your input ran out of data:UserWarning")
def test_a_step_call_that_got_no_batch_leaves_the_momentum(hvd) -> None:
    """The momentum correction in that call (epoch 0's last, the rate 1 / (1 + 4/8) against the last step's
    1 / (1 + 3/8)) rescaled SGD's momentum buffer, though no step ran: it must stay as the last step left it."""
    import keras

    def momentum(model) -> float | None:  # Keras builds the optimizer in the first step
        return keras.ops.convert_to_numpy(model.optimizer.momentums[0]).item() if model.optimizer.built else None

    watch = watcher(momentum)
    fit_one_weight(hvd, "float32", np.ones((4, 1), np.float32), 0.9, past_end_epoch(hvd), epochs=1,
                   unknown_length=True, watch=[watch])
    assert [when for _, when, _ in watch.seen] == [0, 1, 2, 3, 4, "end"]  # 4: the call that gets no batch
    assert watch.seen[-1][2] == watch.seen[-2][2] not in (0.0, None)
