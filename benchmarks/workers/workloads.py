"""The models, data and optimizer every strategy trains: one definition, no per-strategy drift.

Imported only inside worker processes (it loads TensorFlow and Keras).
"""
from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

import hvdk8s.data
import hvdk8s.models

from ..config import synthetic
from ..config.settings import Workload

INPUT_SHAPE = {"cnn": (28, 28, 1)}
APPLICATION_SHAPE = (224, 224, 3)  # Horovod's synthetic benchmarks' images
NUM_CLASSES = 10  # labels of the synthetic batches: valid for the 1000-class keras.applications models too


def input_shape(workload: Workload) -> tuple[int, ...]:
    if synthetic.model_of(workload.name):
        return APPLICATION_SHAPE
    return INPUT_SHAPE.get(workload.name, (workload.mlp_width,))


def build_model(workload: Workload, seed: int = 0) -> keras.Model:
    """The compute-bound CNN is the library's own digits model; the MLP is all dense weights; a
    ``horovod-synthetic:<Model>`` workload is that keras.applications model, as Horovod's benchmark builds it."""
    if model := synthetic.model_of(workload.name):
        return getattr(keras.applications, model)(weights=None)  # initial weights: each harness broadcasts rank 0's
    if workload.name == "cnn":
        return hvdk8s.models.cnn("cnn", input_shape=INPUT_SHAPE["cnn"], seed=seed)
    init = keras.initializers.GlorotUniform(seed=seed)
    return keras.Sequential(
        [
            keras.Input(shape=(workload.mlp_width,)),
            keras.layers.Dense(workload.mlp_width, activation="relu", kernel_initializer=init),
            keras.layers.Dense(workload.mlp_width, activation="relu", kernel_initializer=init),
            keras.layers.Dense(NUM_CLASSES, activation="softmax", kernel_initializer=init),
        ],
        name="mlp",
    )


def optimizer(lr: float) -> keras.optimizers.Optimizer:
    return keras.optimizers.SGD(lr, momentum=0.9)


def per_example_loss() -> keras.losses.Loss:
    """Unreduced, so distributed loops can divide by the global batch themselves."""
    return keras.losses.SparseCategoricalCrossentropy(reduction=None)


def synthetic_batch(workload: Workload, batch: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.random((batch, *input_shape(workload)), dtype=np.float32)
    y = rng.integers(0, NUM_CLASSES, size=(batch,), dtype=np.int64)
    return x, y


def synthetic_dataset(workload: Workload, batch: int, seed: int = 0) -> tf.data.Dataset:
    """One fixed batch repeated forever: measures training, not the input pipeline."""
    x, y = synthetic_batch(workload, batch, seed)
    return tf.data.Dataset.from_tensors((x, y)).repeat()


def digits() -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """The real data for time to accuracy: scikit-learn's bundled digits at 28x28."""
    return hvdk8s.data.load_digits(image_size=28)


def digits_dataset(x: np.ndarray, y: np.ndarray, batch: int, rank: int, size: int, seed: int) -> tf.data.Dataset:
    """Rank's shard of the training set, shuffled each pass, repeated forever."""
    # hvdk8s.data.shard reads the dataset's length eagerly; ParameterServerStrategy builds this
    # inside a traced function, so the even split uses the arrays' length instead.
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    ds = ds.take(len(x) - len(x) % size).shard(size, rank)
    ds = ds.shuffle(len(x), seed=seed, reshuffle_each_iteration=True)
    return ds.batch(batch, drop_remainder=True).repeat().prefetch(tf.data.AUTOTUNE)


def accuracy(model: keras.Model, x: np.ndarray, y: np.ndarray) -> float:
    """A direct call, not ``predict``: Keras 3 cannot predict under a PS or multi-worker strategy."""
    probs = model(tf.constant(x), training=False)
    return float(np.mean(np.argmax(keras.ops.convert_to_numpy(probs), axis=1) == y))
