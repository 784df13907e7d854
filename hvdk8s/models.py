"""Small image classifiers used by the examples, model selection and benchmarks."""
from __future__ import annotations

import keras
from keras import layers

from hvdk8s.common.argcheck import sizes, whole

VARIANTS = ("cnn", "cnn_dropout", "cnn_bn")


def cnn(
    variant: str = "cnn",
    input_shape: tuple[int, int, int] = (28, 28, 1),
    num_classes: int = 10,
    seed: int | None = None,
) -> keras.Model:
    """A two-block CNN, plain, with dropout, or with batch normalisation.

    The three candidates the model-selection step compares. Each block is a
    3x3 convolution (32, then 64 filters), ReLU and 2x2 max pooling, followed
    by a 128-unit dense layer and a softmax output named ``probabilities``.

    Args:
        variant: One of ``VARIANTS``: ``"cnn"`` (plain), ``"cnn_dropout"`` (dropout 0.3 before the dense
            layer) or ``"cnn_bn"`` (batch normalisation after each convolution, which then has no bias).
        input_shape: Height, width and channels of the input images.
        num_classes: Number of output classes.
        seed: Fixes the initial weights (and the dropout); None for random ones. Ranks may still start
            different: training broadcasts rank 0's.

    Returns:
        An uncompiled ``keras.Sequential`` model named after ``variant``.

    Raises:
        ValueError: ``variant`` is not one of ``VARIANTS``; ``input_shape`` is no tuple or list of three, or its height
            or width is below 4 (two 2x2 poolings) or its channels below 1; ``num_classes`` is below 1.
        TypeError: A side of ``input_shape``, or ``num_classes``, is not a whole number.

    Example:
        ```python
        from hvdk8s import models

        model = models.cnn("cnn_bn", input_shape=(28, 28, 1), num_classes=10, seed=0)
        ```
    """
    if variant not in VARIANTS:
        raise ValueError(f"model variant {variant!r}: expected one of {VARIANTS}")
    sizes("input_shape", input_shape, (4, 4, 1), "(height, width, channels)")
    whole("num_classes", num_classes)
    init = keras.initializers.GlorotUniform(seed=seed)
    bn = variant == "cnn_bn"
    model = keras.Sequential(name=variant)
    model.add(keras.Input(shape=input_shape, name="image"))
    for filters in (32, 64):
        model.add(layers.Conv2D(filters, 3, padding="same", use_bias=not bn, kernel_initializer=init))
        if bn:
            model.add(layers.BatchNormalization())
        model.add(layers.Activation("relu"))
        model.add(layers.MaxPooling2D())
    model.add(layers.Flatten())
    if variant == "cnn_dropout":
        model.add(layers.Dropout(0.3, seed=seed))
    model.add(layers.Dense(128, activation="relu", kernel_initializer=init))
    model.add(layers.Dense(num_classes, activation="softmax", kernel_initializer=init, name="probabilities"))
    return model
