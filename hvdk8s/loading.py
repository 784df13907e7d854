"""``hvdk8s.load_model``: a saved Keras model whose optimizer comes back distributed.

``keras.models.load_model`` returns the plain optimizer that was saved, so a
model resumed that way trains each rank on its own gradients. This wraps the
optimizer class while Keras deserialises it, so its saved state (slots,
iterations) is restored into the distributed one.

Legacy HDF5 (``.h5`` / ``.hdf5``) whole-model saves are refused: Keras 3.8 and
3.15 load them with an optimizer built for no variables (``model.optimizer.build(
model._trainable_variables)``, the model's own variables, none of its layers'),
so the first training step fails ("Unknown variable", which Keras 3.8 hides
behind "numpy() is only available when eager execution is enabled") and the
saved optimizer state is dropped; and they deserialise the optimizer under its
lower-cased class name, past the wrapped classes. Keras cannot resume training
from such a file, distributed or not.
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import keras
from horovod.tensorflow import Compression

from hvdk8s.optimizer import DistributedOptimizer, is_distributed_class


def _keras_optimizer_classes() -> list[type]:
    """Keras's own optimizer classes (not user subclasses, not distributed wrappers sharing their names)."""
    found, todo = [], [keras.optimizers.Optimizer]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in found and sub.__module__.startswith("keras.") and not is_distributed_class(sub):
                found.append(sub)
                todo.append(sub)
    return found


def _wrapping(cls: type[keras.optimizers.Optimizer], compression: Any) -> type:
    """A class Keras can deserialise by name whose ``from_config`` returns the distributed optimizer."""

    def from_config(_cls: type, config: Mapping[str, Any], custom_objects: Any = None) -> keras.optimizers.Optimizer:
        return DistributedOptimizer(cls.from_config(dict(config)), compression=compression)

    return type(cls.__name__, (cls,), {"from_config": classmethod(from_config), "__module__": cls.__module__})


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
        ValueError: ``legacy_opts`` is True, or ``filepath`` is a legacy HDF5 model saved with its optimizer.

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
    _refuse_legacy_h5(filepath)
    objects: dict[str, Any] = {}
    for cls in [*_keras_optimizer_classes(), *(custom_optimizers or [])]:
        objects[cls.__name__] = _wrapping(cls, compression)
    objects.update(custom_objects or {})
    return keras.models.load_model(filepath, custom_objects=objects)


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
    if not str(filepath).endswith((".h5", ".hdf5")):
        return  # Keras chooses its loader by the suffix alone
    import h5py

    try:
        with h5py.File(filepath, "r") as f:
            compiled = "training_config" in f.attrs
    except OSError:
        return  # missing or not HDF5: Keras's own error says so
    if compiled:
        raise ValueError(LEGACY_H5_MESSAGE.format(path=os.fspath(filepath)))
