"""``hvdk8s.load_model``: a saved Keras model whose optimizer comes back distributed.

``keras.models.load_model`` returns the plain optimizer that was saved, so a
model resumed that way trains each rank on its own gradients. This wraps the
optimizer class while Keras deserialises it, so its saved state (slots,
iterations) is restored into the distributed one.
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import keras
from horovod.tensorflow.compression import Compression

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


def _wrapping(cls: type, compression: Any) -> type:
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
    """
    if legacy_opts:
        raise ValueError("load_model(legacy_opts=True): Keras 3 has no keras.optimizers.legacy optimizers")
    objects: dict[str, Any] = {}
    for cls in [*_keras_optimizer_classes(), *(custom_optimizers or [])]:
        objects[cls.__name__] = _wrapping(cls, compression)
    objects.update(custom_objects or {})
    return keras.models.load_model(filepath, custom_objects=objects)
