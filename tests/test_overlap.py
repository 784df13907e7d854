"""Communication overlaps backprop: the compiled step's op graph lets each allreduce start on its own gradients.

A check of op ordering, not of timing: in the traced step, the allreduce of the
last layer's gradient must not depend (through data or control edges) on the
gradient of the first layer, which backprop produces last. Each reduction is
a ``tf.cond`` on the job's size (skipped on one rank, as Horovod's
``_allreduce_cond``); its true branch holds the Horovod op.
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


def small_model():
    """Three dense layers; trainable variables: first kernel and bias, middle kernel and bias, last kernel and bias."""
    import keras

    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu", name="first"),
                             keras.layers.Dense(16, activation="relu"), keras.layers.Dense(4, name="last")])


def traced_step(model=None, **optimizer_kwargs):
    """The model, the traced step's reductions (``reductions``) and gradients (trainable variables' order)."""
    import keras
    import tensorflow as tf

    import hvdk8s as hvd

    hvd.init(quiet=True)
    model = model or small_model()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), **optimizer_kwargs)
    opt.build(model.trainable_variables)
    traced_grads = []

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x, training=True) - y) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        traced_grads[:] = grads
        opt.apply(grads, model.trainable_variables)

    graph = step.get_concrete_function(tf.TensorSpec([None, 8]), tf.TensorSpec([None, 4])).graph
    return model, reductions(graph), list(traced_grads)


def reductions(graph) -> list:
    """The ``If`` ops of the step whose true branch runs a Horovod allreduce, with that op's type."""
    library = {f.signature.name: f for f in graph.as_graph_def().library.function}
    out = []
    for op in graph.get_operations():
        if op.type in ("If", "StatelessIf"):
            types = [n.op for n in library[op.get_attr("then_branch").name].node_def if n.op.startswith("Horovod")]
            if types:
                assert types in (["HorovodAllreduce"], ["HorovodGroupedAllreduce"]), types
                out.append((op, types[0]))
    return out


def grouping(reduce_ops: list, grads: list) -> list[tuple[str, list[int]]]:
    """Each reduction's op type and the gradients it takes, as indices into the trainable variables."""
    index = {g.name: i for i, g in enumerate(grads)}
    return [(kind, [index[t.name] for t in op.inputs[1:]]) for op, kind in reduce_ops]


def gradient_source(reduction, index: int = 0):
    """The op that feeds the reduction's ``index``-th gradient (input 0 is the size test): where backprop handed it over."""
    return reduction[0].inputs[1 + index].op


def test_each_gradient_is_reduced_as_soon_as_backprop_produces_it() -> None:
    model, reduce_ops, _ = traced_step()
    assert [t for _, t in reduce_ops] == ["HorovodAllreduce"] * len(model.trainable_variables)  # one per gradient
    assert len(reduce_ops) == 6
    first_kernel_grad = gradient_source(reduce_ops[0])
    last_kernel_reduce = reduce_ops[4][0]
    assert first_kernel_grad in ancestors(reduce_ops[0][0])
    assert first_kernel_grad not in ancestors(last_kernel_reduce)  # the last layer's allreduce need not wait
    assert all(op.type != "Timestamp" for r, _ in reduce_ops for op in r.control_inputs)  # the clock orders nothing


def test_one_group_waits_for_every_gradient() -> None:
    model, reduce_ops, _ = traced_step(groups=1)
    assert [t for _, t in reduce_ops] == ["HorovodGroupedAllreduce"]
    assert len(reduce_ops[0][0].inputs) == 1 + len(model.trainable_variables)


@pytest.mark.parametrize(("kwargs", "chunks"), [
    ({"groups": 2}, [[0, 1, 2], [3, 4, 5]]),
    ({"groups": 3}, [[0, 1], [2, 3], [4, 5]]),
    ({"num_groups": 3}, [[0, 1], [2, 3], [4, 5]]),  # Horovod's older spelling of groups=3
    ({"num_groups": 3, "groups": 2}, [[0, 1, 2], [3, 4, 5]]),  # as in Horovod, groups wins
], ids=["groups=2", "groups=3", "num_groups=3", "num_groups=3,groups=2"])
def test_groups_split_the_gradients_into_that_many_allreduces(kwargs: dict, chunks: list[list[int]]) -> None:
    """Contiguous runs of the six gradients (Horovod's ``split_list``), one grouped allreduce each."""
    _, reduce_ops, grads = traced_step(**kwargs)
    assert grouping(reduce_ops, grads) == [("HorovodGroupedAllreduce", chunk) for chunk in chunks]


def test_groups_as_variable_lists_reduce_each_list_together_and_the_other_variables_alone() -> None:
    model = small_model()
    v = model.trainable_variables
    _, reduce_ops, grads = traced_step(model, groups=[[v[4], v[0]], [v[3], v[1], v[5]]])
    assert sorted(grouping(reduce_ops, grads), key=lambda r: r[1]) == [
        ("HorovodGroupedAllreduce", [0, 4]),  # the first and last kernels
        ("HorovodGroupedAllreduce", [1, 3, 5]),  # the biases
        ("HorovodAllreduce", [2]),  # the middle kernel, in no list
    ]


@pytest.mark.parametrize("groups", [-1, True, "dense"])
def test_groups_other_than_a_count_or_variable_lists_are_refused_naming_the_argument(groups) -> None:
    import keras

    import hvdk8s as hvd

    with pytest.raises(ValueError, match="groups"):
        hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), groups=groups)


ONE_RANK_FIT = """
import sys
import keras, numpy as np, tensorflow as tf
import hvdk8s as hvd
hvd.init(quiet=True)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
model.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), "mse")
hvd.start_timeline(sys.argv[1])
model.fit(np.ones((32, 8), "float32"), np.ones((32, 4), "float32"), batch_size=8, verbose=0)
hvd.allreduce(tf.ones([3]))
hvd.stop_timeline()
"""


def test_a_one_rank_job_runs_no_gradient_allreduce(tmp_path) -> None:
    """Horovod's timeline of a 1-rank fit: the step's allreduces are skipped when it runs (an eager control allreduce is recorded)."""
    import json
    import os
    import subprocess
    import sys

    timeline = tmp_path / "timeline.json"
    subprocess.run([sys.executable, "-c", ONE_RANK_FIT, str(timeline)], check=True, timeout=120,
                   env={**os.environ, "HOROVOD_TIMELINE": "DYNAMIC"})
    tensors = [e["args"]["name"] for e in json.loads(timeline.read_text())
               if e.get("name") == "process_name" and "name" in e.get("args", {})]
    assert tensors == ["HorovodAllreduce"]  # the control only (eager ops are named by type); no DistributedSGD.k
