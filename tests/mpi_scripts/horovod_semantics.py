"""Horovod's semantics on hvdk8s, checked on a real 2-rank job; each rank writes JSON.

Every section records numbers for tests/test_horovod_api.py to compare with
Horovod's formulas (or, for the learning-rate callbacks, with Horovod's own
callback code driven step by step).
"""
from __future__ import annotations

import json
import sys
import types
import warnings
from pathlib import Path

from mpi4py import MPI

import hvdk8s as hvd
from hvdk8s.train.optimizer import is_distributed

world = MPI.COMM_WORLD
# Start as two size-1 jobs (an mpi4py communicator per rank), trace a step there, then grow to the world:
# the step traced at size 1 must reduce once the job has 2 ranks.
hvd.init(comm=world.Split(color=world.rank, key=0), quiet=True)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

out = Path(sys.argv[1])
result: dict = {}

grow_var = keras.Variable(np.zeros(2, "float32"))
grow_opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0))


@tf.function
def grow_step(grad: tf.Tensor) -> None:
    grow_opt.apply([grad], [grow_var])


grow_step(tf.constant([1.0, float(world.rank)]))
result["size_before_growth"] = hvd.size()
result["update_at_size_1"] = (-grow_var.numpy()).tolist()
hvd.shutdown()
own_sets = [hvd.ProcessSet([0]), hvd.ProcessSet([1])]
hvd.init(comm=world, process_sets=own_sets, quiet=True)
rank, size = hvd.rank(), hvd.size()
result.update(rank=rank, size=size, cross_size=hvd.cross_size(), cross_rank=hvd.cross_rank(),
              is_initialized=hvd.is_initialized())
grow_var.assign(np.zeros(2, "float32"))
grow_step(tf.constant([1.0, float(rank)]))  # the same traced function, now on 2 ranks
result["update_after_growth"] = (-grow_var.numpy()).tolist()


def apply_once(grad_of_rank, **kwargs) -> list:
    """SGD(lr=1) on v=0 with one gradient: the update is the reduced gradient."""
    v = keras.Variable(np.zeros(3, "float32"))
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), **kwargs)
    opt.apply([tf.constant(grad_of_rank, dtype=tf.float32)], [v])
    return (-v.numpy()).tolist()


g = [1.0 + rank, 2.0 - rank, 3.0 * (rank + 1)]
result["average"] = apply_once(g)
result["predivide"] = apply_once(g, gradient_predivide_factor=2.0)
result["sum"] = apply_once(g, op=hvd.Sum)
result["adasum"] = apply_once(g, op=hvd.Adasum)
result["own_process_set"] = apply_once(g, process_set=own_sets[rank])
result["grad"] = g
try:
    hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), op=hvd.Adasum, groups=2)
except ValueError as err:
    result["adasum_groups_error"] = str(err)


# Grouping: the same weights whatever the grouping, and equal to the mean of the ranks' gradients.
def model_fit(seed: int, **kwargs) -> list[np.ndarray]:
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(5, activation="tanh"),
                              keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(3)])
    model.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(0.3), **kwargs), "mse")
    rng = np.random.default_rng(100 + rank)
    x, y = rng.normal(size=(16, 6)).astype("float32"), rng.normal(size=(16, 3)).astype("float32")
    model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    return model.get_weights()


reference = model_fit(3)
result["groups_match"] = {}
for label, kwargs in {"groups=2": {"groups": 2}, "num_groups=3": {"num_groups": 3}, "groups=6": {"groups": 6}}.items():
    weights = model_fit(3, **kwargs)
    result["groups_match"][label] = float(max(np.abs(a - b).max() for a, b in zip(weights, reference)))
result["weights_fit"] = [w.tolist() for w in reference]


# Sparse gradients: IndexedSlices allgathered (sparse_as_dense=False) give the same update as densified.
def embedding_update(sparse_as_dense: bool) -> tuple[list, str]:
    table = keras.Variable(np.zeros((6, 2), "float32"))
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), sparse_as_dense=sparse_as_dense)
    ids = tf.constant([rank, 3])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.gather(table, ids) * (rank + 1.0))
    grad = tape.gradient(loss, table)
    opt.apply([grad], [table])
    return (-table.numpy()).tolist(), type(grad).__name__


result["sparse_allgather"], result["sparse_grad_type"] = embedding_update(False)
result["sparse_as_dense"], _ = embedding_update(True)


# DistributedGradientTape wrapping a recorded tape, Horovod's usage.
w = tf.Variable([1.0, 1.0])
with tf.GradientTape() as plain_tape:
    loss = tf.reduce_sum(w * float(rank + 1))
tape = hvd.DistributedGradientTape(plain_tape)
result["tape_grad"] = tape.gradient(loss, [w])[0].numpy().tolist()


# Backward passes: Horovod's aggregation (sum, or mean with average_aggregated_gradients) per k passes.
class AddGradient(keras.optimizers.Optimizer):
    def __init__(self, learning_rate: float = 1.0, name: str = "add", **kwargs) -> None:
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)

    def update_step(self, gradient, variable, learning_rate) -> None:
        variable.assign_add(gradient)


result["aggregation"] = {}
for passes in (1, 2, 3):
    for average in (False, True):
        v = tf.Variable([0.0])
        opt = hvd.DistributedOptimizer(AddGradient(), backward_passes_per_step=passes,
                                       average_aggregated_gradients=average)
        trace = []
        for step in range(7):
            opt.apply_gradients([(tf.constant([float(step + 1) * (rank + 1)]), v)])
            trace.append([float(v.numpy()[0]), int(opt.iterations.numpy())])
        result["aggregation"][f"{passes},{average}"] = trace


# Learning-rate callbacks: hvdk8s in a real fit against Horovod's own callback code driven batch by batch.
from horovod._keras import callbacks as horovod_impl  # noqa: E402  (the oracle: Horovod's formulas)


class _Backend:
    @staticmethod
    def get_value(holder):
        return holder.value

    @staticmethod
    def set_value(holder, value):
        holder.value = value


def horovod_lrs(impls: list, steps: int, epochs: int) -> list[float]:
    lr_holder = types.SimpleNamespace(value=0.5)
    model = types.SimpleNamespace(optimizer=types.SimpleNamespace(lr=lr_holder))
    for impl in impls:
        impl.model, impl.params = model, {"steps": steps}
        impl.on_train_begin()
    seen = []
    for epoch in range(epochs):
        for impl in impls:
            impl.on_epoch_begin(epoch)
        for batch in range(steps):
            for impl in impls:
                impl.on_batch_begin(batch)
            seen.append(lr_holder.value)
            for impl in impls:
                impl.on_batch_end(batch)
    return seen


class RecordLR(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.lrs: list[float] = []

    def on_train_batch_begin(self, batch, logs=None) -> None:
        self.lrs.append(float(self.model.optimizer.learning_rate.numpy()))


def hvdk8s_lrs(callbacks: list, steps: int, epochs: int) -> list[float]:
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(hvd.DistributedOptimizer(keras.optimizers.Adam(0.5)), "mse")
    record = RecordLR()
    x = np.ones((4 * steps, 2), "float32")
    model.fit(x, x[:, :1], batch_size=4, epochs=epochs, callbacks=[*callbacks, record], verbose=0, shuffle=False)
    return record.lrs


K = _Backend
ROWS = {
    "warmup 0.2 over 3 epochs": (
        lambda: [hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.2, warmup_epochs=3)],
        lambda: [horovod_impl.LearningRateWarmupCallbackImpl(K, 0.2, warmup_epochs=3)],
    ),
    "constant multiplier 0.5 from epoch 1 to 4 (staircase)": (
        lambda: [hvd.callbacks.LearningRateScheduleCallback(0.3, multiplier=0.5, start_epoch=1, end_epoch=4)],
        lambda: [horovod_impl.LearningRateScheduleCallbackImpl(K, 0.3, 0.5, start_epoch=1, end_epoch=4)],
    ),
    "function of the fractional epoch (no staircase)": (
        lambda: [hvd.callbacks.LearningRateScheduleCallback(0.3, multiplier=lambda e: 1 / (1 + e), staircase=False)],
        lambda: [horovod_impl.LearningRateScheduleCallbackImpl(K, 0.3, lambda e: 1 / (1 + e), staircase=False)],
    ),
    "a decay from epoch 1 overlapping the warm-up, after it in the list": (
        lambda: [hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.2, warmup_epochs=3),
                 hvd.callbacks.LearningRateScheduleCallback(0.2, multiplier=0.5, start_epoch=1)],
        lambda: [horovod_impl.LearningRateWarmupCallbackImpl(K, 0.2, warmup_epochs=3),
                 horovod_impl.LearningRateScheduleCallbackImpl(K, 0.2, 0.5, start_epoch=1)],
    ),
    "warm-up then two decays (Horovod's README recipe)": (
        lambda: [
            hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.4, warmup_epochs=2),
            hvd.callbacks.LearningRateScheduleCallback(0.4, multiplier=1.0, start_epoch=2, end_epoch=3),
            hvd.callbacks.LearningRateScheduleCallback(0.4, multiplier=1e-1, start_epoch=3),
        ],
        lambda: [
            horovod_impl.LearningRateWarmupCallbackImpl(K, 0.4, warmup_epochs=2),
            horovod_impl.LearningRateScheduleCallbackImpl(K, 0.4, 1.0, start_epoch=2, end_epoch=3),
            horovod_impl.LearningRateScheduleCallbackImpl(K, 0.4, 1e-1, start_epoch=3),
        ],
    ),
}
result["lr_rows"] = {
    name: {"hvdk8s": hvdk8s_lrs(ours(), 4, 5), "horovod": horovod_lrs(theirs(), 4, 5)}
    for name, (ours, theirs) in ROWS.items()
}


# A model Keras builds only during fit (no Input), Horovod's example style: broadcast after its first step.
keras.utils.set_random_seed(1000 + rank)
lazy = keras.Sequential([keras.layers.Dense(4, activation="relu"), keras.layers.Dense(2)])
lazy.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), "mse")
xs = np.random.default_rng(rank).normal(size=(16, 3)).astype("float32")
lazy.fit(xs, xs[:, :2], batch_size=4, epochs=1, verbose=0,
         callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
result["lazy_weights"] = [w.tolist() for w in lazy.get_weights()]

# load_model: the optimizer comes back distributed with its state; plain Keras loading warns in fit.
path = out / f"model{rank}.keras"
lazy.save(path)
loaded = hvd.load_model(path)
result["load_model"] = {
    "distributed": is_distributed(loaded.optimizer),
    "iterations": int(loaded.optimizer.iterations.numpy()),
    "class": type(loaded.optimizer).__name__,
}
plain = keras.models.load_model(path)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    plain.fit(xs, xs[:, :2], batch_size=4, epochs=1, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
result["plain_load_warning"] = [str(w.message) for w in caught if "DistributedOptimizer" in str(w.message)]

out.mkdir(parents=True, exist_ok=True)
(out / f"rank{rank}.json").write_text(json.dumps(result))
