"""TensorFlow Serving's gRPC API (port 8500) on the official generated stubs.

``PredictionService.Predict`` and ``GetModelMetadata`` and
``ModelService.GetModelStatus``, implemented with the servicer base classes
of ``tensorflow-serving-api``, so the official ``PredictionServiceStub``
client works unchanged. Requests go through the same ``ServingCore`` as
REST (same versions, same batching, same error codes and messages); other
methods of the services answer UNIMPLEMENTED, as the base classes do.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import numpy as np
import tensorflow as tf
from google.protobuf import any_pb2, json_format
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from hvdk8s.serving import rest
from hvdk8s.serving.core import ServingCore

SIGNATURE_DEF = "signature_def"  # the one metadata field TF Serving knows


def create_server(core: ServingCore, host: str, port: int, threads: int = 64) -> tuple[grpc.Server, int]:
    """A bound, not yet started server and its port (``port`` 0: any free port)."""
    server = grpc.server(ThreadPoolExecutor(max_workers=threads, thread_name_prefix="grpc"))
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(_PredictionService(core), server)
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(_ModelService(core), server)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as err:
        raise ValueError(f"cannot listen on {address} for gRPC: {err}") from None
    if not bound:
        raise ValueError(f"cannot listen on {address} for gRPC")
    return server, bound


def inputs_from_protos(tensors: Any, specs: dict[str, rest.InputSpec]) -> dict[str, np.ndarray]:
    """Request tensors as arrays, checked against the signature's inputs as TF Serving checks them."""
    if set(tensors) != set(specs):
        sent, want = sorted(tensors), sorted(specs)
        raise rest.invalid(
            f"input size does not match signature: {len(sent)}!={len(want)} len({{{','.join(sent)}}}) != "
            f"len({{{','.join(want)}}}). Sent extra: {{{','.join(sorted(set(sent) - set(want)))}}}. "
            f"Missing but required: {{{','.join(sorted(set(want) - set(sent)))}}}."
        )
    arrays = {}
    for i, (name, spec) in enumerate(sorted(specs.items())):
        try:
            array = tf.make_ndarray(tensors[name])
        except (TypeError, ValueError) as err:
            raise rest.invalid(f"input {name}: {err}") from None
        if array.dtype != spec.dtype and not (spec.dtype.kind == "O" and array.dtype.kind in "OSU"):
            raise rest.invalid(f"Expects arg[{i}] to be {rest.tf_type_name(spec.dtype)} but "
                               f"{rest.tf_type_name(array.dtype)} is provided")
        arrays[name] = array.astype(object) if spec.dtype.kind == "O" else array
    return arrays


class _PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
    def __init__(self, core: ServingCore):
        self.core = core

    def Predict(self, request: Any, context: grpc.ServicerContext) -> Any:
        spec = request.model_spec
        with _status(context):
            servable = self.core.servable(*_selects(spec))
            signature = spec.signature_name or rest.DEFAULT_SIGNATURE
            arrays = inputs_from_protos(request.inputs, servable.inputs_of(signature))
            outputs = self.core.submit(servable, signature, arrays).result()
            wanted = list(request.output_filter) or sorted(outputs)
            unknown = [name for name in wanted if name not in outputs]
            if unknown:
                raise rest.invalid(f"output tensor alias not found in signature: {unknown[0]} Outputs expected "
                                   f"to be in the set {{{','.join(sorted(outputs))}}}.")
            response = predict_pb2.PredictResponse()
            _fill_spec(response.model_spec, spec.name, servable.version, signature)
            for name in wanted:
                response.outputs[name].CopyFrom(tf.make_tensor_proto(outputs[name]))
            return response

    def GetModelMetadata(self, request: Any, context: grpc.ServicerContext) -> Any:
        spec = request.model_spec
        with _status(context):
            if not request.metadata_field:
                raise rest.invalid("GetModelMetadataRequest must specify at least one metadata_field")
            for name in request.metadata_field:
                if name != SIGNATURE_DEF:
                    raise rest.invalid(f"Metadata field {name} is not supported")
            servable = self.core.servable(*_selects(spec))
            signature_defs = json_format.ParseDict(
                {"signature_def": servable.signature_defs}, get_model_metadata_pb2.SignatureDefMap()
            )
            packed = any_pb2.Any()
            packed.Pack(signature_defs)
            response = get_model_metadata_pb2.GetModelMetadataResponse()
            _fill_spec(response.model_spec, spec.name, servable.version, "")
            response.metadata[SIGNATURE_DEF].CopyFrom(packed)
            return response


class _ModelService(model_service_pb2_grpc.ModelServiceServicer):
    def __init__(self, core: ServingCore):
        self.core = core

    def GetModelStatus(self, request: Any, context: grpc.ServicerContext) -> Any:
        spec = request.model_spec
        with _status(context):
            doc = self.core.status(*_selects(spec))
            return json_format.ParseDict(doc, get_model_status_pb2.GetModelStatusResponse())


def _selects(spec: Any) -> tuple[str, int | None, str | None]:
    """A ``ModelSpec``'s (model name, version or None, label or None), as ``ServingCore`` takes them."""
    return spec.name, spec.version.value if spec.HasField("version") else None, spec.version_label or None


def _fill_spec(model_spec: Any, name: str, version: int, signature: str) -> None:
    model_spec.name = name
    model_spec.version.value = version
    model_spec.signature_name = signature


@contextlib.contextmanager
def _status(context: grpc.ServicerContext) -> Iterator[None]:
    """A ``rest.ServingError`` becomes the gRPC status of the same name (``abort`` raises)."""
    try:
        yield
    except rest.ServingError as err:
        context.abort(grpc.StatusCode[err.code], err.message)
