"""``LeanTrainFunction`` calls the concrete step directly after the first call on an iterator: same results as Keras.

In-process, one Horovod rank, like ``test_fit_step.py``.
"""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.filterwarnings("ignore:.*device and thread pinning skipped:UserWarning")


@pytest.fixture(scope="module")
def hvd():
    import hvdk8s

    hvdk8s.init(quiet=True)
    return hvdk8s


def compiled(hvd):
    import keras

    model = hvd.models.cnn("cnn", input_shape=(8, 8, 1), seed=3)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def data(dtype: str = "float32", repeat: bool = False):
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.random((48, 8, 8, 1)).astype(dtype)
    y = rng.integers(0, 10, size=48)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    return ds.repeat() if repeat else ds


def weights(model) -> list[np.ndarray]:
    import keras

    return [keras.ops.convert_to_numpy(v) for v in [*model.variables, *model.optimizer.variables]]


def test_direct_calls_train_bit_for_bit_like_keras_across_epochs_and_datasets(hvd) -> None:
    """``steps_per_epoch`` keeps one iterator over epochs (direct calls throughout); a second fit on float64 data
    has another element spec, so the step must switch to that data's own concrete function."""
    from hvdk8s.train.fit_step import LeanTrainFunction

    keras_model, lean_model = compiled(hvd), compiled(hvd)
    histories, traces = [], []
    for model, callbacks in ((keras_model, []), (lean_model, [hvd.callbacks.BroadcastGlobalVariablesCallback(0)])):
        first = model.fit(data(repeat=True), steps_per_epoch=4, epochs=3, verbose=0, callbacks=callbacks)
        traces.append(model.train_function.step.experimental_get_tracing_count() if model is lean_model else 0)
        second = model.fit(data("float64"), epochs=2, verbose=0, callbacks=callbacks)
        histories.append((first.history, second.history))
    assert isinstance(lean_model.train_function, LeanTrainFunction)
    assert lean_model.train_function.step.experimental_get_tracing_count() == traces[1] + 1  # float64: one more
    assert histories[0] == histories[1]
    for want, got in zip(weights(keras_model), weights(lean_model), strict=True):
        np.testing.assert_array_equal(got, want)


class CountingStep:
    """A ``tf.function`` stand-in that counts the calls dispatched through it."""

    def __init__(self, function) -> None:
        self.function, self.calls = function, 0

    def __call__(self, iterator):
        self.calls += 1
        return self.function(iterator)

    def get_concrete_function(self, iterator):
        return self.function.get_concrete_function(iterator)


def test_the_direct_path_serves_every_call_after_the_first_on_an_iterator(hvd, monkeypatch) -> None:
    model = compiled(hvd)
    model.fit(data(repeat=True), steps_per_epoch=2, epochs=1, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    lean = model.train_function
    counting = CountingStep(lean.step)
    monkeypatch.setattr(lean, "step", counting)
    iterator = iter(data(repeat=True))
    for _ in range(5):
        lean(iterator)
    assert counting.calls == 1  # the first call; the other four went to the concrete function
    assert int(model.optimizer.iterations.numpy()) == 2 + 5
    lean(iter(data(repeat=True)))  # a new iterator: dispatched again
    assert counting.calls == 2
