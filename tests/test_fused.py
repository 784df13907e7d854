"""The fused SGD update: Keras 3's arithmetic, bit for bit, in one TensorFlow kernel per variable.

Runs in-process on one Horovod rank (the gradient reduction is a no-op there);
``test_training.py`` checks the same optimizer across real ranks against plain
Keras.
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

SHAPES = ((30, 7), (7,))
# In the test process TensorFlow may already run (earlier in-process tests), so init cannot pin threads.
pytestmark = pytest.mark.filterwarnings("ignore:.*device and thread pinning skipped:UserWarning")


def train(opt, dtype: str, steps: int = 4, sparse: bool = False) -> tuple[list[np.ndarray], Counter]:
    """Apply ``steps`` seeded gradients with ``opt``: final variables and momentums, and the step's op counts."""
    import keras
    import tensorflow as tf

    rng = np.random.default_rng(0)
    variables = [keras.Variable(rng.normal(size=s).astype("float32"), dtype=dtype) for s in SHAPES]

    @tf.function
    def step(grads):
        if sparse:  # rows 1 and 4 of the first variable only
            grads = [tf.IndexedSlices(grads[0][:2], tf.constant([1, 4]), tf.constant(SHAPES[0])), grads[1]]
        opt.apply(grads, variables)

    specs = [tf.TensorSpec(s, dtype) for s in SHAPES]
    for _ in range(steps):
        step([tf.constant(rng.normal(size=s), dtype=dtype) for s in SHAPES])
    graph = step.get_concrete_function(specs).graph
    op_types = Counter(op.type for op in graph.get_operations())
    for function in graph.as_graph_def().library.function:
        op_types.update(node.op for node in function.node_def)
    state = [*variables, *getattr(opt, "momentums", [])]
    return [keras.ops.convert_to_numpy(v).astype("float64") for v in state], op_types


@pytest.fixture(scope="module")
def hvd():
    import hvdk8s

    hvdk8s.init(quiet=True)
    return hvdk8s


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
@pytest.mark.parametrize("momentum,nesterov", [(0.0, False), (0.9, False), (0.9, True)])
def test_fused_sgd_equals_keras_sgd_bit_for_bit(hvd, dtype: str, momentum: float, nesterov: bool) -> None:
    import keras

    expected, keras_ops = train(keras.optimizers.SGD(0.05, momentum=momentum, nesterov=nesterov), dtype)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=momentum, nesterov=nesterov))
    got, ops = train(opt, dtype)
    kernel = "ResourceApplyKerasMomentum" if momentum else "ResourceApplyGradientDescent"
    assert ops[kernel] == len(SHAPES) and kernel not in keras_ops  # one kernel per variable; Keras: separate ops
    for a, b in zip(expected, got):
        assert np.array_equal(a, b)
    assert not np.array_equal(got[0], train(keras.optimizers.SGD(0.0), dtype)[0][0])  # the weights moved


def test_sparse_gradients_keep_keras_update_whose_momentum_decays_every_row(hvd) -> None:
    import keras

    expected, _ = train(keras.optimizers.SGD(0.05, momentum=0.9), "float32", sparse=True)
    got, ops = train(hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)), "float32", sparse=True)
    for a, b in zip(expected, got):
        assert np.array_equal(a, b)
    assert ops["ResourceApplyKerasMomentum"] == 1  # the dense gradient's variable is still fused


def test_only_keras_own_sgd_update_is_fused(hvd) -> None:
    import keras

    from hvdk8s.train.fused import FusedSGD

    class ClippedSGD(keras.optimizers.SGD):
        def update_step(self, gradient, variable, learning_rate):
            super().update_step(keras.ops.clip(gradient, -0.1, 0.1), variable, learning_rate)

    class NamedSGD(keras.optimizers.SGD):
        pass

    assert FusedSGD in type(hvd.DistributedOptimizer(NamedSGD(0.1))).__mro__
    assert FusedSGD not in type(hvd.DistributedOptimizer(ClippedSGD(0.1))).__mro__
    assert FusedSGD not in type(hvd.DistributedOptimizer(keras.optimizers.Adam())).__mro__
    expected, _ = train(ClippedSGD(0.05, momentum=0.9), "float32")
    got, ops = train(hvd.DistributedOptimizer(ClippedSGD(0.05, momentum=0.9)), "float32")
    for a, b in zip(expected, got):
        assert np.array_equal(a, b)
    assert "ResourceApplyKerasMomentum" not in ops


def test_load_model_brings_back_the_fused_update_with_its_momentum(hvd, tmp_path) -> None:
    import keras

    from hvdk8s.train.fused import FusedSGD

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)), "mse")
    x, y = np.ones((8, 4), "float32"), np.zeros((8, 3), "float32")
    model.fit(x, y, epochs=2, verbose=0)
    model.save(tmp_path / "m.keras")
    loaded = hvd.load_model(tmp_path / "m.keras")
    assert FusedSGD in type(loaded.optimizer).__mro__
    for saved, restored in zip(model.optimizer.momentums, loaded.optimizer.momentums):
        assert np.array_equal(saved.numpy(), restored.numpy()) and np.abs(saved.numpy()).max() > 0
    for m in (model, loaded):  # resumed training continues exactly: the kernel updates the restored slots
        m.fit(x, y, epochs=1, verbose=0)
    for a, b in zip(model.get_weights(), loaded.get_weights()):
        assert np.array_equal(a, b)
