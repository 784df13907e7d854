"""Data-parallel Keras 3 optimizer and gradient tape on Horovod collectives.

``horovod.tensorflow.keras`` targets Keras 2's optimizer API and breaks on
Keras 3 (horovod#4290). Here the wrapped optimizer keeps Keras 3's public
``apply`` contract, which both ``model.fit`` and custom loops go through, and
reduces the gradients first with one grouped allreduce per step.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf

from hvdk8s import collectives


class _Accumulators:
    """Local gradient sums for ``backward_passes_per_step > 1``.

    A plain object on purpose: neither Keras nor TensorFlow tracking sees these
    variables, so checkpoints and exported models hold only the wrapped
    optimizer's own state and load without hvdk8s.
    """

    def __init__(self, grads: Sequence[Any]) -> None:
        with tf.init_scope():
            self.sums = [
                None if g is None else tf.Variable(tf.zeros(g.shape, g.dtype), trainable=False)
                for g in grads
            ]
            self.passes = tf.Variable(0, dtype=tf.int64, trainable=False)


class _DistributedMixin:
    """Placed in front of the user's optimizer class in the MRO."""

    _hvdk8s_op: Any
    _hvdk8s_compression: Any
    _hvdk8s_passes: int
    _hvdk8s_average_passes: bool
    _hvdk8s_acc: _Accumulators | None

    def apply(self, grads: Sequence[Any], trainable_variables: Sequence[keras.Variable] | None = None) -> Any:
        base_apply = super().apply  # type: ignore[misc]
        if self._hvdk8s_passes == 1:
            return base_apply(self._reduce(grads), trainable_variables)
        if self._hvdk8s_acc is None:
            self._hvdk8s_acc = _Accumulators(grads)
        acc = self._hvdk8s_acc
        for total, grad in zip(acc.sums, grads):
            if total is not None:
                total.assign_add(tf.convert_to_tensor(grad))
        acc.passes.assign_add(1)

        def update() -> None:
            scale = 1.0 / self._hvdk8s_passes if self._hvdk8s_average_passes else 1.0
            summed = [None if t is None else t.read_value() * tf.cast(scale, t.dtype) for t in acc.sums]
            base_apply(self._reduce(summed), trainable_variables)
            for total in acc.sums:
                if total is not None:
                    total.assign(tf.zeros_like(total))

        tf.cond(acc.passes % self._hvdk8s_passes == 0, update, lambda: None)
        return None

    def _reduce(self, grads: Sequence[Any]) -> list[Any]:
        return collectives.allreduce_gradients(
            grads, op=self._hvdk8s_op, compression=self._hvdk8s_compression
        )



def DistributedOptimizer(
    optimizer: keras.optimizers.Optimizer,
    *,
    op: Any = collectives.Average,
    compression: str | Any = "none",
    backward_passes_per_step: int = 1,
    average_aggregated_gradients: bool = True,
) -> keras.optimizers.Optimizer:
    """Wrap a Keras 3 optimizer so each update uses gradients reduced across ranks.

    The result is an instance of a subclass named like the original (same
    module, same ``get_config``), so models saved during training load with
    plain Keras. ``backward_passes_per_step=k`` accumulates k local gradients
    and communicates once, averaged over the k passes unless
    ``average_aggregated_gradients=False`` (Horovod's historical sum).
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(f"optimizer: expected a keras.optimizers.Optimizer, got {type(optimizer).__name__}")
    if backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step={backward_passes_per_step}: must be >= 1")
    base = type(optimizer)
    cls = type(base.__name__, (_DistributedMixin, base), {"__module__": base.__module__})
    wrapped = cls.from_config(optimizer.get_config())
    wrapped._hvdk8s_op = op
    wrapped._hvdk8s_compression = collectives.resolve_compression(compression)
    wrapped._hvdk8s_passes = int(backward_passes_per_step)
    wrapped._hvdk8s_average_passes = average_aggregated_gradients
    wrapped._hvdk8s_acc = None
    return wrapped


class DistributedGradientTape(tf.GradientTape):
    """``tf.GradientTape`` whose ``gradient`` returns rank-averaged gradients.

    For custom training loops that call ``optimizer.apply`` on a plain
    optimizer; use either this tape or ``DistributedOptimizer``, not both.
    """

    def __init__(self, *args: Any, op: Any = collectives.Average, compression: str | Any = "none", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._hvdk8s_op = op
        self._hvdk8s_compression = collectives.resolve_compression(compression)

    def gradient(self, target: Any, sources: Any, *args: Any, **kwargs: Any) -> Any:
        grads = super().gradient(target, sources, *args, **kwargs)
        flat = tf.nest.flatten(grads, expand_composites=False)
        reduced = collectives.allreduce_gradients(
            flat, op=self._hvdk8s_op, compression=self._hvdk8s_compression, name="hvdk8s.tape"
        )
        return tf.nest.pack_sequence_as(grads, reduced)
