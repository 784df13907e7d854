"""The call ``model.fit`` makes per step, without Keras's wrapper around ``train_step``.

Keras 3's ``make_train_function`` (TensorFlow backend, 3.8 to 3.15) compiles
``train_step`` inside a second ``tf.function`` that returns its logs as a
``tf.experimental.Optional``, and reads that with two eager ops
(``has_value``, ``get_value``) after every call. The ``Optional`` exists for
``steps_per_execution > 1``, where a call can run out of data part-way; at one
step per call the step reads its batch with ``get_next``, which raises
``OutOfRangeError`` at the end of the data whatever wraps it (``fit`` turns
that into the end of the epoch), so the value is always there. Measured on
the benchmark's digits CNN at two ranks, the same model trained by ``fit``
with either function in interleaved rounds: the wrapper costs ~0.3 ms of a
~9 ms step.

``LeanTrainFunction`` is ``train_step(next(iterator))`` in one ``tf.function``
(through the model's distribution strategy, as Keras calls it), installed as
the model's ``train_function``, the function ``fit`` calls with the epoch's
iterator (``keras_compat.install_train_function``; ``make_train_function``
returns an installed one as long as the model is not recompiled:
``keras_compat.keras_train_function``). As Keras's own does from 3.12 on, it
turns the empty ``tf.experimental.Optional`` that Keras's generator and grain
adapters put where a batch holds ``None`` back into ``None`` before
``train_step`` sees it (``keras_compat.none_for_optionals``; a no-op on
earlier releases; a ``PyDataset`` batch cannot hold ``None``). Anything else
it is given (``train_on_batch`` passes a generator) goes to Keras's own
function. It is installed only where it computes what Keras's does: compiled
(not ``run_eagerly``), no XLA, one step per call, one replica in sync.
"""
from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from hvdk8s.train import keras_compat
from hvdk8s.train.optimizer import distribute_loss_scale, reduces_gradients


class LeanTrainFunction:
    """``fit``'s per-step call: one compiled ``train_step`` on the iterator's next batch.

    The first call on an iterator goes through the ``tf.function`` (tracing,
    variable creation); later calls on the same iterator go straight to the
    concrete function that call used. ``fit`` hands the same iterator to
    every step of an epoch (of every epoch with ``steps_per_epoch``), and the
    ``tf.function``'s per-call dispatch (the iterator's type spec, the
    function-cache lookup) took 0.3 ms of a 1.3 ms step on a one-layer model
    here, on every step (benchmarks/reports/step).
    """

    def __init__(self, model: keras.Model, keras_function: Callable[[Any], Any]) -> None:
        self.keras_function = keras_function
        strategy = model.distribute_strategy

        @tf.autograph.experimental.do_not_convert
        def one_step(iterator: Any) -> Any:
            return strategy.run(model.train_step, args=(keras_compat.none_for_optionals(next(iterator)),))

        self.step = tf.function(one_step, reduce_retracing=True)
        # the iterator of the last call (weakly: an epoch's iterator must not outlive its fit) and its function
        self._iterator: weakref.ref[Any] | None = None
        self._concrete: Callable[[Any], Any] | None = None

    def __call__(self, iterator: Any) -> Any:
        if not isinstance(iterator, keras_compat.EPOCH_ITERATORS):
            return self.keras_function(iterator)
        if self._concrete is not None and self._iterator is not None and self._iterator() is iterator:
            return self._concrete(iterator)
        logs = self.step(iterator)
        self._iterator, self._concrete = weakref.ref(iterator), self.step.get_concrete_function(iterator)
        return logs


def applies(model: keras.Model) -> bool:
    """Whether the lean call computes what Keras's own train function computes for ``model``."""
    return (
        not model.run_eagerly
        and not model.jit_compile
        and model.steps_per_execution == 1
        and model.distribute_strategy.num_replicas_in_sync == 1
    )


def install(model: keras.Model) -> None:
    """Make ``model.fit``'s step Horovod's, where the model's optimizer reduces gradients; idempotent.

    A ``DistributedOptimizer`` (or a ``LossScaleOptimizer`` around one) makes
    the model distributed; any other optimizer leaves the model as Keras made
    it. Three changes, each forcing a new train function only when it changes
    something: the ``LossScaleOptimizer`` that ``compile`` wraps around a
    ``DistributedOptimizer`` under ``mixed_float16`` is made to reduce before it
    checks the gradients (``optimizer.distribute_loss_scale``), so no rank
    decides on its own gradients; XLA is switched off, as Horovod's
    collectives cannot be XLA-compiled (Keras 3's ``compile`` turns it on by
    default on GPUs); and ``fit`` gets a ``LeanTrainFunction`` where it
    ``applies``. One installed function serves every later ``fit`` until
    ``compile`` resets it, so its step is traced once, as Keras's is.
    """
    if not reduces_gradients(model.optimizer):
        return
    stale = distribute_loss_scale(model.optimizer)  # a step traced before the change would decide per rank
    if model.jit_compile:
        warnings.warn("hvdk8s: XLA (jit_compile) cannot compile Horovod collectives; turning it off", stacklevel=2)
        model.jit_compile = False
        stale = True
    current = keras_compat.keras_train_function(model, force=stale)  # Keras's own, unless one is current already
    if not isinstance(current, LeanTrainFunction) and applies(model):
        keras_compat.install_train_function(model, LeanTrainFunction(model, current))


def rebuild(model: keras.Model) -> None:
    """Recompile the train function (after the step gained state it must trace in), lean where it applies."""
    keras_compat.keras_train_function(model, force=True)
    install(model)
