"""Gradient communication left exposed after backprop, measured inside compiled train steps.

Horovod's timeline records every allreduce, but as a trace file far too heavy
to leave on. Here two ``tf.timestamp`` ops in the step's graph mark when the
last gradient exists and when the last reduced gradient exists; their
difference, added to a host-side variable, is the communication that backprop
did not hide. No op waits for the stamps (a stateful op in a ``tf.function``
runs without anything depending on it), so the allreduces still start as soon
as their own gradients are ready. The metrics callback samples the total.
"""
from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

_clock: tf.Variable | None = None


def _variable() -> tf.Variable:
    """[seconds, steps], created outside any tf.function on first use."""
    global _clock
    if _clock is None:
        with tf.init_scope(), tf.device("/CPU:0"):
            _clock = tf.Variable(tf.zeros([2], tf.float64), trainable=False, name="hvdk8s_allreduce_clock")
    return _clock


def record_exposed(grads: Sequence[tf.Tensor], reduced: Sequence[tf.Tensor]) -> None:
    """Add (time from the last of ``grads`` to the last of ``reduced``, one step) to the clock.

    On GPU, TensorFlow counts a kernel as done once it is queued, so both
    stamps can run ahead of the device: the span is then approximate.
    """
    if not grads:
        return
    # IndexedSlices (sparse gradients) are composite: depend on their component tensors.
    with tf.control_dependencies(tf.nest.flatten(list(grads), expand_composites=True)):
        grads_done = tf.timestamp()
    with tf.control_dependencies(tf.nest.flatten(list(reduced), expand_composites=True)):
        reduced_done = tf.timestamp()
    exposed = tf.maximum(reduced_done - grads_done, 0.0)
    _variable().assign_add(tf.stack([exposed, tf.constant(1.0, tf.float64)]))


def read() -> tuple[float, int]:
    """(seconds, steps) of exposed gradient communication this process has recorded so far."""
    if _clock is None:
        return 0.0, 0
    seconds, calls = _clock.numpy()
    return float(seconds), int(calls)
