"""``fit``'s per-step call: hvdk8s's lean ``train_step(next(iterator))`` computes exactly what Keras's wrapper does.

Runs in-process on one Horovod rank; ``test_training.py`` trains the same
``fit`` (hvdk8s's callbacks install the call) on real ranks against plain
Keras.
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

# In the test process TensorFlow may already run (earlier in-process tests), so init cannot pin threads.
pytestmark = pytest.mark.filterwarnings("ignore:.*device and thread pinning skipped:UserWarning")


@pytest.fixture(scope="module")
def hvd():
    import hvdk8s

    hvdk8s.init(quiet=True)
    return hvdk8s


def compiled(hvd, backward_passes_per_step: int = 1, **compile_kw):
    """The digits CNN, seeded, compiled with the distributed (fused) SGD."""
    import keras

    model = hvd.models.cnn("cnn", input_shape=(8, 8, 1), seed=3)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9),
                                   backward_passes_per_step=backward_passes_per_step)
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy", metrics=["accuracy"], **compile_kw)
    return model


def data(batches: int = 6, known_length: bool = True):
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.random((batches * 8, 8, 8, 1), dtype=np.float32)
    y = rng.integers(0, 10, size=batches * 8)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    return ds if known_length else ds.filter(lambda *_: True)  # a filter hides the length from Keras


def step_counter():
    """A callback that counts batches per epoch, as ``fit``'s hooks see them."""
    import keras

    class StepCounter(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.steps: list[int] = []

        def on_epoch_begin(self, epoch, logs=None):
            self.steps.append(0)

        def on_train_batch_end(self, batch, logs=None):
            self.steps[-1] += 1

    return StepCounter()


def weights(model) -> list[np.ndarray]:
    import keras

    return [keras.ops.convert_to_numpy(v) for v in [*model.variables, *model.optimizer.variables]]


@pytest.mark.parametrize("known_length", [True, False])
@pytest.mark.filterwarnings("ignore:Your input ran out of data:UserWarning")  # Keras's, at an unknown length's end
def test_lean_call_trains_bit_for_bit_like_keras(hvd, known_length: bool) -> None:
    from hvdk8s.train.fit_step import LeanTrainFunction

    keras_model, lean_model = compiled(hvd), compiled(hvd)
    counts = []
    for model, callbacks in ((keras_model, []), (lean_model, [hvd.callbacks.BroadcastGlobalVariablesCallback(0)])):
        count = step_counter()
        history = model.fit(data(known_length=known_length), epochs=3, verbose=0, callbacks=[*callbacks, count])
        counts.append((count.steps, history.history))
    assert not isinstance(keras_model.train_function, LeanTrainFunction)
    assert isinstance(lean_model.train_function, LeanTrainFunction)
    assert counts[0] == counts[1] and counts[0][0] == [6, 6, 6]  # same epochs (end of data included), same logs
    for want, got in zip(weights(keras_model), weights(lean_model), strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.filterwarnings("ignore:Your input ran out of data:UserWarning")
def test_a_step_call_that_got_no_batch_counts_no_backward_pass(hvd) -> None:
    """``backward_passes_per_step=2`` over 4 batches an epoch. With data of unknown length ``fit`` ends each epoch
    with a call whose ``next(iterator)`` raises OutOfRangeError; the pass counter must not count it (it did, so
    epoch 1's first pass updated alone): the weights, momentums and ``iterations`` are those of known-length data."""
    models = []
    for known_length in (True, False):
        model = compiled(hvd, backward_passes_per_step=2)
        broadcast = hvd.callbacks.BroadcastGlobalVariablesCallback(0)
        model.fit(data(4, known_length), epochs=2, verbose=0, callbacks=[broadcast])
        models.append(model)
    assert int(models[1].optimizer.iterations.numpy()) == 8
    for want, got in zip(weights(models[0]), weights(models[1]), strict=True):
        np.testing.assert_array_equal(got, want)


def test_lean_step_has_one_batch_read_and_no_optional(hvd) -> None:
    model = compiled(hvd)
    model.fit(data(), epochs=1, verbose=0, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    step = model.train_function.step
    graph = step.get_concrete_function(iter(data())).graph
    ops = Counter(op.type for op in graph.get_operations())
    for function in graph.as_graph_def().library.function:
        ops.update(node.op for node in function.node_def)
    assert ops["IteratorGetNext"] == 1
    assert not [op for op in ops if op.startswith("Optional")], ops


def test_one_installed_call_serves_later_fits_and_train_on_batch(hvd) -> None:
    model = compiled(hvd)
    cb = [hvd.callbacks.BroadcastGlobalVariablesCallback(0)]
    model.fit(data(), epochs=1, verbose=0, callbacks=cb)
    first = model.train_function
    traces = first.step.experimental_get_tracing_count()
    model.fit(data(), epochs=1, verbose=0, callbacks=cb)
    assert model.train_function is first and first.step.experimental_get_tracing_count() == traces
    x, y = next(iter(data()))
    before = weights(model)
    logs = model.train_on_batch(x, y, return_dict=True)  # a generator, not an iterator: Keras's own function
    assert set(logs) == {"loss", "accuracy"}
    assert any(not np.array_equal(a, b) for a, b in zip(before, weights(model)))
    model.compile(optimizer=model.optimizer, loss="sparse_categorical_crossentropy")
    assert model.train_function is None  # recompiling resets it, and the next fit installs a new one
    model.fit(data(), epochs=1, verbose=0, callbacks=cb)
    assert model.train_function is not first


@pytest.mark.parametrize("compile_kw", [{"steps_per_execution": 2}, {"run_eagerly": True}])
def test_keras_call_kept_where_lean_would_differ(hvd, compile_kw: dict) -> None:
    from hvdk8s.train.fit_step import LeanTrainFunction

    model = compiled(hvd, **compile_kw)
    count = step_counter()
    model.fit(data(), epochs=1, verbose=0, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), count])
    assert not isinstance(model.train_function, LeanTrainFunction)
    assert sum(count.steps) == 6 // compile_kw.get("steps_per_execution", 1)


def test_rate_callback_rebuild_keeps_lean_call(hvd) -> None:
    """The warm-up's momentum correction forces a new train function: it is lean again, and traces the correction."""
    from hvdk8s.train.fit_step import LeanTrainFunction

    model = compiled(hvd)
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                 hvd.callbacks.LearningRateWarmupCallback(0.05, warmup_epochs=2)]
    model.fit(data(), epochs=1, verbose=0, callbacks=callbacks)
    assert isinstance(model.train_function, LeanTrainFunction)
    correction = model.optimizer.rate_schedule.correction
    captured = {id(t) for t in model.train_function.step.get_concrete_function(iter(data())).captured_inputs}
    assert id(correction.last_lr.handle) in captured


def test_broadcast_callback_leaves_a_keras_models_step_as_keras_made_it(hvd) -> None:
    """With a plain Keras optimizer there are no collectives in the step: XLA and Keras's train function stay."""
    import keras

    from hvdk8s.train.fit_step import LeanTrainFunction

    model = hvd.models.cnn("cnn", input_shape=(8, 8, 1), seed=3)
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="sparse_categorical_crossentropy", jit_compile=True)
    model.fit(data(), epochs=1, verbose=0, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    assert model.jit_compile is True and not isinstance(model.train_function, LeanTrainFunction)


@pytest.mark.parametrize("how", ["metric_average", "install"])
def test_a_distributed_model_gets_horovods_step_without_the_broadcast_callback(hvd, how: str) -> None:
    """Any of hvdk8s's Horovod callbacks, or ``fit_step.install`` called directly, switches XLA off (Horovod's
    ops cannot be compiled: with XLA on, this fit fails) and installs the lean call."""
    from hvdk8s.train import fit_step
    from hvdk8s.train.fit_step import LeanTrainFunction

    model = compiled(hvd, jit_compile=True)
    callbacks = []
    with pytest.warns(UserWarning, match="XLA"):
        if how == "install":
            fit_step.install(model)
        else:
            callbacks = [hvd.callbacks.MetricAverageCallback()]
        history = model.fit(data(), epochs=1, verbose=0, callbacks=callbacks)
    assert model.jit_compile is False and isinstance(model.train_function, LeanTrainFunction)
    assert np.isfinite(history.history["loss"]).all() and int(model.optimizer.iterations.numpy()) == 6


def test_lean_call_takes_batches_holding_none(hvd) -> None:
    """A generator yielding ``(x, y, None)``: Keras's adapters put a ``tf.experimental.Optional`` where the batch
    holds ``None``, and Keras's own function hands ``train_step`` the ``None`` back; so does the lean call."""
    import keras
    from packaging.version import Version

    from hvdk8s.train.fit_step import LeanTrainFunction

    # Keras 3.12 added the placeholder and the conversion (absent in the 3.11.3 wheel, present in 3.12.0's).
    if Version(keras.version()) < Version("3.12"):
        pytest.skip(f"Keras {keras.version()} takes no None in a generator's batch: its own fit fails on one as well")
    rng = np.random.default_rng(0)
    x, y = rng.random((8, 8, 8, 1), dtype=np.float32), rng.integers(0, 10, size=8)

    def batches():
        while True:
            yield x, y, None

    keras_model, lean_model = compiled(hvd), compiled(hvd)
    for model, callbacks in ((keras_model, []), (lean_model, [hvd.callbacks.BroadcastGlobalVariablesCallback(0)])):
        model.fit(batches(), steps_per_epoch=3, epochs=1, verbose=0, shuffle=False, callbacks=callbacks)
    assert isinstance(lean_model.train_function, LeanTrainFunction)
    assert int(lean_model.optimizer.iterations.numpy()) == 3
    for want, got in zip(weights(keras_model), weights(lean_model), strict=True):
        np.testing.assert_array_equal(got, want)
