"""Input pipelines: per-rank sharding and loaders for real data on local disk.

Nothing here downloads: the default dataset ships inside scikit-learn, and
the loaders for user data read a folder or a prepared TFDS ``data_dir``,
failing with a message that names the missing path.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import tensorflow as tf

from hvdk8s import runtime
from hvdk8s.common.argcheck import real, sizes, whole

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")
Arrays = tuple[np.ndarray, np.ndarray]


def shard(
    dataset: tf.data.Dataset,
    *,
    rank: int | None = None,
    size: int | None = None,
    even: bool = True,
) -> tf.data.Dataset:
    """Give each rank every ``size``-th element, starting at its rank.

    With ``even`` (and a dataset of known length) the tail that cannot be
    split evenly is dropped first, so all ranks run the same number of steps
    and none waits forever in an allreduce the others never join.

    Args:
        dataset: The dataset to shard, before batching.
        rank: This rank's index; None takes ``hvdk8s.rank()``.
        size: Number of shards; None takes ``hvdk8s.size()``.
        even: Drop the tail that cannot be split evenly (datasets of unknown length are left whole).

    Returns:
        This rank's shard.

    Raises:
        TypeError: ``rank`` or ``size`` is not a whole number.
        ValueError: ``size`` is below 1, or ``rank`` is not in ``0 .. size - 1``.
    """
    size = whole("size", runtime.size() if size is None else size)
    rank = whole("rank", runtime.rank() if rank is None else rank, 0)
    if rank >= size:
        raise ValueError(f"rank={rank}: must be < size={size}")
    if even:
        n = int(dataset.cardinality())
        if n >= 0:
            dataset = dataset.take(n - n % size)
    return dataset.shard(size, rank)


def from_arrays(
    x: np.ndarray,
    y: np.ndarray,
    batch_size: int,
    *,
    shuffle: bool = True,
    seed: int = 0,
    shard_by_rank: bool = True,
) -> tf.data.Dataset:
    """Sharded, shuffled, batched pipeline over in-memory arrays.

    Batches are full (drop_remainder) so every rank steps in lockstep.

    Args:
        x: Inputs, first dimension the examples.
        y: Labels, one per example.
        batch_size: Examples per batch on each rank; the global batch is ``batch_size × size``.
        shuffle: Reshuffle every epoch (after sharding, within the rank's shard).
        seed: The shuffle's seed.
        shard_by_rank: Give each rank its own shard (``shard``); False for every rank to see all examples.

    Returns:
        A prefetched dataset of ``(x, y)`` batches.

    Raises:
        ValueError: The arrays of ``x`` and ``y`` differ in length, or ``batch_size`` is below 1 or above the examples of a
            rank's shard (there would be no batch).
        TypeError: ``batch_size`` is not a whole number.

    Example:
        ```python
        (x_train, y_train), (x_test, y_test) = hvd.data.load_digits()
        train = hvd.data.from_arrays(x_train, y_train, batch_size=32)
        model.fit(train, epochs=10, callbacks=hvd.default_callbacks())
        ```
    """
    lengths = {name: sorted({len(a) for a in tf.nest.flatten(arrays)}) for name, arrays in (("x", x), ("y", y))}
    for name, found in lengths.items():  # x (or y) may be a dict or tuple of arrays, one per input
        if len(found) > 1:
            raise ValueError(f"from_arrays: {name}'s arrays hold {found} examples; expected the same number in each")
    n, labels = lengths["x"][0], lengths["y"][0]
    if n != labels:
        raise ValueError(f"from_arrays: x has {n} examples and y {labels}; expected one label per example")
    batch_size = whole("batch_size", batch_size)
    ranks = runtime.size() if shard_by_rank else 1
    if batch_size > n // ranks:
        where = f"each rank's shard ({n} over {ranks} ranks)" if shard_by_rank else "the data"
        raise ValueError(f"batch_size={batch_size}: larger than the {n // ranks} examples of {where}; "
                         "batches are full (drop_remainder), so there would be none")
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    if shard_by_rank:
        ds = shard(ds)
    if shuffle:
        ds = ds.shuffle(n, seed=seed, reshuffle_each_iteration=True)
    return ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def load_digits(image_size: int = 28, test_fraction: float = 0.2, seed: int = 0) -> tuple[Arrays, Arrays]:
    """scikit-learn's bundled 8×8 handwritten digits (1,797 images, real data).

    Pixels are scaled to [0, 1] and resized to ``image_size`` square with one
    channel, the input a small MNIST-style CNN expects. The train/test split
    is stratified and fixed by ``seed``, so every rank and every run agree.

    Args:
        image_size: Side of the square images returned (8 keeps the originals).
        test_fraction: Share of the images held out for testing.
        seed: Fixes the split.

    Returns:
        ``((x_train, y_train), (x_test, y_test))``: float32 images of shape ``(n, image_size, image_size, 1)``
        and int64 labels 0-9.

    Raises:
        TypeError: ``image_size`` is not a whole number, or ``test_fraction`` not a number.
        ValueError: ``image_size`` is below 1; ``test_fraction`` is not between 0 and 1, or leaves either
            side of the stratified split fewer images than there are classes.
    """
    from sklearn.datasets import load_digits as sk_digits
    from sklearn.model_selection import train_test_split

    image_size = whole("image_size", image_size)
    if real("test_fraction", test_fraction, above=0) >= 1:
        raise ValueError(f"test_fraction={test_fraction}: must be < 1")
    bunch = sk_digits()
    held_out, classes = math.ceil(test_fraction * len(bunch.target)), len(bunch.target_names)
    if not classes <= held_out <= len(bunch.target) - classes:
        raise ValueError(f"test_fraction={test_fraction}: holds out {held_out} of {len(bunch.target)} images; the "
                         f"stratified split needs at least {classes} (one per class) on each side")
    images = (bunch.images.astype("float32") / 16.0)[..., None]
    if image_size != 8:
        images = tf.image.resize(images, (image_size, image_size), method="bilinear").numpy()
    images = np.clip(images, 0.0, 1.0).astype("float32")
    labels = bunch.target.astype("int64")
    x_train, x_test, y_train, y_test = train_test_split(
        images, labels, test_size=test_fraction, random_state=seed, stratify=labels
    )
    return (x_train, y_train), (x_test, y_test)


def image_folder(
    path: str | os.PathLike[str],
    image_size: tuple[int, int],
    *,
    color_mode: str = "rgb",
    shuffle: bool = True,
    seed: int = 0,
) -> tuple[tf.data.Dataset, list[str]]:
    """Unbatched (image in [0, 1], label) pairs from ``path/<class>/<image>``.

    One sub-folder per class, JPEG or PNG files inside. Shard and batch it like any dataset.

    Args:
        path: The folder holding one sub-folder per class.
        image_size: ``(height, width)`` the images are resized to.
        color_mode: ``"rgb"``, ``"rgba"`` or ``"grayscale"`` (Keras's ``image_dataset_from_directory``).
        shuffle: Shuffle the files.
        seed: The shuffle's seed.

    Returns:
        The dataset and the class names in label order (sorted sub-folder names).

    Raises:
        FileNotFoundError: ``path`` is not a directory.
        ValueError: It has no sub-folders, or no JPEG or PNG files in them; ``image_size`` is no ``(height,
            width)`` pair, or a side is below 1.
        TypeError: A side of ``image_size`` is not a whole number.
    """
    import keras

    height, width = sizes("image_size", image_size, (1, 1), "(height, width)")
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"image folder {root}: no such directory")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    if not classes:
        raise ValueError(f"image folder {root}: expected one sub-folder per class, found none")
    if not any(f.suffix.lower() in IMAGE_EXTENSIONS for c in classes for f in (root / c).iterdir()):
        raise ValueError(f"image folder {root}: no {'/'.join(IMAGE_EXTENSIONS)} files in {classes}")
    ds = keras.utils.image_dataset_from_directory(
        root,
        labels="inferred",
        class_names=classes,
        color_mode=color_mode,
        image_size=(height, width),
        batch_size=None,
        shuffle=shuffle,
        seed=seed,
        verbose=runtime.is_chief() if runtime.is_initialized() else True,
    )
    return ds.map(lambda x, y: (x / 255.0, y), num_parallel_calls=tf.data.AUTOTUNE), classes


def tfds_dataset(name: str, split: str, data_dir: str | os.PathLike[str]) -> tf.data.Dataset:
    """A TFDS dataset already prepared under ``data_dir`` (never downloaded).

    Prepare the data once where the internet is reachable
    (``tfds build NAME --data_dir DIR``) and ship the folder with the job.

    Args:
        name: The TFDS dataset name, e.g. ``"mnist"``.
        split: The split, e.g. ``"train"`` or ``"test[:10%]"``.
        data_dir: The folder the dataset was prepared under.

    Returns:
        Unbatched ``(image in [0, 1], label)`` pairs.

    Raises:
        ValueError: The dataset is unknown to tensorflow-datasets, or has no ``image`` and ``label``
            features.
        FileNotFoundError: It is not prepared under ``data_dir``.
    """
    import tensorflow_datasets as tfds

    try:
        builder = tfds.builder(name, data_dir=os.fspath(data_dir), try_gcs=False)
    except tfds.core.registered.DatasetNotFoundError as err:
        raise ValueError(f"tfds dataset {name!r}: unknown to tensorflow-datasets ({err})") from None
    if not builder.is_prepared():
        raise FileNotFoundError(
            f"tfds dataset {name!r}: not prepared under data_dir {data_dir} "
            f"(expected {builder.data_dir}); run `tfds build {name} --data_dir {data_dir}` "
            "on a machine with internet access and copy the folder here"
        )
    features = set(builder.info.features.keys())
    if not {"image", "label"} <= features:
        raise ValueError(f"tfds dataset {name!r}: needs 'image' and 'label' features, has {sorted(features)}")
    ds = builder.as_dataset(split=split, shuffle_files=False)
    return ds.map(
        lambda ex: (tf.cast(ex["image"], tf.float32) / 255.0, ex["label"]), num_parallel_calls=tf.data.AUTOTUNE
    )
