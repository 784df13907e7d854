"""``hvdk8s.load_model``: a saved Keras model whose optimizer comes back distributed.

``keras.models.load_model`` returns the plain optimizer that was saved, so a
model resumed that way trains each rank on its own gradients. This wraps the
optimizer class while Keras deserialises it (``keras_compat.load_overrides``),
so its saved state (slots, iterations) is restored into the distributed one.

Legacy HDF5 (``.h5`` / ``.hdf5``) whole-model saves are refused: Keras 3.8 and
3.15 load them with an optimizer built for none of the model's layers'
variables, so the first training step fails and the saved optimizer state is
dropped (``keras_compat.legacy_h5_saved_with_optimizer`` says how). Keras
cannot resume training from such a file, distributed or not.
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import keras
from horovod.tensorflow import Compression

from hvdk8s.common.files import check_model_file
from hvdk8s.train import keras_compat
from hvdk8s.train.optimizer import DistributedOptimizer


def _keras_optimizer_classes() -> list[type]:
    """Keras's own optimizer classes: those ``keras.optimizers`` exports (``Optimizer`` itself aside)."""
    return [
        value for value in vars(keras.optimizers).values()
        if isinstance(value, type) and issubclass(value, keras.optimizers.Optimizer)
        and value is not keras.optimizers.Optimizer
    ]  # fmt: skip


def load_model(
    filepath: str | os.PathLike[str],
    custom_optimizers: Sequence[type] | None = None,
    custom_objects: Mapping[str, Any] | None = None,
    compression: Any = Compression.none,
    legacy_opts: bool = False,
) -> keras.Model:
    """Load a ``.keras`` model with its optimizer wrapped in ``DistributedOptimizer`` (Horovod's signature).

    Every ``keras.optimizers`` class and each of ``custom_optimizers`` is
    wrapped; ``custom_objects`` are passed on to Keras. ``legacy_opts`` (Keras
    2's ``keras.optimizers.legacy``) does not exist in Keras 3 and is refused.
    A legacy HDF5 (``.h5``) model saved with its optimizer is refused:
    Keras 3 cannot resume training from one. One saved without an optimizer
    loads uncompiled, as with Keras. Each rank loads its own copy: give
    ``fit`` ``BroadcastGlobalVariablesCallback(0)`` so all start from rank 0's.

    Args:
        filepath: The saved model (``.keras``).
        custom_optimizers: Optimizer classes of your own to wrap as well.
        custom_objects: Custom layers, losses and other objects, passed on to ``keras.models.load_model``.
        compression: Horovod's ``Compression.none`` or ``Compression.fp16`` for the wrapped optimizer's
            allreduces.
        legacy_opts: Horovod's flag for Keras 2's legacy optimizers; True is refused.

    Returns:
        The model, compiled with its optimizer wrapped in ``DistributedOptimizer`` when it was saved with one.

    Raises:
        ValueError: ``legacy_opts`` is True; ``filepath`` is a local file that is no model file
            (``hvdk8s.common.files.check_model_file``; URLs and folders are Keras's to read), or a legacy HDF5
            model saved with its optimizer.
        TypeError: ``custom_optimizers`` is not a list of optimizer classes.

    Example:
        ```python
        hvd.init()
        model = hvd.load_model("checkpoints/ckpt-0010.keras")
        model.fit(dataset, initial_epoch=10, epochs=20,
                  callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
        ```
    """
    if legacy_opts:
        raise ValueError("load_model(legacy_opts=True): Keras 3 has no keras.optimizers.legacy optimizers")
    custom = _optimizer_classes(custom_optimizers)
    if "://" not in os.fspath(filepath) and not os.path.isdir(filepath):  # Keras reads URLs and model folders itself
        check_model_file(filepath)
    _refuse_legacy_h5(filepath)

    def distributed(cls: type[Any], config: dict) -> keras.optimizers.Optimizer:
        return DistributedOptimizer(cls.from_config(config), compression=compression)

    objects: dict[str, Any] = keras_compat.load_overrides(
        [*_keras_optimizer_classes(), *custom], distributed
    )
    objects.update(custom_objects or {})
    return keras.models.load_model(filepath, custom_objects=objects)


def _optimizer_classes(custom_optimizers: Sequence[type] | None) -> list[type]:
    """``custom_optimizers`` as a list, or a ``TypeError`` naming it for anything but optimizer classes."""
    if custom_optimizers is None:
        return []
    if isinstance(custom_optimizers, (str, type)):
        raise TypeError(f"custom_optimizers: expected a list of optimizer classes, got {custom_optimizers!r}")
    classes = list(custom_optimizers)  # once: a generator is used up by reading it
    for entry in classes:
        if not (isinstance(entry, type) and issubclass(entry, keras.optimizers.Optimizer)):
            raise TypeError("custom_optimizers: expected optimizer classes (keras.optimizers.Optimizer subclasses), "
                            f"got {type(entry).__name__} {entry!r}")
    return classes


LEGACY_H5_MESSAGE = (
    "{path} is a legacy HDF5 whole-model save (what Keras 3 writes for a .h5 path in ModelCheckpoint or model.save): "
    "Keras 3 cannot resume training from it (its legacy loader builds the optimizer for none of the model's "
    "variables, so fit fails with 'Unknown variable', and the saved optimizer state is lost), so hvdk8s.load_model "
    "refuses it. Save checkpoints as .keras instead (ModelCheckpoint('checkpoint-{{epoch}}.keras'), "
    "model.save('model.keras')): `hvdk8s migrate` rewrites .h5 checkpoint paths, argparse defaults included. To go "
    "on from this file's weights with a fresh optimizer: keras.models.load_model(path, compile=False), then compile "
    "it with hvdk8s.DistributedOptimizer."
)


def _refuse_legacy_h5(filepath: str | os.PathLike[str]) -> None:
    """Raise for a path Keras would load as a legacy HDF5 model that was saved with its optimizer."""
    if keras_compat.legacy_h5_saved_with_optimizer(filepath):
        raise ValueError(LEGACY_H5_MESSAGE.format(path=os.fspath(filepath)))
