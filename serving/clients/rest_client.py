"""REST client for image classifiers behind TensorFlow Serving (or ``hvdk8s serve``).

Sends each image's file bytes as ``{"b64": ...}`` to ``:predict``: the model's
``serving_default`` signature decodes, resizes and normalises on the server,
so the client needs no TensorFlow and no knowledge of the model's input.
"""
from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

import requests

from hvdk8s.serving.api import address


class PredictError(Exception):
    """The server refused or failed the request, or could not be reached; the message says which.

    For an answer other than HTTP 200 it carries the server's ``error`` text.
    """


class NothingAnswers(PredictError):
    """No server accepts connections at the address given; the message says whether ``hvdk8s serve`` runs."""


def raise_if_nothing_answers(url: str) -> None:
    """``NothingAnswers`` when no connection to ``url`` (a REST URL or a gRPC host:port) opens."""
    if message := address.nothing_answers(url):
        raise NothingAnswers(message)


def predict_url(url: str, model: str, version: int | None = None) -> str:
    """``{url}/v1/models/{model}[/versions/{version}]:predict``."""
    path = f"/v1/models/{model}" + (f"/versions/{version}" if version is not None else "")
    return url.rstrip("/") + path + ":predict"


def request_body(images: Sequence[bytes], signature: str | None = None) -> dict[str, Any]:
    """Row-format body: one ``{"b64": ...}`` instance per image."""
    body: dict[str, Any] = {"instances": [{"b64": base64.b64encode(image).decode()} for image in images]}
    if signature:
        body["signature_name"] = signature
    return body


def predict(
    url: str,
    images: Sequence[bytes],
    model: str = "digits",
    version: int | None = None,
    signature: str | None = None,
    timeout: float = 60.0,
) -> list[dict[str, Any]]:
    """One prediction per image: ``{"probabilities": [...], "classes": k, ...}``.

    A model with a single output answers with bare values; they come back
    as ``{"probabilities": value}`` so callers see one shape. The images go as
    their file bytes: the server decodes, resizes and normalises them, so no
    TensorFlow is needed here.

    Args:
        url: The server's REST address, e.g. ``http://127.0.0.1:8501``.
        images: Encoded JPEG or PNG files.
        model: The model's name.
        version: A version number; None for the one the server chooses (the newest it serves).
        signature: A signature name; None for ``serving_default``.
        timeout: Seconds to wait for the answer.

    Returns:
        One dict per image, in order: ``probabilities`` and, from models exported by hvdk8s, ``classes``
        (and ``class_names`` when the export had them).

    Raises:
        PredictError: No server answers, the request failed, or the answer is not one prediction per image.

    Example:
        ```python
        from pathlib import Path

        from hvdk8s import serving

        for p in serving.predict("http://127.0.0.1:8501", [Path("seven.png").read_bytes()], model="digits"):
            print(p["classes"], max(p["probabilities"]))
        ```
    """
    target = predict_url(url, model, version)
    try:
        response = requests.post(target, json=request_body(images, signature), timeout=timeout)
    except requests.ConnectionError as err:
        raise_if_nothing_answers(url)
        raise PredictError(f"{target}: {err}") from None
    except requests.RequestException as err:
        raise PredictError(f"{target}: {err}") from None
    try:
        doc = response.json()
    except ValueError:
        doc = {}
    if response.status_code != 200:
        message = doc.get("error") if isinstance(doc, dict) else None
        raise PredictError(f"{target}: HTTP {response.status_code}: {message or response.text[:500]}")
    return as_predictions(target, doc, len(images))


def as_predictions(target: str, doc: Any, count: int) -> list[dict[str, Any]]:
    """The ``predictions`` of a row-format response, ``count`` of them, each a dict."""
    predictions = doc.get("predictions") if isinstance(doc, dict) else None
    if not isinstance(predictions, list) or len(predictions) != count:
        raise PredictError(f"{target}: expected {count} predictions, got {str(doc)[:500]}")
    return [p if isinstance(p, dict) else {"probabilities": p} for p in predictions]


def describe(prediction: dict[str, Any]) -> str:
    """``class 3 "three" p=0.981 [0.000 0.001 ...]`` for one prediction."""
    probabilities = prediction.get("probabilities")
    cls = prediction.get("classes")
    if cls is None and isinstance(probabilities, list) and probabilities:
        cls = max(range(len(probabilities)), key=probabilities.__getitem__)
    parts = [f"class {cls}"]
    if "class_names" in prediction:
        parts.append(f'"{prediction["class_names"]}"')
    if isinstance(probabilities, list) and isinstance(cls, int) and 0 <= cls < len(probabilities):
        parts.append(f"p={probabilities[cls]:.3f}")
        parts.append("[" + " ".join(f"{p:.3f}" for p in probabilities) + "]")
    return " ".join(parts)
