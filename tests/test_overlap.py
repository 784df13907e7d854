"""Communication overlaps backprop: the compiled step's op graph lets each allreduce start on its own gradients.

A check of op ordering, not of timing: in the traced step, the allreduce of the
last layer's gradient must not depend (through data or control edges) on the
gradient of the first layer, which backprop produces last.
"""
from __future__ import annotations

import pytest


def ancestors(op) -> set:
    """Every op ``op`` waits for, through data and control edges."""
    seen, todo = set(), [op]
    while todo:
        current = todo.pop()
        for parent in [t.op for t in current.inputs] + list(current.control_inputs):
            if parent not in seen:
                seen.add(parent)
                todo.append(parent)
    return seen


def traced_step(**optimizer_kwargs):
    import keras
    import tensorflow as tf

    import hvdk8s as hvd

    hvd.init(quiet=True)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu", name="first"),
                              keras.layers.Dense(16, activation="relu"), keras.layers.Dense(4, name="last")])
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), **optimizer_kwargs)
    opt.build(model.trainable_variables)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x, training=True) - y) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply(grads, model.trainable_variables)

    graph = step.get_concrete_function(tf.TensorSpec([None, 8]), tf.TensorSpec([None, 4])).graph
    reduce_ops = [op for op in graph.get_operations() if op.type.startswith("HorovodAllreduce")
                  or op.type.startswith("HorovodGroupedAllreduce")]
    return model, reduce_ops


def gradient_source(reduce_op, index: int = 0):
    """The op that feeds the allreduce's ``index``-th input: where backprop handed the gradient over."""
    return reduce_op.inputs[index].op


def test_each_gradient_is_reduced_as_soon_as_backprop_produces_it() -> None:
    model, reduce_ops = traced_step()
    assert len(reduce_ops) == len(model.trainable_variables) == 6  # one allreduce per gradient (groups=None)
    first_kernel_grad = gradient_source(reduce_ops[0])
    last_kernel_reduce = reduce_ops[4]
    assert first_kernel_grad not in ancestors(last_kernel_reduce)  # the last layer's allreduce need not wait
    assert all(op.type != "Timestamp" for r in reduce_ops for op in r.control_inputs)  # the clock orders nothing


def test_one_group_waits_for_every_gradient() -> None:
    model, reduce_ops = traced_step(groups=1)
    assert [op.type for op in reduce_ops] == ["HorovodGroupedAllreduce"]
    assert len(reduce_ops[0].inputs) == len(model.trainable_variables)


@pytest.mark.parametrize("groups", [2, 3])
def test_groups_split_the_gradients_into_that_many_allreduces(groups: int) -> None:
    _, reduce_ops = traced_step(groups=groups)
    assert len(reduce_ops) == groups
