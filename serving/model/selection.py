"""Model selection: evaluate candidate ``.keras`` files on one held-out set, promote the best.

Every candidate sees exactly the same images and labels (the digits test
split unless given), so the comparison is fair; the winner becomes the next
serving version through ``export`` and the whole table is stored in that
version's export record, so the served folder says why it was chosen.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hvdk8s.common.argcheck import whole
from hvdk8s.serving.model import savedmodel

METRICS = ("accuracy", "loss")
"""Accuracy: higher is better; loss (cross-entropy): lower is better."""


@dataclass(frozen=True)
class Candidate:
    name: str
    path: str
    accuracy: float
    loss: float


@dataclass(frozen=True)
class Selection:
    metric: str
    candidates: list[Candidate]  # best first
    version_dir: Path
    data: str

    @property
    def best(self) -> Candidate:
        return self.candidates[0]


def candidate_files(folder: str | os.PathLike[str]) -> list[Path]:
    """The ``.keras`` files directly in ``folder``, by name."""
    root = Path(folder)
    if not root.is_dir():
        raise FileNotFoundError(f"candidates folder {root}: no such directory")
    files = sorted(p for p in root.iterdir() if p.suffix == ".keras" and p.is_file())
    if not files:
        raise FileNotFoundError(f"candidates folder {root}: no .keras files")
    return files


def evaluate(model: Any, x: np.ndarray, y: np.ndarray, batch_size: int = 256) -> dict[str, float]:
    """Accuracy and mean cross-entropy of a softmax classifier on (x, y).

    Args:
        model: A Keras classifier with probabilities as output.
        x: Inputs, at least one, shaped as the model's input (``None`` sizes match any; as in Keras, a missing
            last axis of size 1 is added and a surplus one dropped).
        y: Class numbers, one per input: integers, or floats with whole values; a vector, or a column (N, 1).
        batch_size: Examples per call of the model, at least 1.

    Returns:
        ``{"accuracy": ..., "loss": ...}``.

    Raises:
        TypeError: ``batch_size`` is not a whole number.
        ValueError: ``batch_size`` is below 1; ``x`` is empty, not numbers, or not shaped as the model's input;
            ``y`` is not one whole class number per input, or one is outside the model's classes; the
            predictions are not one row of probabilities per label.
    """
    batch_size = whole("batch_size", batch_size)
    x, y = np.asarray(x), np.asarray(y)
    if y.ndim == 2 and y.shape[1] == 1:  # a column of class numbers, as Keras's own datasets give CIFAR's
        y = y[:, 0]
    _check_labels(y)  # all before the model runs
    _check_count(x, y)
    _check_images(model, x)
    # eager calls, not model.predict: no per-candidate tf.function (re)tracing
    batches = [np.asarray(model(x[i : i + batch_size], training=False)) for i in range(0, len(x), batch_size)]
    probabilities = np.concatenate(batches).astype("float64")
    if probabilities.ndim != 2 or probabilities.shape[0] != len(y):
        raise ValueError(f"model {model.name!r}: predictions of shape {probabilities.shape} for {len(y)} labels")
    classes = probabilities.shape[1]
    outside = y[(y < 0) | (y >= classes)]
    if outside.size:
        raise ValueError(f"label {int(outside[0])} is outside the model's {classes} classes (0 to {classes - 1})")
    y = y.astype("int64")
    picked = np.clip(probabilities[np.arange(len(y)), y], 1e-7, 1.0)
    return {
        "accuracy": float(np.mean(probabilities.argmax(axis=1) == y)),
        "loss": float(-np.mean(np.log(picked))),
    }


def _check_labels(y: np.ndarray) -> None:
    """Raise ValueError unless ``y`` is one whole number per example (integers, booleans or whole floats)."""
    if y.ndim != 1:
        raise ValueError(f"labels of shape {y.shape}: expected one class number per image (not one-hot rows)")
    if y.dtype.kind == "f":
        fractional = y[~np.isfinite(y) | (np.floor(y) != y)]
        if fractional.size:
            raise ValueError(f"label {fractional[0]} is not a class number (a whole number)")
    elif y.dtype.kind not in "biu":
        raise ValueError(f"labels of type {y.dtype}: expected integer class numbers")


def _check_count(x: np.ndarray, y: np.ndarray) -> None:
    """Raise ValueError unless ``x`` and ``y`` hold the same number of examples, at least one."""
    if x.ndim == 0 or y.ndim == 0 or len(x) != len(y) or len(x) == 0:
        raise ValueError(f"images of shape {x.shape} and labels of shape {y.shape}: need one label per image, "
                         "at least one")


def _check_images(model: Any, x: np.ndarray) -> None:
    """Raise ValueError unless ``x`` holds numbers shaped as the model's input, as Keras would take them."""
    if x.dtype.kind not in "biuf":
        raise ValueError(f"images of type {x.dtype}: expected numbers")
    expected = getattr(model, "input_shape", None)  # none for a subclassed model (it checks its own); a list: many
    if not isinstance(expected, tuple):
        return
    want, got = expected[1:], x.shape[1:]
    if len(got) == len(want) - 1 and want[-1] == 1:  # Keras adds the missing channel axis...
        got += (1,)
    elif len(got) == len(want) + 1 and got[-1] == 1:  # ...and drops a surplus one (Functional._adjust_input_rank)
        got = got[:-1]
    if len(got) != len(want) or any(w is not None and w != g for w, g in zip(want, got)):
        raise ValueError(f"images of shape {x.shape} do not fit model {model.name!r}, whose input shape is "
                         f"{expected}")


def rank(candidates: Sequence[Candidate], metric: str = "accuracy") -> list[Candidate]:
    """Best first by ``metric``, then by the other metric, then by name (deterministic ties)."""
    if metric not in METRICS:
        raise ValueError(f"metric {metric!r}: expected one of {METRICS}")
    if metric == "accuracy":
        return sorted(candidates, key=lambda c: (-c.accuracy, c.loss, c.name))
    return sorted(candidates, key=lambda c: (c.loss, -c.accuracy, c.name))


def select(
    candidates_dir: str | os.PathLike[str],
    base_path: str | os.PathLike[str],
    metric: str = "accuracy",
    data: tuple[np.ndarray, np.ndarray] | None = None,
    class_names: Sequence[str] | None = None,
    preprocessing: str = "unit",
    data_name: str = "given arrays",
) -> Selection:
    """Evaluate every candidate in ``candidates_dir`` and export the best as the next version.

    Ties are broken by the other metric, then by file name. The version's
    record (``read_metadata``) keeps the winner's metrics and every
    candidate's scores.

    Args:
        candidates_dir: Folder of candidate ``.keras`` files.
        base_path: The served model's base path; the winner becomes its next version.
        metric: ``"accuracy"`` (higher is better) or ``"loss"`` (cross-entropy, lower is better).
        data: The held-out pair ``(images, integer labels)``, in the models' input format (see ``evaluate``);
            None for the digits test split (``hvdk8s.data.load_digits``).
        class_names: A name per class, passed to ``export``.
        preprocessing: Passed to ``export``.
        data_name: What ``data`` is, e.g. its file, for the table, the record and error messages.

    Returns:
        The selection: ``metric``, ``candidates`` (best first, each with ``name``, ``path``, ``accuracy``
        and ``loss``), ``best``, ``version_dir`` (the exported version) and ``data`` (what it was
        evaluated on).

    Raises:
        ValueError: Unknown ``metric``; ``data`` that is not a pair, or holds no images or not one label per
            image; a candidate that cannot be loaded, or evaluated on ``data`` (e.g. images not shaped as its
            input, a label outside its classes: the message names the data and the candidate); or one that
            ``export`` refuses.
        TypeError: ``class_names`` that ``export`` refuses (a string, a name that is not one).
        FileNotFoundError: ``candidates_dir`` is missing or holds no ``.keras`` file.

    Example:
        ```python
        from hvdk8s import serving

        selection = serving.select("candidates/", "models/digits", metric="accuracy")
        print(selection.best.name, selection.version_dir)
        ```
    """
    if metric not in METRICS:
        raise ValueError(f"metric {metric!r}: expected one of {METRICS}")
    files = candidate_files(candidates_dir)
    if data is None:
        from hvdk8s.data import load_digits

        data, data_name = load_digits()[1], "digits test split"
    elif not isinstance(data, (tuple, list)) or len(data) != 2:
        raise ValueError(f"data: must be a pair (x, y) of images and labels, got {type(data).__name__}"
                         + (f" of length {len(data)}" if isinstance(data, (tuple, list)) else ""))
    x, y = np.asarray(data[0]), np.asarray(data[1])
    try:
        _check_count(x, y)  # before loading any candidate
    except ValueError as err:
        raise ValueError(f"{data_name}: {err}") from None
    source = f"{data_name} ({len(y)} images)"

    scored = []
    models = {}
    for path in files:
        model = savedmodel.load_keras_model(path)
        try:
            scores = evaluate(model, x, y)
        except ValueError as err:
            raise ValueError(f"{source}, candidate {path.name}: {err}") from None
        scored.append(Candidate(path.name, os.fspath(path), **scores))
        models[path.name] = model
    ranked = rank(scored, metric)
    best = ranked[0]
    version_dir = savedmodel.export(
        models[best.name],
        base_path,
        class_names=class_names,
        preprocessing=preprocessing,
        metadata={
            "metrics": {"accuracy": best.accuracy, "loss": best.loss},
            "selection": {
                "metric": metric,
                "data": source,
                "source": best.path,
                "candidates": [asdict(c) for c in ranked],
            },
        },
    )
    return Selection(metric, ranked, version_dir, source)


def format_table(selection: Selection) -> str:
    """The candidates as an aligned text table, the promoted one marked."""
    width = max(len("candidate"), *(len(c.name) for c in selection.candidates))
    lines = [f"{'candidate':<{width}}  accuracy    loss"]
    for c in selection.candidates:
        mark = f"  <- promoted to {selection.version_dir}" if c is selection.best else ""
        lines.append(f"{c.name:<{width}}  {c.accuracy:8.4f}  {c.loss:6.4f}{mark}")
    lines.append(f"evaluated on {selection.data}, ranked by {selection.metric}")
    return "\n".join(lines)
