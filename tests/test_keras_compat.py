"""What hvdk8s relies on in Keras beyond its documentation (``hvdk8s/train/keras_compat.py``): one test per use.

Each test fails when Keras changes the behaviour that one function of ``keras_compat`` relies on, so a new
Keras release shows at once which of hvdk8s's assumptions broke. They run on every supported stack (the
Makefile's ``CORE_TESTS``: ``make test-stack TF=2.18`` runs them under Keras 3.8). The last test keeps
those uses in ``keras_compat``: it fails when a Keras-private module or attribute, a ``__class__``
assignment or a walk up the call stack appears in any other file of the package.
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import REPO, package_dirs

pytestmark = pytest.mark.unit

X = np.random.default_rng(0).normal(size=(8, 3)).astype("float32")
Y = np.random.default_rng(1).normal(size=(8, 2)).astype("float32")


@pytest.fixture
def mixed_float16() -> Iterator[None]:
    import keras

    before = keras.config.dtype_policy().name
    keras.config.set_dtype_policy("mixed_float16")
    try:
        yield
    finally:
        keras.config.set_dtype_policy(before)


def model_with(optimizer: Any) -> Any:
    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=optimizer, loss="mse")
    return model


def values(variables: Any) -> list[np.ndarray]:
    return [np.array(v.numpy()) for v in variables]


# --- optimizers -------------------------------------------------------------------------------------------------


class _Mixin:
    """Adds nothing Keras would see: the subclass must save and load as its base."""

    def hvdk8s_marker(self) -> bool:
        return True


def test_a_subclass_named_like_its_base_is_saved_as_the_base_and_loads_with_plain_keras(tmp_path: Path) -> None:
    """``distributed_subclass``: Keras saves an unexported class by module and name, and loads it from there."""
    import keras

    from hvdk8s.train import keras_compat

    cls = keras_compat.distributed_subclass(keras.optimizers.SGD, (_Mixin,), {"setting": 1})
    assert cls.__name__ == "SGD" and cls.__module__ == keras.optimizers.SGD.__module__ and cls.setting == 1
    config = keras.saving.serialize_keras_object(cls(0.1))
    assert (config["module"], config["class_name"], config["registered_name"]) == (
        keras.optimizers.SGD.__module__, "SGD", "SGD",
    )  # fmt: skip
    assert type(keras.saving.deserialize_keras_object(config)) is keras.optimizers.SGD
    model = model_with(cls(0.1, momentum=0.9))
    model.fit(X, Y, batch_size=4, epochs=1, verbose=0)
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    assert type(loaded.optimizer) is keras.optimizers.SGD and int(loaded.optimizer.iterations.numpy()) == 2
    for saved, restored in zip(values(model.optimizer.variables), values(loaded.optimizer.variables), strict=True):
        np.testing.assert_array_equal(saved, restored)


def test_every_update_goes_through_apply() -> None:
    """``distributed_subclass``: ``fit``, ``apply_gradients`` and a ``LossScaleOptimizer`` all reach ``apply``."""
    import keras

    from hvdk8s.train import keras_compat

    calls: list[str] = []

    class Counting:
        def apply(self, grads: Any, trainable_variables: Any = None) -> Any:
            calls.append("apply")
            return super().apply(grads, trainable_variables)  # type: ignore[misc]

    cls = keras_compat.distributed_subclass(keras.optimizers.SGD, (Counting,))
    model = model_with(cls(0.1))
    model.fit(X, Y, batch_size=4, epochs=1, verbose=0)  # two steps, traced once: apply runs in the trace
    assert calls and int(model.optimizer.iterations.numpy()) == 2
    calls.clear()
    variable = keras.Variable(np.ones(2, "float32"))
    opt = cls(0.1)
    opt.apply_gradients([(np.ones(2, "float32"), variable)])
    assert calls == ["apply"]
    calls.clear()
    wrapper = keras.optimizers.LossScaleOptimizer(cls(0.1))
    wrapper.apply([np.ones(2, "float32")], [variable])
    assert calls == ["apply"]


def test_loss_scale_decides_in_check_finite_then_applies_the_inner_optimizer_once() -> None:
    """``loss_scale_subclass``: ``apply`` asks ``check_finite``, then calls the inner ``apply`` with unscaled
    gradients, or halves the scale without it."""
    import keras

    from hvdk8s.train import keras_compat

    events: list[Any] = []

    class Inner(keras.optimizers.SGD):
        def apply(self, grads: Any, trainable_variables: Any = None) -> Any:
            events.append(("inner apply", [float(np.array(g).sum()) for g in grads]))
            return super().apply(grads, trainable_variables)

    class Deciding:
        def check_finite(self, grads: Any) -> Any:
            events.append("check_finite")
            return super().check_finite(grads)  # type: ignore[misc]

    cls = keras_compat.loss_scale_subclass(keras.optimizers.LossScaleOptimizer, Deciding)
    assert cls.__name__ == "LossScaleOptimizer" and issubclass(cls, keras.optimizers.LossScaleOptimizer)
    wrapper = cls(Inner(0.1), initial_scale=4.0)
    variable = keras.Variable(np.zeros(2, "float32"))
    wrapper.build([variable])
    wrapper.apply([np.array([4.0, 8.0], "float32")], [variable])
    assert events == ["check_finite", ("inner apply", [3.0])]  # (4 + 8) / 4
    events.clear()
    wrapper.apply([np.array([np.inf, 8.0], "float32")], [variable])
    assert events == ["check_finite"] and float(wrapper.dynamic_scale.numpy()) == 2.0


def test_class_switch_keeps_the_optimizer_s_identity_state_and_config() -> None:
    """``reclass``: assigning ``__class__`` to a Keras optimizer keeps its variables, values and config."""
    import keras

    from hvdk8s.train import keras_compat

    wrapper = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), initial_scale=8.0)
    model = model_with(wrapper)
    model.fit(X, Y, batch_size=8, epochs=1, verbose=0)
    variables, before, config = list(wrapper.variables), values(wrapper.variables), wrapper.get_config()
    keras_compat.reclass(wrapper, keras_compat.distributed_subclass(type(wrapper), (_Mixin,)))
    assert model.optimizer is wrapper and wrapper.hvdk8s_marker()
    assert isinstance(wrapper, keras.optimizers.LossScaleOptimizer) and type(wrapper).__name__ == "LossScaleOptimizer"
    assert all(a is b for a, b in zip(wrapper.variables, variables, strict=True))
    for got, want in zip(values(wrapper.variables), before, strict=True):
        np.testing.assert_array_equal(got, want)
    assert wrapper.get_config() == config
    model.fit(X, Y, batch_size=8, epochs=1, verbose=0)  # the step is traced anew with the switched class
    assert int(wrapper.inner_optimizer.iterations.numpy()) == 2  # (the wrapper's own iterations: Keras 3.15 only)
    with pytest.raises(TypeError):
        keras_compat.reclass(wrapper, keras.optimizers.SGD)


def test_loss_scale_builds_its_inner_optimizer_from_its_own_build(mixed_float16: None) -> None:
    """``wrapping_loss_scale``: the wrapper is ``self`` of a frame above its inner optimizer's ``build``, when
    built by hand and when ``fit`` builds the wrapper ``compile`` made."""
    import keras

    from hvdk8s.train import keras_compat

    found: list[Any] = []

    class Finding(keras.optimizers.SGD):
        def build(self, variables: Any) -> None:
            super().build(variables)
            found.append(keras_compat.wrapping_loss_scale(self))

    variable = keras.Variable(np.zeros(2, "float32"))
    alone = Finding(0.1)
    alone.build([variable])
    assert found == [None]
    wrapper = keras.optimizers.LossScaleOptimizer(Finding(0.1))
    wrapper.build([variable])
    assert found[-1] is wrapper
    model = model_with(Finding(0.1))
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)  # compile wrapped it
    model.fit(X, Y, batch_size=8, epochs=1, verbose=0)
    assert found[-1] is model.optimizer


def test_plain_objects_on_an_optimizer_are_tracked_by_neither_keras_nor_tensorflow(tmp_path: Path) -> None:
    """``hold_untracked``: variables inside a plain object stay out of ``variables``, checkpoints and saves."""
    import keras
    import tensorflow as tf

    from hvdk8s.train import keras_compat

    class State:
        def __init__(self) -> None:
            self.counter = tf.Variable(0, dtype=tf.int64, trainable=False)
            self.sums = [tf.Variable(tf.zeros(2)), tf.Variable(tf.zeros(3))]

    opt = keras.optimizers.SGD(0.1, momentum=0.9)
    model = model_with(opt)
    model.fit(X, Y, batch_size=8, epochs=1, verbose=0)
    count = len(opt.variables)
    keras_compat.hold_untracked(opt, "hvdk8s_state", State())
    assert len(opt.variables) == count and isinstance(opt.hvdk8s_state, State)
    prefix = tf.train.Checkpoint(optimizer=opt).write(str(tmp_path / "ckpt"))
    names = [name for name, _ in tf.train.list_variables(prefix)]
    assert names and not [n for n in names if "hvdk8s_state" in n]
    model.save(tmp_path / "m.keras")
    assert len(keras.models.load_model(tmp_path / "m.keras").optimizer.variables) == count


def test_sgd_keeps_one_momentum_per_variable_in_build_order_and_updates_those() -> None:
    """``sgd_momentums``, ``sgd_momentum``: the buffers, in ``build``'s order, are the ones Keras's update uses."""
    import keras

    from hvdk8s.train import keras_compat

    variables = [keras.Variable(np.zeros(2, "float32")), keras.Variable(np.zeros(3, "float32"))]
    opt = keras.optimizers.SGD(0.5, momentum=0.9)
    opt.build(variables)
    momentums = keras_compat.sgd_momentums(opt)
    assert [tuple(m.shape) for m in momentums] == [(2,), (3,)]
    assert all(keras_compat.sgd_momentum(opt, v) is m for v, m in zip(variables, momentums, strict=True))
    opt.apply([np.full(2, 1.0, "float32"), np.full(3, 2.0, "float32")], variables)
    np.testing.assert_allclose(values(momentums)[0], np.full(2, -0.5))  # momentum * 0 - lr * grad
    np.testing.assert_allclose(values(momentums)[1], np.full(3, -1.0))
    plain = keras.optimizers.SGD(0.5)
    plain.build(variables)
    assert keras_compat.sgd_momentums(plain) == []


# --- loading ----------------------------------------------------------------------------------------------------


def test_custom_objects_replace_a_saved_class_by_the_name_it_was_saved_under(tmp_path: Path) -> None:
    """``load_overrides``: an optimizer saved from a same-named subclass is built by the override, its state
    restored into what the override returns; one saved from Keras's own class is not replaced."""
    import keras

    from hvdk8s.train import keras_compat

    built: list[type] = []

    def from_config(cls: type[Any], config: dict) -> Any:
        built.append(cls)
        return cls.from_config(config)

    overrides = keras_compat.load_overrides([keras.optimizers.SGD], from_config)
    assert list(overrides) == ["SGD"]
    for name, optimizer in (("subclass", keras_compat.distributed_subclass(keras.optimizers.SGD, (_Mixin,))(0.1)),
                            ("keras", keras.optimizers.SGD(0.1))):  # fmt: skip
        model = model_with(optimizer)
        model.fit(X, Y, batch_size=4, epochs=1, verbose=0)
        model.save(tmp_path / f"{name}.keras")
    loaded = keras.models.load_model(tmp_path / "subclass.keras", custom_objects=overrides)
    assert built == [keras.optimizers.SGD] and int(loaded.optimizer.iterations.numpy()) == 2
    built.clear()
    loaded = keras.models.load_model(tmp_path / "keras.keras", custom_objects=overrides)
    assert built == [] and type(loaded.optimizer) is keras.optimizers.SGD  # Keras's own: resolved by its public name


def test_legacy_h5_is_marked_when_saved_with_its_optimizer_and_loads_it_built_for_no_layer(tmp_path: Path) -> None:
    """``legacy_h5_saved_with_optimizer``: the ``training_config`` attribute, and why such files are refused."""
    import keras

    from hvdk8s.train import keras_compat

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss=keras.losses.MeanSquaredError())
    model.fit(X, Y, batch_size=8, epochs=1, verbose=0)
    for name in ("m.h5", "m.hdf5", "m.keras"):
        model.save(tmp_path / name)
    bare = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    bare.save(tmp_path / "bare.h5")
    assert keras_compat.legacy_h5_saved_with_optimizer(tmp_path / "m.h5")
    assert keras_compat.legacy_h5_saved_with_optimizer(str(tmp_path / "m.hdf5"))
    assert not keras_compat.legacy_h5_saved_with_optimizer(tmp_path / "bare.h5")
    assert not keras_compat.legacy_h5_saved_with_optimizer(tmp_path / "m.keras")
    assert not keras_compat.legacy_h5_saved_with_optimizer(tmp_path / "missing.h5")
    loaded = keras.models.load_model(tmp_path / "m.h5")
    assert len(model.optimizer.variables) == 4  # iterations, learning rate, a momentum per weight
    assert len(loaded.optimizer.variables) == 2  # built for none of the layers' variables


# --- fit ----------------------------------------------------------------------------------------------------------


def test_make_train_function_keeps_an_installed_function_until_forced_or_recompiled() -> None:
    """``keras_train_function``: ``make_train_function`` returns the current function unless forced;
    ``compile`` resets it."""
    import keras

    from hvdk8s.train import keras_compat

    model = model_with(keras.optimizers.SGD(0.1))
    keras_function = keras_compat.keras_train_function(model)
    assert callable(keras_function) and keras_compat.keras_train_function(model) is keras_function

    def installed(iterator: Any) -> Any:
        return keras_function(iterator)

    keras_compat.install_train_function(model, installed)
    assert keras_compat.keras_train_function(model) is installed
    assert keras_compat.keras_train_function(model, force=True) not in (installed, keras_function)
    keras_compat.install_train_function(model, installed)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    assert keras_compat.keras_train_function(model) is not installed


def test_fit_calls_the_installed_function_with_the_epoch_iterator_until_it_runs_out() -> None:
    """``install_train_function``: installed from ``on_train_begin``, the function gets every step of that same
    ``fit`` with the epoch's iterator; ``OutOfRangeError`` from it ends an epoch of unknown length;
    ``train_on_batch`` passes no iterator."""
    import keras
    import tensorflow as tf

    from hvdk8s.train import keras_compat

    got: list[Any] = []

    class Install(keras.callbacks.Callback):
        def on_train_begin(self, logs: dict | None = None) -> None:
            model = self.model
            step = tf.function(lambda iterator: model.train_step(next(iterator)))

            def installed(iterator: Any) -> Any:
                got.append(iterator)
                return step(iterator)

            keras_compat.install_train_function(model, installed)

    model = model_with(keras.optimizers.SGD(0.1))
    model.fit(X, Y, batch_size=4, epochs=2, verbose=0, callbacks=[Install()])
    assert len(got) == 4 and all(isinstance(it, keras_compat.EPOCH_ITERATORS) for it in got)
    assert int(model.optimizer.iterations.numpy()) == 4
    got.clear()
    unknown = tf.data.Dataset.from_tensor_slices((X, Y)).filter(lambda x, y: True).batch(4)
    assert unknown.cardinality() == tf.data.UNKNOWN_CARDINALITY
    history = model.fit(unknown, epochs=2, verbose=0, callbacks=[Install()])
    assert len(history.history["loss"]) == 2
    assert len(got) == 6  # per epoch: 2 steps, and the call that ran out of data
    got.clear()
    model.train_on_batch(X[:4], Y[:4])
    assert len(got) == 1 and not isinstance(got[0], keras_compat.EPOCH_ITERATORS)


def test_generator_batches_hold_an_optional_where_they_hold_none() -> None:
    """``none_for_optionals``: from Keras 3.12 on the generator adapter puts an empty ``tf.experimental.Optional``
    where a batch holds ``None``; before, it yields the batch as it is (and Keras's own ``fit`` takes no ``None``)."""
    import keras
    import tensorflow as tf

    from hvdk8s.train import keras_compat

    placeholder = keras_compat.keras_version() >= keras_compat.OPTIONALS_FOR_NONE_SINCE
    batches: list[Any] = []

    class Peek(keras.callbacks.Callback):
        def on_train_begin(self, logs: dict | None = None) -> None:
            model = self.model

            def installed(iterator: Any) -> Any:
                batch = next(iterator)
                batches.append(batch)
                return model.train_step(keras_compat.none_for_optionals(batch))

            keras_compat.install_train_function(model, installed)

    def generator() -> Iterator[tuple]:
        while True:
            yield (X[:4], Y[:4], None) if placeholder else (X[:4], Y[:4])

    model = model_with(keras.optimizers.SGD(0.1))
    model.fit(generator(), steps_per_epoch=2, epochs=1, verbose=0, callbacks=[Peek()])
    assert len(batches) == 2
    if placeholder:
        assert all(len(b) == 3 and isinstance(b[2], tf.experimental.Optional) for b in batches)
        assert keras_compat.none_for_optionals(batches[0])[2] is None
    else:
        assert all(not isinstance(item, tf.experimental.Optional) for b in batches for item in b)


# --- metrics ------------------------------------------------------------------------------------------------------


def test_keras_train_step_counts_each_epoch_s_examples_in_its_loss_tracker() -> None:
    """``loss_tracker``, ``examples_counted``: the ``loss`` metric's count is the epoch's examples, partial
    batches exactly."""
    import keras

    from hvdk8s.train import keras_compat

    bare = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    assert keras_compat.loss_tracker(bare) is None  # not compiled
    model = model_with(keras.optimizers.SGD(0.1))
    model.fit(np.concatenate([X, X[:2]]), np.concatenate([Y, Y[:2]]), batch_size=4, epochs=2, verbose=0)
    tracker = keras_compat.loss_tracker(model)
    assert tracker is not None and keras_compat.examples_counted(tracker) == 10  # 4 + 4 + 2, reset each epoch


# --- callbacks ----------------------------------------------------------------------------------------------------


def test_on_train_batch_begin_gets_each_call_s_first_step() -> None:
    """``CallSteps``: with 3 steps per call, the begin hook gets 0, 3, 6 (the end hook: 0, 3, 6 on Keras 3.8,
    2, 5, 8 on 3.15), and the steps done after each call count from the begin hook's."""
    import keras

    from hvdk8s.train import keras_compat

    begins: list[int] = []
    ends: list[int] = []
    done: list[int] = []

    class Record(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.call = keras_compat.CallSteps()

        def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
            begins.append(batch)
            self.call.begin(batch)

        def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
            ends.append(batch)
            done.append(self.call.done(self.model, self.params))

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", steps_per_execution=3)
    model.fit(np.concatenate([X, X[:1]]), np.concatenate([Y, Y[:1]]), batch_size=1, verbose=0, callbacks=[Record()])
    assert begins == [0, 3, 6] and done == [3, 6, 9]
    ends_by_version = {(3, 8): [0, 3, 6], (3, 15): [2, 5, 8]}  # the releases checked
    if keras_compat.keras_version() in ends_by_version:
        assert ends == ends_by_version[keras_compat.keras_version()]


# --- where the uses live ------------------------------------------------------------------------------------------

# A Keras-private module or attribute, a __class__ assignment, a walk up the call stack; and the undocumented
# Keras attributes keras_compat wraps (SGD's buffers, the train function's maker and slot).
FORBIDDEN = re.compile(
    r"keras\.src\b|__class__\s*=(?!=)|setattr\([^)]*['\"]__class__['\"]|sys\._getframe|inspect\.stack"
    r"|inspect\.currentframe|_trainable_variables|_get_variable_index|\.momentums\b|\.make_train_function\("
    r"|\.train_function\s*=(?!=)"
)


def test_keras_internals_are_used_in_keras_compat_only() -> None:
    folders = package_dirs()
    compat = REPO / folders["hvdk8s"] / "train" / "keras_compat.py"
    assert compat.is_file() and FORBIDDEN.search(compat.read_text())  # the pattern still finds what it is for
    found = []
    for folder in sorted(set(folders.values())):
        for path in sorted((REPO / folder).rglob("*.py")):
            if path == compat:
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if FORBIDDEN.search(line):
                    found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not found, "Keras internals outside hvdk8s/train/keras_compat.py (move them there, documented):\n" + "\n".join(
        found
    )
