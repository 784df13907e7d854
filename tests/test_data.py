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


@pytest.mark.parametrize("rank, size, error, message", [
    (0, 0, ValueError, "size=0: must be >= 1"),
    (3, 2, ValueError, "rank=3: must be < size=2"),
    (-1, 2, ValueError, "rank=-1: must be >= 0"),
    (0, "2", TypeError, "size: expected a whole number, got str '2'"),
])
def test_shard_refuses_a_rank_outside_the_shards(
    rank: object, size: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as refused:
        data.shard(tf.data.Dataset.range(10), rank=rank, size=size)
    assert str(refused.value) == message


def test_from_arrays_refuses_labels_that_do_not_match_and_batches_that_cannot_be() -> None:
    x, y = np.zeros((10, 2), np.float32), np.zeros(10, np.int64)
    for arrays, batch_size, error, message in [
        ((x, y[:9]), 2, ValueError, "from_arrays: x has 10 examples and y 9; expected one label per example"),
        (({"a": x, "b": x[:8]}, y), 2, ValueError,
         "from_arrays: x's arrays hold [8, 10] examples; expected the same number in each"),
        ((x, y), 0, ValueError, "batch_size=0: must be >= 1"),
        ((x, y), -1, ValueError, "batch_size=-1: must be >= 1"),
        ((x, y), "2", TypeError, "batch_size: expected a whole number, got str '2'"),
        ((x, y), 11, ValueError, "batch_size=11: larger than the 10 examples of the data; batches are full "
                                 "(drop_remainder), so there would be none"),
    ]:
        with pytest.raises(error) as refused:
            data.from_arrays(*arrays, batch_size, shard_by_rank=False)
        assert str(refused.value) == message
    assert len(list(data.from_arrays(x, y, 10, shard_by_rank=False))) == 1
    # several inputs, as fit takes them: the examples are counted along each array, not the inputs
    assert len(list(data.from_arrays({"a": x, "b": x[:, :1]}, y, 5, shard_by_rank=False))) == 2


def test_from_arrays_refuses_a_batch_larger_than_a_rank_s_shard(monkeypatch: pytest.MonkeyPatch) -> None:
    """It gave 0 batches: a fit that trains on nothing."""
    monkeypatch.setattr(data.runtime, "size", lambda: 4)
    with pytest.raises(ValueError) as refused:
        data.from_arrays(np.zeros((10, 2), np.float32), np.zeros(10, np.int64), 3)
    assert str(refused.value) == ("batch_size=3: larger than the 2 examples of each rank's shard (10 over 4 ranks); "
                                  "batches are full (drop_remainder), so there would be none")


def test_digits_are_real_scaled_and_split_reproducibly() -> None:
    (x_train, y_train), (x_test, y_test) = data.load_digits()
    assert x_train.shape == (1437, 28, 28, 1) and x_test.shape == (360, 28, 28, 1)
    assert x_train.dtype == np.float32 and 0.0 <= x_train.min() and x_train.max() <= 1.0
    assert sorted(set(y_test.tolist())) == list(range(10))
    (x_again, _), _ = data.load_digits()
    assert np.array_equal(x_train, x_again)


@pytest.mark.parametrize("arguments, error, message", [
    ({"image_size": 0}, ValueError, "image_size=0: must be >= 1"),
    ({"image_size": -4}, ValueError, "image_size=-4: must be >= 1"),
    ({"image_size": (28, 28)}, TypeError, "image_size: expected a whole number, got tuple (28, 28)"),
    ({"test_fraction": 0}, ValueError, "test_fraction=0: must be > 0"),
    ({"test_fraction": 1.5}, ValueError, "test_fraction=1.5: must be < 1"),
    ({"test_fraction": "0.2"}, TypeError, "test_fraction: expected a number, got str '0.2'"),
    ({"test_fraction": 0.001}, ValueError, "test_fraction=0.001: holds out 2 of 1797 images; the stratified split "
                                           "needs at least 10 (one per class) on each side"),
])
def test_load_digits_refuses_bad_sizes_and_fractions(arguments: dict, error: type[Exception], message: str) -> None:
    with pytest.raises(error) as refused:
        data.load_digits(**arguments)
    assert str(refused.value) == message


def write_images(root: Path, counts: dict[str, int]) -> None:
    rng = np.random.default_rng(0)
    for cls, n in counts.items():
        (root / cls).mkdir(parents=True)
        for i in range(n):
            pixels = rng.integers(0, 256, (20, 16, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / cls / f"{i}.{'png' if i % 2 else 'jpg'}")


def bilinear_resize(pixels: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Bilinear resize with half-pixel centres and no antialiasing, in NumPy: what ``tf.image.resize`` does by default,
    and so Keras's ``image_dataset_from_directory`` (``interpolation="bilinear"``), which ``image_folder`` calls."""

    def axis(n_out: int, n_in: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        src = np.clip((np.arange(n_out) + 0.5) * n_in / n_out - 0.5, 0, n_in - 1)
        lo = np.floor(src).astype(int)
        return lo, np.minimum(lo + 1, n_in - 1), src - lo

    (y0, y1, wy), (x0, x1, wx) = axis(size[0], pixels.shape[0]), axis(size[1], pixels.shape[1])
    p = pixels.astype(np.float64)
    wx = wx[None, :, None]
    top = p[y0][:, x0] * (1 - wx) + p[y0][:, x1] * wx
    bottom = p[y1][:, x0] * (1 - wx) + p[y1][:, x1] * wx
    return top * (1 - wy)[:, None, None] + bottom * wy[:, None, None]


def test_image_folder_reads_classes_and_scales(tmp_path: Path) -> None:
    write_images(tmp_path, {"cat": 3, "dog": 2})
    ds, classes = data.image_folder(tmp_path, (8, 8), shuffle=False)
    items = list(ds.as_numpy_iterator())
    assert classes == ["cat", "dog"]
    assert [int(y) for _, y in items] == [0, 0, 0, 1, 1]
    assert all(x.shape == (8, 8, 3) and 0.0 <= x.min() and x.max() <= 1.0 for x, _ in items)
    # the pixels, in file order (class, then name), against the files decoded by PIL, resized 20×16 → 8×8 in NumPy.
    # 4/255: PIL's and TensorFlow's JPEG decoders differ by up to 3/255 on these noise images (PNGs agree exactly);
    # another image, swapped channels, nearest-neighbour or antialiased resizing all differ by over 40/255 somewhere.
    files = [tmp_path / "cat" / "0.jpg", tmp_path / "cat" / "1.png", tmp_path / "cat" / "2.jpg",
             tmp_path / "dog" / "0.jpg", tmp_path / "dog" / "1.png"]
    for (x, _), file in zip(items, files, strict=True):
        expected = bilinear_resize(np.asarray(Image.open(file).convert("RGB")), (8, 8)) / 255
        np.testing.assert_allclose(x, expected, rtol=0, atol=4 / 255, err_msg=str(file))


def test_image_folder_errors_name_the_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=f"image folder {tmp_path / 'nope'}: no such directory"):
        data.image_folder(tmp_path / "nope", (8, 8))
    with pytest.raises(ValueError, match="one sub-folder per class"):
        data.image_folder(tmp_path, (8, 8))
    (tmp_path / "empty_class").mkdir()
    with pytest.raises(ValueError, match="no .jpg/.jpeg/.png files"):
        data.image_folder(tmp_path, (8, 8))


@pytest.mark.parametrize("image_size, error, message", [
    ((0, 0), ValueError, "image_size[0]=0: must be >= 1"),
    ((8, -1), ValueError, "image_size[1]=-1: must be >= 1"),
    ((8, 8.0), TypeError, "image_size[1]: expected a whole number, got float 8.0"),
    (8, ValueError, "image_size=8: expected (height, width)"),
    ((8, 8, 3), ValueError, "image_size=(8, 8, 3): expected (height, width)"),
])
def test_image_folder_refuses_an_image_size_at_the_call(
    tmp_path: Path, image_size: object, error: type[Exception], message: str
) -> None:
    """It failed only when the dataset was iterated, in TensorFlow's resize."""
    write_images(tmp_path, {"cat": 1})
    with pytest.raises(error) as refused:
        data.image_folder(tmp_path, image_size)
    assert str(refused.value) == message


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
    pixels = np.round(x[:8] * 255).astype(np.uint8)
    examples = tf.data.Dataset.from_tensor_slices({"image": pixels, "label": y[:8]})
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
    # tfds shuffles the examples when it writes them: find each image among the eight stored (PNG is lossless, so the
    # loader's image is the stored bytes / 255) and check that its label is that digit's
    assert len({p.tobytes() for p in pixels}) == 8  # each image matches one digit only
    matched = []
    for img, label in items:
        errors = np.abs(img - pixels / 255.0).reshape(8, -1).max(axis=1)
        i = int(np.argmin(errors))
        assert errors[i] < 1e-6, f"image matches none of the stored digits (nearest off by {errors[i]})"
        assert int(label) == y[i], f"image of digit #{i} ({y[i]}) came back labelled {int(label)}"
        matched.append(i)
    assert sorted(matched) == list(range(8))
