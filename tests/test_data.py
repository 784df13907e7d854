"""Input pipelines: sharding arithmetic and the real-data loaders (no network)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from hvdk8s import data

pytestmark = pytest.mark.unit


def elements(ds: tf.data.Dataset) -> list[int]:
    return [int(x) for x in ds.as_numpy_iterator()]


def test_shard_even_drops_the_uneven_tail_so_ranks_step_together() -> None:
    ds = tf.data.Dataset.range(10)
    shards = [elements(data.shard(ds, rank=r, size=3)) for r in range(3)]
    assert shards == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]
    uneven = [elements(data.shard(ds, rank=r, size=3, even=False)) for r in range(3)]
    assert uneven == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]


def test_shards_partition_the_data() -> None:
    ds = tf.data.Dataset.range(12)
    together = sorted(x for r in range(4) for x in elements(data.shard(ds, rank=r, size=4)))
    assert together == list(range(12))


def test_digits_are_real_scaled_and_split_reproducibly() -> None:
    (x_train, y_train), (x_test, y_test) = data.load_digits()
    assert x_train.shape == (1437, 28, 28, 1) and x_test.shape == (360, 28, 28, 1)
    assert x_train.dtype == np.float32 and 0.0 <= x_train.min() and x_train.max() <= 1.0
    assert sorted(set(y_test.tolist())) == list(range(10))
    (x_again, _), _ = data.load_digits()
    assert np.array_equal(x_train, x_again)


def write_images(root: Path, counts: dict[str, int]) -> None:
    rng = np.random.default_rng(0)
    for cls, n in counts.items():
        (root / cls).mkdir(parents=True)
        for i in range(n):
            pixels = rng.integers(0, 256, (20, 16, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / cls / f"{i}.{'png' if i % 2 else 'jpg'}")


def test_image_folder_reads_classes_and_scales(tmp_path: Path) -> None:
    write_images(tmp_path, {"cat": 3, "dog": 2})
    ds, classes = data.image_folder(tmp_path, (8, 8), shuffle=False)
    items = list(ds.as_numpy_iterator())
    assert classes == ["cat", "dog"]
    assert [int(y) for _, y in items] == [0, 0, 0, 1, 1]
    assert all(x.shape == (8, 8, 3) and 0.0 <= x.min() and x.max() <= 1.0 for x, _ in items)


def test_image_folder_errors_name_the_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=f"image folder {tmp_path / 'nope'}: no such directory"):
        data.image_folder(tmp_path / "nope", (8, 8))
    with pytest.raises(ValueError, match="one sub-folder per class"):
        data.image_folder(tmp_path, (8, 8))
    (tmp_path / "empty_class").mkdir()
    with pytest.raises(ValueError, match="no .jpg/.jpeg/.png files"):
        data.image_folder(tmp_path, (8, 8))


def test_tfds_without_prepared_data_says_how_to_prepare_and_downloads_nothing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"tfds dataset 'mnist': not prepared under data_dir .*tfds build mnist"):
        data.tfds_dataset("mnist", "train", tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_tfds_unknown_dataset_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="tfds dataset 'no_such_dataset_xyz': unknown"):
        data.tfds_dataset("no_such_dataset_xyz", "train", tmp_path)


def test_tfds_reads_a_dataset_prepared_under_data_dir(tmp_path: Path) -> None:
    import tensorflow_datasets as tfds

    (x, y), _ = data.load_digits(image_size=8)
    examples = tf.data.Dataset.from_tensor_slices({"image": np.round(x[:8] * 255).astype(np.uint8), "label": y[:8]})
    tfds.dataset_builders.store_as_tfds_dataset(  # eight real digits, prepared as `tfds build` would
        name="hvdk_tiny_digits",
        version="1.0.0",
        features=tfds.features.FeaturesDict(
            {"image": tfds.features.Image(shape=(8, 8, 1)), "label": tfds.features.ClassLabel(num_classes=10)}
        ),
        split_datasets={"train": examples},
        data_dir=tmp_path,
    )
    items = list(data.tfds_dataset("hvdk_tiny_digits", "train", tmp_path).as_numpy_iterator())
    assert len(items) == 8
    assert all(img.shape == (8, 8, 1) and 0.0 <= img.min() and img.max() <= 1.0 for img, _ in items)
    assert sorted(int(label) for _, label in items) == sorted(y[:8].tolist())
