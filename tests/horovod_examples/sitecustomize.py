"""Test harness for Horovod's Keras examples, loaded through PYTHONPATH by tests/test_migrate_examples.py.

The examples are run unchanged apart from ``hvdk8s migrate``; this module changes their world instead:

- ``keras.datasets.mnist.load_data`` (also reached as ``tf.keras.datasets.mnist``) returns scikit-learn's
  bundled digits upscaled to MNIST's shapes and dtypes (28x28 uint8 images, uint8 labels): nothing is downloaded.
- ``ImageDataGenerator.flow_from_directory`` (Keras's legacy preprocessing module) serves the same digits as 32x32
  RGB images in 10 classes through ``ImageDataGenerator.flow``, so an example's augmentation and
  ``preprocess_input`` still run: ``HVDK8S_EXAMPLE_IMAGES`` images (64 unless set) for a directory whose path
  contains "train", half as many from the held-out digits for any other. Nothing is read from ``~/imagenet``.
- ``keras.applications.resnet50.ResNet50`` builds Keras's ResNet from ResNet-50's own bottleneck blocks, one per
  stage instead of 3, 4, 6 and 3, for those 32x32 inputs and 10 classes unless the caller names
  ``input_shape``/``classes`` (the ImageNet examples call ``ResNet50(weights=None)``): the same layer types
  (Conv2D, BatchNormalization, Add) for an example's regularizer and BatchNormalization edits, ``from_config``
  and ``load_model``, at about a third of the tracing time and checkpoint size.
- ``Model.fit`` caps ``epochs``, ``steps_per_epoch`` and ``validation_steps`` (keyword arguments) at
  ``HVDK8S_EXAMPLE_MAX_EPOCHS`` / ``HVDK8S_EXAMPLE_MAX_STEPS`` when set, so 24-epoch examples fit a test budget.
- With ``HVDK8S_EXAMPLE_HOLD_FOR_RANKS=N``, a ``fit`` of more than one epoch (an example's training, not its
  one-step warm-up) pauses ``HOLD_PAUSE_SECONDS`` after each batch while the job has fewer than N ranks, for
  ``HOLD_SECONDS`` at most: capped examples train in a second or two, faster than a worker that an elastic
  test adds can start and join (the example's commit after a batch is where the job takes it in).

The patches are applied when Keras imports the modules, so processes that never import Keras pay nothing.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any


def digits_as_mnist(path: str = "mnist.npz") -> tuple[tuple[Any, Any], tuple[Any, Any]]:
    """scikit-learn's 1,797 8x8 digits (0..16) as 28x28 uint8 (0..255) MNIST-style train/test splits."""
    import numpy as np
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.kron(digits.images, np.ones((3, 3)))  # 24x24
    images = np.pad(images, ((0, 0), (2, 2), (2, 2)))  # 28x28, a blank border like MNIST's
    images = np.round(images * (255 / 16)).astype(np.uint8)
    labels = digits.target.astype(np.uint8)
    return (images[:1500], labels[:1500]), (images[1500:], labels[1500:])


def digits_as_imagenet(count: int, offset: int) -> tuple[Any, Any]:
    """``count`` digits from ``offset`` as 32x32 RGB float images (0..255) with one-hot labels over 10 classes."""
    import numpy as np
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.kron(digits.images[offset : offset + count], np.ones((4, 4)))  # 32x32
    images = np.repeat(images[..., None], 3, axis=-1) * (255 / 16)
    labels = np.eye(10, dtype="float32")[digits.target[offset : offset + count]]
    return images.astype("float32"), labels


def capped_fit(fit: Callable[..., Any]) -> Callable[..., Any]:
    caps = {
        "epochs": os.environ.get("HVDK8S_EXAMPLE_MAX_EPOCHS"),
        "steps_per_epoch": os.environ.get("HVDK8S_EXAMPLE_MAX_STEPS"),
        "validation_steps": os.environ.get("HVDK8S_EXAMPLE_MAX_STEPS"),
    }

    hold_for = int(os.environ.get("HVDK8S_EXAMPLE_HOLD_FOR_RANKS") or 0)

    def fit_with_caps(self: Any, *args: Any, **kwargs: Any) -> Any:
        for name, cap in caps.items():
            if cap and kwargs.get(name) is not None:
                kwargs[name] = min(kwargs[name], int(cap))
        if hold_for and (kwargs.get("epochs") or 1) > 1:
            kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), _hold_for_ranks(hold_for)]
        return fit(self, *args, **kwargs)

    return fit_with_caps


HOLD_SECONDS = 120.0
HOLD_PAUSE_SECONDS = 3.0


def _hold_for_ranks(ranks: int) -> Any:
    """A callback that pauses after each batch while Horovod has fewer than ``ranks`` ranks (HOLD_SECONDS at most)."""
    import time

    import horovod.tensorflow as hvd
    import keras

    class HoldForRanks(keras.callbacks.Callback):
        def on_train_begin(self, logs: Any = None) -> None:
            self.deadline = time.monotonic() + HOLD_SECONDS

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            # runs after the example's elastic commit callback, which resets the job once the worker has joined
            if hvd.size() < ranks and time.monotonic() < self.deadline:
                time.sleep(HOLD_PAUSE_SECONDS)

    return HoldForRanks()


def _patch_mnist(module: ModuleType) -> None:
    module.load_data = digits_as_mnist


def _patch_model(module: ModuleType) -> None:
    module.Model.fit = capped_fit(module.Model.fit)


def _patch_image(module: ModuleType) -> None:
    count = int(os.environ.get("HVDK8S_EXAMPLE_IMAGES") or 64)

    def flow_from_directory(self: Any, directory: str, target_size: Any = None, batch_size: int = 32,
                            **kwargs: Any) -> Any:  # fmt: skip
        x, y = digits_as_imagenet(count, 0) if "train" in str(directory) else digits_as_imagenet(count // 2, 1500)
        return self.flow(x, y, batch_size=batch_size, shuffle=True)

    module.ImageDataGenerator.flow_from_directory = flow_from_directory


def _patch_resnet(module: ModuleType) -> None:
    def stages(x: Any) -> Any:  # ResNet50's stack_fn (keras/src/applications/resnet.py) with 1 block per stage
        x = module.stack_residual_blocks_v1(x, 64, 1, stride1=1, name="conv2")
        for filters, name in ((128, "conv3"), (256, "conv4"), (512, "conv5")):
            x = module.stack_residual_blocks_v1(x, filters, 1, name=name)
        return x

    def ResNet50(*args: Any, **kwargs: Any) -> Any:  # noqa: N802 (Keras's name; ResNet's arguments follow in its order)
        kwargs.setdefault("input_shape", (32, 32, 3))
        kwargs.setdefault("classes", 10)
        return module.ResNet(stages, False, True, *args, **kwargs)  # stack_fn, preact, use_bias as ResNet50's

    module.ResNet50 = ResNet50


PATCHES = {
    "keras.src.datasets.mnist": _patch_mnist,
    "keras.src.models.model": _patch_model,
    "keras.src.legacy.preprocessing.image": _patch_image,
    "keras.src.applications.resnet": _patch_resnet,
}


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds the modules in PATCHES as usual and patches each right after it executes."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name not in PATCHES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader_exec = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            loader_exec(module)
            PATCHES[name](module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


sys.meta_path.insert(0, _PatchOnImport())
