"""Wall time of the gradient allreduce, measured inside compiled train steps.

Horovod's timeline records this too, but as a trace file far too heavy to
leave on. Here two ``tf.timestamp`` ops bracket the grouped allreduce in the
graph and add the span to a host-side variable: no Python in the graph, no
extra device sync, and the metrics callback reads the total after each step.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import tensorflow as tf

_clock: tf.Variable | None = None


def _variable() -> tf.Variable:
    """[seconds, allreduces], created outside any tf.function on first use."""
    global _clock
    if _clock is None:
        with tf.init_scope(), tf.device("/CPU:0"):
            _clock = tf.Variable(tf.zeros([2], tf.float64), trainable=False, name="hvdk8s_allreduce_clock")
    return _clock


def timed(reduce: Callable[[list[tf.Tensor]], list[tf.Tensor]], tensors: Sequence[tf.Tensor]) -> list[tf.Tensor]:
    """Return ``reduce(tensors)``, adding its wall time and one call to the clock.

    The start stamp waits for every input and the collective for the start
    stamp; the end stamp waits for every output. A grouped allreduce is one op
    over all gradients, so it could not start before the last one anyway: the
    ordering delays nothing. The span is what a rank loses to communication:
    negotiation, waiting for slower ranks, transfer. On GPU, TensorFlow counts
    a kernel as done once it is queued, so the span may also hold the tail of
    the backward pass still running on the stream: an upper bound there.
    """
    with tf.control_dependencies(list(tensors)):
        start = tf.timestamp()
    with tf.control_dependencies([start]):
        inputs = [tf.identity(t) for t in tensors]
    reduced = reduce(inputs)
    with tf.control_dependencies(list(reduced)):
        elapsed = tf.timestamp() - start
    record = _variable().assign_add(tf.stack([elapsed, tf.constant(1.0, tf.float64)]))
    with tf.control_dependencies([record]):
        return [tf.identity(t) for t in reduced]


def read() -> tuple[float, int]:
    """(seconds, allreduces) this process has spent in timed allreduces so far."""
    if _clock is None:
        return 0.0, 0
    seconds, calls = _clock.numpy()
    return float(seconds), int(calls)
