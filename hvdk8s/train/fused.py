"""Keras 3's SGD update as one fused TensorFlow kernel per variable.

Keras 3 writes SGD's update as separate tensor ops (``m * momentum``,
``grad * lr``, their difference, an assignment, an addition), each a full pass
over the variable's memory. TensorFlow's training kernels compute the same
formula in place, in one pass: ``ResourceApplyKerasMomentum`` does
``accum = accum * momentum - grad * lr; var += accum`` (Nesterov:
``var += accum * momentum - grad * lr``), ``ResourceApplyGradientDescent``
does ``var -= grad * lr``. Measured here (one thread, the benchmark's
8.4 M-parameter MLP): 9.5 ms per update with Keras's ops, 5.2 ms fused.

``DistributedOptimizer`` puts ``FusedSGD`` in front of ``keras.optimizers.SGD``
and of its subclasses that keep its ``update_step`` (one with its own keeps it).
Sparse gradients (``IndexedSlices``) keep Keras's update, whose momentum
decays every row, and so do other dtypes.
"""
from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from hvdk8s.train import keras_compat

# the dtypes whose fused result is checked bit for bit against Keras's update (tests/test_fused.py)
_KERNEL_DTYPES = (tf.float16, tf.float32, tf.float64)


class FusedSGD:
    """Mixin placed before ``keras.optimizers.SGD``: ``update_step`` runs one TensorFlow training kernel."""

    momentum: float
    nesterov: bool

    def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
        var = variable.value if isinstance(variable, keras.Variable) else variable
        if isinstance(gradient, tf.IndexedSlices) or var.dtype not in _KERNEL_DTYPES:
            return super().update_step(gradient, variable, learning_rate)  # type: ignore[misc]
        lr = tf.cast(learning_rate, var.dtype)
        grad = tf.cast(gradient, var.dtype)
        if not self.momentum:
            tf.raw_ops.ResourceApplyGradientDescent(var=var.handle, alpha=lr, delta=grad)
            return None
        # The buffer Keras's own SGD update uses for this variable.
        accum = keras_compat.sgd_momentum(self, variable).value  # type: ignore[arg-type]  # an SGD, by the MRO
        tf.raw_ops.ResourceApplyKerasMomentum(
            var=var.handle, accum=accum.handle, lr=lr, grad=grad, momentum=tf.cast(self.momentum, var.dtype),
            use_locking=False, use_nesterov=bool(self.nesterov),
        )
        return None


def fused_bases(base: type[Any]) -> tuple[type, ...]:
    """The mixins that fuse ``base``'s update: ``(FusedSGD,)`` for Keras's own SGD update, else none."""
    if issubclass(base, keras.optimizers.SGD) and base.update_step is keras.optimizers.SGD.update_step:
        return (FusedSGD,)
    return ()
