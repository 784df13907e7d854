"""The ingest step: the held-out images every candidate is judged on, as one ``.npz`` (x, y).

Read from the pipeline's data source (the bundled digits, an image folder, or a
TFDS dataset prepared on the shared volume), brought to the models' input
(``image_size`` square, grayscale or RGB, pixels in [0, 1]) and written
atomically, so ``hvdk8s select --data`` sees the same arrays on every run.
"""
from __future__ import annotations

import os

import numpy as np

from hvdk8s.common.atomic import atomic_path

DIGITS_SPLITS = ("train", "test")


def heldout(source: str, split: str, image_size: int, color_mode: str, path: str | None = None,
            name: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(images, integer labels) of the data source, in the models' input format.

    Errors name ``hvdk8s pipeline ingest``'s flags: this step is run as that command, locally and in the Workflow.
    """
    import tensorflow as tf

    from hvdk8s import data

    if source == "digits":
        if split not in DIGITS_SPLITS:
            raise ValueError(f"--split {split!r}: the digits have {' and '.join(DIGITS_SPLITS)}")
        train, test = data.load_digits(image_size=image_size)
        x, y = test if split == "test" else train
    elif source == "imageFolder":
        ds, _ = data.image_folder(_given(source, "--path", path), (image_size, image_size), color_mode=color_mode,
                                  shuffle=False)
        x, y = _arrays(ds)
    elif source == "tfds":
        ds = data.tfds_dataset(_given(source, "--name", name), split, _given(source, "--path", path))
        ds = ds.map(lambda image, label: (tf.image.resize(image, (image_size, image_size)), label))
        x, y = _arrays(ds)
    else:
        raise ValueError(f"--source {source!r}: expected digits, imageFolder or tfds")
    x = np.asarray(x, dtype="float32")
    channels = 1 if color_mode == "grayscale" else 3
    if x.shape[-1] == 3 and channels == 1:
        x = np.asarray(tf.image.rgb_to_grayscale(x))
    elif x.shape[-1] == 1 and channels == 3:
        x = np.repeat(x, 3, axis=-1)
    return np.clip(x, 0.0, 1.0), np.asarray(y, dtype="int64")


def _given(source: str, flag: str, value: str | None) -> str:
    """A flag the source needs (the Workflow always passes it: the pipeline file's checks require data.path/name)."""
    if not value:
        raise ValueError(f"--source {source} needs {flag}")
    return value


def _arrays(ds) -> tuple[np.ndarray, np.ndarray]:
    pairs = list(ds.as_numpy_iterator())
    if not pairs:
        raise ValueError("the data source has no images")
    return np.stack([x for x, _ in pairs]), np.array([y for _, y in pairs])


def write_npz(path: str | os.PathLike[str], x: np.ndarray, y: np.ndarray) -> None:
    """Write ``x`` and ``y`` to ``path`` in one step (a reader never sees half a file)."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.savez(f, x=x, y=y)
