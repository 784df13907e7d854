"""Export a Keras image classifier as one TensorFlow Serving model version.

TensorFlow Serving watches ``base_path`` and loads every sub-folder whose
name is an integer as a version of the model. A version is therefore built
under a hidden temporary name in the same folder (one that is not a number,
so the server ignores it) and renamed into place when complete: a polling
server never sees a half-written version.

The ``serving_default`` signature takes raw JPEG/PNG bytes (TF Serving's REST
API turns ``{"b64": ...}`` into those), so clients need neither TensorFlow
nor the model's input size or normalisation; ``predict_tensor`` takes the
model's own float input for callers that preprocess themselves.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hvdk8s.common import argcheck
from hvdk8s.common.atomic import atomic_directory

SERVING_SIGNATURE = "serving_default"
TENSOR_SIGNATURE = "predict_tensor"
IMAGE_INPUT = "image_bytes"
TENSOR_INPUT = "images"
METADATA_FILE = Path("assets.extra") / "hvdk8s.json"
"""Export record inside each version; TF Serving ignores ``assets.extra`` except warm-up files."""

PREPROCESSING: dict[str, Callable[[Any], Any]] = {
    "unit": lambda pixels: pixels / 255.0,  # [0, 1]: what hvdk8s.data and the examples train on
    "symmetric": lambda pixels: pixels / 127.5 - 1.0,  # [-1, 1]
    "raw": lambda pixels: pixels,  # [0, 255]: for models with their own Rescaling layer
}
_VERSION = re.compile(r"^\d+$")
MAX_VERSION = 2**63 - 1
"""TF Serving's versions are int64: a folder named by a larger number is no version."""


def versions(base_path: str | os.PathLike[str]) -> list[int]:
    """The version numbers present under ``base_path``, ascending (as TF Serving sees them).

    Args:
        base_path: The model's base path (one folder per version).

    Returns:
        The versions, ascending; empty for a missing or empty folder.
    """
    return sorted(version_dirs(base_path))


def version_dirs(base_path: str | os.PathLike[str]) -> dict[int, Path]:
    """Each version number under ``base_path`` and its folder, as TF Serving's file-system source reads them.

    A folder name is a version if it parses as an integer, zero padding
    included (``00000123`` is version 123, loaded from ``00000123/``); of
    two names for one number the last by name wins, as there (a warning in
    tensorflow_serving/sources/storage_path/file_system_storage_path_source.cc,
    ``IndexChildrenByVersion``).
    """
    root = Path(base_path)
    if not root.is_dir():
        return {}
    found = sorted(p for p in root.iterdir() if _VERSION.match(p.name) and p.is_dir())
    return {int(p.name): p for p in found if int(p.name) <= MAX_VERSION}


def next_version(base_path: str | os.PathLike[str]) -> int:
    """The version ``export`` writes next by default.

    Args:
        base_path: The model's base path.

    Returns:
        One more than the highest version present, 1 for an empty or missing folder.
    """
    return max(versions(base_path), default=0) + 1


def read_metadata(version_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The record ``export`` wrote beside a version (class names, preprocessing, metrics...).

    Args:
        version_dir: A version folder, ``base_path/<version>``.

    Returns:
        The contents of its ``assets.extra/hvdk8s.json``.

    Raises:
        FileNotFoundError: The version has no such record (it was not written by ``export``).
    """
    return json.loads((Path(version_dir) / METADATA_FILE).read_text())


def load_keras_model(path: str | os.PathLike[str]) -> Any:
    """The model in a ``.keras`` (or legacy ``.h5``/``.hdf5``) file, or a ``ValueError`` that says what is wrong with
    the file (``hvdk8s.common.files.check_model_file``) or what Keras said of it."""
    import keras

    from hvdk8s.common.files import check_model_file  # here: the CLI imports this module for its constants

    file = check_model_file(path)

    try:
        return keras.models.load_model(file, compile=False)
    except Exception as err:  # noqa: BLE001  (Keras raises many types; name the file and what it said)
        raise ValueError(f"model {file}: cannot be loaded as a Keras model ({type(err).__name__}: {err})") from None


def export(
    model: Any,
    base_path: str | os.PathLike[str],
    version: int | None = None,
    class_names: Sequence[str] | None = None,
    preprocessing: str | Callable[[Any], Any] = "unit",
    metadata: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``model`` as ``base_path/<version>/`` (a SavedModel) and return that folder.

    ``version`` defaults to the next integer. ``preprocessing`` maps float32
    pixels in [0, 255] (decoded, channel-converted, bilinearly resized to the
    model's input size, as ``keras.utils.image_dataset_from_directory`` does)
    to the model's input: a name from ``PREPROCESSING`` or a TensorFlow
    function. ``metadata`` (e.g. evaluation metrics) is stored in the version's
    ``assets.extra/hvdk8s.json`` together with the export settings, numpy
    scalars (``np.float32(0.9)``) as the Python numbers they hold.

    Every argument is checked before anything is written. The version is
    written under a temporary name and renamed into place, so a polling server
    never loads half of it. Its ``serving_default`` signature takes encoded
    JPEG or PNG bytes (``image_bytes``); ``predict_tensor`` takes the model's
    own float input (``images``).

    Args:
        model: A built Keras classifier with one image input ``(batch, height, width, channels)`` and one
            output ``(batch, classes)``.
        base_path: The model's base path, the folder TF Serving watches.
        version: The version number; None for ``next_version(base_path)``.
        class_names: A name (a ``str``) per output class, in output order, returned beside the probabilities;
            None for none.
        preprocessing: ``"unit"`` (pixels / 255, the default), ``"symmetric"`` (to [-1, 1]), ``"raw"``
            ([0, 255] unchanged, for models with their own ``Rescaling`` layer), or a TensorFlow function.
        metadata: Further entries for the version's record: JSON values (numpy scalars too), under keys that
            are not the record's own.

    Returns:
        The version folder, ``base_path/<version>``.

    Raises:
        ValueError: The model is not a one-input, one-output image classifier; ``class_names`` does not
            match its outputs; ``version`` is below 0 or above ``MAX_VERSION``; ``preprocessing`` is
            unknown; or ``metadata`` uses a reserved key.
        TypeError: ``version`` is not a whole number; ``class_names`` is a string or holds a name that is not
            one; a ``metadata`` entry cannot be stored as JSON.
        FileExistsError: The version exists already.

    Example:
        ```python
        from hvdk8s import serving

        version_dir = serving.export(model, "models/digits", class_names=[str(i) for i in range(10)],
                                     metadata={"metrics": {"accuracy": 0.97}})
        ```
    """
    height, width, channels, num_classes = _image_classifier_shape(model)
    normalise = _preprocessing_fn(preprocessing)
    names = _class_names(class_names)
    if names is not None and len(names) != num_classes:
        raise ValueError(f"class_names: {len(names)} names for a model with {num_classes} outputs")
    root = Path(base_path)
    version = next_version(root) if version is None else version
    version = argcheck.whole("version", version, 0)
    if version > MAX_VERSION:
        raise ValueError(f"version={version}: must be <= {MAX_VERSION} (TF Serving's versions are int64)")
    final = root / str(version)
    if final.exists():
        raise FileExistsError(f"version {version} already exists at {final}")

    if isinstance(preprocessing, str):
        preprocessing_name = preprocessing
    else:
        preprocessing_name = getattr(preprocessing, "__name__", "custom")
    record = {
        "version": version,
        "model": model.name,
        "input_shape": [height, width, channels],
        "class_names": names,
        "preprocessing": preprocessing_name,
        "signatures": {SERVING_SIGNATURE: IMAGE_INPUT, TENSOR_SIGNATURE: TENSOR_INPUT},
        "exported_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    clash = sorted(set(record) & set(metadata or {}))
    if clash:
        raise ValueError(f"metadata: keys {clash} are reserved for the export record")
    for key, value in (metadata or {}).items():
        try:
            json.dumps({key: value}, default=_numpy_scalar)
        except (TypeError, ValueError) as err:  # ValueError: a circular reference
            raise TypeError(f"metadata[{key!r}]: cannot be stored as JSON ({err})") from None
    record.update(metadata or {})
    record_json = json.dumps(record, indent=2, default=_numpy_scalar) + "\n"

    archive = _archive(model, (height, width, channels), normalise, names)
    with atomic_directory(final) as tmp:  # only once the arguments are known to be good
        with contextlib.redirect_stdout(io.StringIO()):  # Keras prints the temporary path
            archive.write_out(os.fspath(tmp), verbose=False)
        (tmp / METADATA_FILE).parent.mkdir(parents=True, exist_ok=True)
        (tmp / METADATA_FILE).write_text(record_json)
        if final.exists():  # another exporter took the number meanwhile (the rename refuses one taken later)
            raise FileExistsError(f"version {version} already exists at {final}")
    return final


def _class_names(class_names: Sequence[str] | None) -> list[str] | None:
    """``class_names`` as a list, or a TypeError for a string (not split into characters) or a name that is no string."""
    if class_names is None:
        return None
    if isinstance(class_names, str):
        raise TypeError(f"class_names: expected a sequence of names, got the string {class_names!r} (for one name "
                        "per character pass list(...))")
    names = list(class_names)
    for i, name in enumerate(names):
        if not isinstance(name, str):
            raise TypeError(f"class_names[{i}]: expected a str, got {type(name).__name__} {name!r}")
    return names


def _numpy_scalar(value: Any) -> Any:
    """``json.dumps``'s ``default``: a numpy scalar as the Python value it holds; TypeError for anything else."""
    import numpy as np  # here, not at the top: the CLI imports this module for its constants

    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _image_classifier_shape(model: Any) -> tuple[int, int, int, int]:
    """(height, width, channels, classes) of a one-image-input, one-vector-output model."""
    inputs, outputs = getattr(model, "inputs", None), getattr(model, "outputs", None)
    if not inputs or not outputs or len(inputs) != 1 or len(outputs) != 1:
        raise ValueError(
            f"model {model.name!r}: export needs a built model with one image input and one output "
            "(define it with keras.Input)"
        )
    shape, out = tuple(inputs[0].shape), tuple(outputs[0].shape)
    if len(shape) != 4 or any(d is None for d in shape[1:]) or len(out) != 2 or out[1] is None:
        raise ValueError(
            f"model {model.name!r}: input shape {shape} / output shape {out}; expected "
            "(batch, height, width, channels) in and (batch, classes) out"
        )
    return int(shape[1]), int(shape[2]), int(shape[3]), int(out[1])


def _preprocessing_fn(preprocessing: str | Callable[[Any], Any]) -> Callable[[Any], Any]:
    if callable(preprocessing):
        return preprocessing
    if preprocessing not in PREPROCESSING:
        raise ValueError(f"preprocessing {preprocessing!r}: expected one of {sorted(PREPROCESSING)} or a function")
    return PREPROCESSING[preprocessing]


def _archive(
    model: Any,
    image_shape: tuple[int, int, int],
    normalise: Callable[[Any], Any],
    class_names: list[str] | None,
) -> Any:
    """A Keras ExportArchive with the image-bytes and the tensor signatures."""
    import keras
    import tensorflow as tf

    height, width, channels = image_shape

    def outputs(images: tf.Tensor) -> dict[str, tf.Tensor]:
        probabilities = model(images, training=False)
        classes = tf.argmax(probabilities, axis=-1, output_type=tf.int64)
        result = {"probabilities": probabilities, "classes": classes}
        if class_names is not None:
            result["class_names"] = tf.gather(tf.constant(class_names), classes)
        return result

    def decode(image_bytes: tf.Tensor) -> tf.Tensor:
        image = tf.io.decode_image(image_bytes, channels=channels, expand_animations=False)
        return tf.image.resize(tf.cast(image, tf.float32), (height, width), method="bilinear")

    def serve_image_bytes(image_bytes: tf.Tensor) -> dict[str, tf.Tensor]:
        with tf.device("/cpu:0"):  # decoders are CPU kernels; keeps GPU servers working
            pixels = tf.map_fn(
                decode, image_bytes, fn_output_signature=tf.TensorSpec((height, width, channels), tf.float32)
            )
        return outputs(tf.cast(normalise(pixels), tf.float32))

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(
        SERVING_SIGNATURE,
        serve_image_bytes,
        input_signature=[tf.TensorSpec([None], tf.string, name=IMAGE_INPUT)],
    )
    archive.add_endpoint(
        TENSOR_SIGNATURE,
        outputs,
        input_signature=[tf.TensorSpec([None, height, width, channels], tf.float32, name=TENSOR_INPUT)],
    )
    return archive
