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


def fit_one_weight(hvd, policy: str, xs: np.ndarray, momentum: float, callback=None, epochs: int = EPOCHS):
    """fit the one-weight model of the first test under ``policy``, by default with its schedule."""
    import keras
    import tensorflow as tf

    keras.mixed_precision.set_global_policy(policy)
    try:
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")])
        model.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(1.0, momentum=momentum)),
                      loss=lambda y, pred: tf.reduce_mean(pred))
        schedule = callback or hvd.callbacks.LearningRateScheduleCallback(0.3, lambda e: 1 / (1 + e), staircase=False)
        model.fit(xs, xs, batch_size=1, epochs=epochs, shuffle=False, verbose=0, callbacks=[schedule])
    finally:
        keras.mixed_precision.set_global_policy("float32")
    return model, schedule


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
    assert int(model.optimizer.iterations.numpy()) == EPOCHS * (STEPS - 1)
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
