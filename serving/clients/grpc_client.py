"""gRPC client for image classifiers behind TensorFlow Serving (or ``hvdk8s serve``), port 8500.

Uses the official generated stubs (``tensorflow-serving-api``): each image's
file bytes go as one element of a ``DT_STRING`` tensor, exactly what the
REST API's ``{"b64": ...}`` becomes inside TF Serving. Importing the stubs
imports TensorFlow (they are built on its protos), so this module is only
loaded for ``--grpc``.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hvdk8s.serving.clients.rest_client import PredictError, as_predictions, raise_if_nothing_answers
from hvdk8s.serving.model.savedmodel import IMAGE_INPUT


def target(url: str) -> str:
    """``host:port`` from ``host:port`` or a ``grpc://`` / ``http://`` URL."""
    for scheme in ("grpc://", "http://"):
        if url.startswith(scheme):
            url = url[len(scheme):]
    url = url.rstrip("/")
    if not url or "/" in url or ":" not in url:
        raise ValueError(f"gRPC address {url!r}: expected host:port, e.g. 127.0.0.1:8500")
    return url


def predict_request(
    images: Sequence[bytes],
    model: str,
    version: int | None = None,
    signature: str | None = None,
    input_name: str = IMAGE_INPUT,
) -> Any:
    """A ``PredictRequest`` with the images as a 1-D ``DT_STRING`` tensor named ``input_name``."""
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    if version is not None:
        request.model_spec.version.value = version
    if signature:
        request.model_spec.signature_name = signature
    request.inputs[input_name].CopyFrom(tf.make_tensor_proto(list(images), dtype=tf.string, shape=[len(images)]))
    return request


def predict(
    url: str,
    images: Sequence[bytes],
    model: str = "digits",
    version: int | None = None,
    signature: str | None = None,
    timeout: float = 60.0,
) -> list[dict[str, Any]]:
    """One prediction per image, the same dicts as ``rest_client.predict`` returns."""
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    from hvdk8s.serving.api import rest, types

    address = target(url)
    with grpc.insecure_channel(address) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        try:
            response = stub.Predict(predict_request(images, model, version, signature), timeout=timeout)
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.UNAVAILABLE:
                raise_if_nothing_answers(address)
            raise PredictError(f"{address}: {err.code().name}: {err.details()}") from None
    outputs = {name: tf.make_ndarray(tensor) for name, tensor in response.outputs.items()}
    try:
        doc = rest.predict_response(outputs, row=True)
    except types.ServingError as err:
        raise PredictError(f"{address}: {err.message}") from None
    return as_predictions(address, doc, len(images))
