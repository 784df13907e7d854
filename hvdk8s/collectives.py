"""Gradient and state collectives on Horovod's core TensorFlow ops.

The one place where hvdk8s talks to ``horovod.tensorflow``: the optimizer,
the gradient tape and the callbacks all reduce or broadcast through here, so
they cannot disagree on fusion, compression or naming.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import horovod.tensorflow as hvd
import keras
import tensorflow as tf

from hvdk8s import commtime

Average = hvd.Average
Sum = hvd.Sum

COMPRESSIONS: Mapping[str, Any] = {
    "none": hvd.Compression.none,
    "fp16": hvd.Compression.fp16,
}


def resolve_compression(compression: str | Any) -> Any:
    """Accept ``"none"``/``"fp16"`` or one of Horovod's Compression classes."""
    if isinstance(compression, str):
        try:
            return COMPRESSIONS[compression]
        except KeyError:
            raise ValueError(
                f"compression={compression!r}: expected one of {sorted(COMPRESSIONS)}"
            ) from None
    return compression


def allreduce_gradients(
    grads: Sequence[tf.Tensor | tf.IndexedSlices | None],
    *,
    op: Any = Average,
    compression: Any = hvd.Compression.none,
    name: str = "hvdk8s.grads",
) -> list[tf.Tensor | None]:
    """Reduce all gradients of one step with a single fused, grouped allreduce.

    Sparse gradients (embeddings) are densified first: one grouped op over
    dense tensors beats an allgather per variable on the model sizes hvdk8s
    targets. ``None`` gradients (variables not reached by the loss) stay
    ``None`` and take no part; every rank has the same ones.
    """
    compression = resolve_compression(compression)
    present = [i for i, g in enumerate(grads) if g is not None]
    if hvd.size() == 1:
        return [None if g is None else tf.convert_to_tensor(g) for g in grads]
    tensors, contexts = [], []
    for i in present:
        compressed, ctx = compression.compress(tf.convert_to_tensor(grads[i]))
        tensors.append(compressed)
        contexts.append(ctx)
    reduced = commtime.timed(
        lambda ts: hvd.grouped_allreduce(ts, op=op, name=name), tensors
    ) if tensors else []
    out: list[tf.Tensor | None] = [None] * len(grads)
    for i, tensor, ctx in zip(present, reduced, contexts):
        out[i] = compression.decompress(tensor, ctx)
    return out


def broadcast_variables(variables: Sequence[keras.Variable | tf.Variable], root_rank: int = 0) -> None:
    """Overwrite ``variables`` on every rank with their values on ``root_rank``."""
    for i, var in enumerate(variables):
        value = hvd.broadcast(tf.convert_to_tensor(var), root_rank, name=f"hvdk8s.bcast.{i}")
        var.assign(value)


def average_scalars(values: Mapping[str, float], name: str = "hvdk8s.metrics") -> dict[str, float]:
    """Average named scalars across ranks in one grouped allreduce.

    Keys are sorted so every rank feeds the same tensor order; all ranks must
    pass the same keys (they do for Keras logs of the same model and data).
    """
    keys = sorted(values)
    if not keys or hvd.size() == 1:
        return {k: float(values[k]) for k in keys}
    tensors = [tf.constant(float(values[k]), dtype=tf.float64) for k in keys]
    reduced = hvd.grouped_allreduce(tensors, op=Average, name=name)
    return {k: float(t.numpy()) for k, t in zip(keys, reduced)}


def broadcast_object(obj: Any, root_rank: int = 0, name: str = "hvdk8s.object") -> Any:
    """Send a picklable Python object from ``root_rank`` to every rank."""
    if hvd.size() == 1:
        return obj
    return hvd.broadcast_object(obj, root_rank=root_rank, name=name)
