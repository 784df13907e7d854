"""TensorFlow Serving's gRPC API (port 8500) on the official generated stubs.

``PredictionService`` (Predict, Classify, Regress, MultiInference,
GetModelMetadata), ``ModelService.GetModelStatus`` and the profiler's
``tensorflow.ProfilerService``, as TF Serving serves them on its gRPC port
(tensorflow_serving/model_servers/server.cc at the snapshot cited in
``classify_regress``), implemented with the servicer base classes of
``tensorflow-serving-api``, so the official stubs work unchanged. Requests
go through the same ``ServingCore`` as REST (same versions, same batching,
same error codes and messages); outputs come back in the typed ``*_val``
fields, as TF Serving's ``Tensor::AsProtoField`` fills them.
``HandleReloadConfigRequest`` answers UNIMPLEMENTED, as the base class does.
"""
from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import grpc
import numpy as np
import tensorflow as tf
from google.protobuf import any_pb2, json_format
from tensorflow.core.framework import types_pb2
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    inference_pb2,
    model_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)

from hvdk8s.serving.api import classify_regress, types
from hvdk8s.serving.server.core import ServingCore

SIGNATURE_DEF = "signature_def"  # the one metadata field TF Serving knows
PROFILER_SERVICE = "/tensorflow.ProfilerService/"
MAX_MESSAGE_BYTES = 2**31 - 1  # server.cc: builder.SetMaxMessageSize(numeric_limits<int32_t>::max())


def create_server(
    core: ServingCore, host: str, port: int, threads: int = 64, *, socket_path: str | None = None,
    options: Sequence[tuple[str, int | str]] = (),
) -> tuple[grpc.Server, int]:
    """A bound, not yet started server and its TCP port (``port`` 0: any free port).

    ``socket_path``: also listen on that Unix socket (``--grpc_socket_path``);
    ``options``: gRPC channel arguments (``--grpc_channel_arguments``).
    """
    base = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES), ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]
    server = grpc.server(ThreadPoolExecutor(max_workers=threads, thread_name_prefix="grpc"),
                         handlers=[_ProfilerProxy()], options=[*base, *options])
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(_PredictionService(core), server)
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(_ModelService(core), server)
    addresses = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    if socket_path:
        addresses.append(f"unix:{socket_path}")
    bound = 0
    for address in addresses:
        try:
            got = server.add_insecure_port(address)
        except RuntimeError as err:
            raise ValueError(f"cannot listen on {address} for gRPC: {err}") from None
        if not got:
            raise ValueError(f"cannot listen on {address} for gRPC")
        bound = bound or got
    return server, bound


def channel_arguments(text: str) -> list[tuple[str, int | str]]:
    """``--grpc_channel_arguments`` as TF Serving parses it: ``key=value`` pairs, comma-separated, int where one parses."""
    pairs: list[tuple[str, int | str]] = []
    for item in filter(None, text.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--grpc_channel_arguments: {item!r} is not key=value")
        try:
            number = int(value)
        except ValueError:
            pairs.append((key, value))
        else:
            pairs.append((key, number) if -2**31 <= number < 2**31 else (key, value))
    return pairs


def tensor_proto(array: np.ndarray) -> Any:
    """A TensorProto with the values in its typed field (``float_val``, ``int64_val``...), not ``tensor_content``."""
    array = np.asarray(array)
    proto = tf.make_tensor_proto(array)
    field = _TYPED_FIELDS.get(proto.dtype)
    if field is None or not proto.tensor_content:
        return proto
    proto.tensor_content = b""
    flat = array.ravel()
    if proto.dtype in (types_pb2.DT_HALF, types_pb2.DT_BFLOAT16):
        flat = flat.view(np.uint16)  # half_val holds the 16-bit patterns
    elif flat.dtype.kind == "c":
        flat = flat.view(flat.real.dtype)  # real and imaginary parts interleaved
    getattr(proto, field).extend(flat.tolist())
    return proto


_TYPED_FIELDS = {
    types_pb2.DT_FLOAT: "float_val", types_pb2.DT_DOUBLE: "double_val", types_pb2.DT_INT32: "int_val",
    types_pb2.DT_INT16: "int_val", types_pb2.DT_INT8: "int_val", types_pb2.DT_UINT8: "int_val",
    types_pb2.DT_UINT16: "int_val", types_pb2.DT_INT64: "int64_val", types_pb2.DT_UINT32: "uint32_val",
    types_pb2.DT_UINT64: "uint64_val", types_pb2.DT_BOOL: "bool_val", types_pb2.DT_HALF: "half_val",
    types_pb2.DT_BFLOAT16: "half_val", types_pb2.DT_COMPLEX64: "scomplex_val", types_pb2.DT_COMPLEX128: "dcomplex_val",
}


def inputs_from_protos(tensors: Any, specs: dict[str, types.InputSpec]) -> dict[str, np.ndarray]:
    """Request tensors as arrays, checked against the signature's inputs as TF Serving checks them."""
    if set(tensors) != set(specs):
        sent, want = sorted(tensors), sorted(specs)
        raise types.invalid(
            f"input size does not match signature: {len(sent)}!={len(want)} len({{{','.join(sent)}}}) != "
            f"len({{{','.join(want)}}}). Sent extra: {{{','.join(sorted(set(sent) - set(want)))}}}. "
            f"Missing but required: {{{','.join(sorted(set(want) - set(sent)))}}}."
        )
    arrays = {}
    for i, (name, spec) in enumerate(sorted(specs.items())):
        try:
            array = tf.make_ndarray(tensors[name])
        except (TypeError, ValueError) as err:
            raise types.invalid(f"input {name}: {err}") from None
        if array.dtype != spec.dtype and not (spec.dtype.kind == "O" and array.dtype.kind in "OSU"):
            raise types.invalid(f"Expects arg[{i}] to be {types.tf_type_name(spec.dtype)} but "
                               f"{types.tf_type_name(array.dtype)} is provided")
        arrays[name] = array.astype(object) if spec.dtype.kind == "O" else array
    return arrays


def output_filter(aliases: Sequence[str], outputs: Iterable[str]) -> list[str]:
    """A Predict request's ``output_filter``, checked against the signature's outputs before the model runs, as
    predict_util.cc PreProcessPrediction (TF Serving 9d981c5c) checks it: an unknown or repeated alias is refused."""
    known, seen = sorted(outputs), set()
    for alias in aliases:
        if alias not in known:
            raise types.invalid(f"output tensor alias not found in signature: {alias} Outputs expected "
                               f"to be in the set {{{','.join(known)}}}.")
        if alias in seen:
            raise types.invalid(f"duplicate output tensor alias: {alias}")
        seen.add(alias)
    return list(aliases)


class _PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
    def __init__(self, core: ServingCore):
        self.core = core

    def Predict(self, request: Any, context: grpc.ServicerContext) -> Any:
        with _status(context, self.core, request.model_spec.name, "predict"):
            spec = _model_spec(request)
            servable = self.core.servable(*_selects(spec))
            signature = spec.signature_name or types.DEFAULT_SIGNATURE
            arrays = inputs_from_protos(request.inputs, servable.inputs_of(signature))
            wanted = output_filter(request.output_filter, servable.signature_defs[signature]["outputs"])
            outputs = _within_deadline(self.core.submit(servable, signature, arrays), context)
            response = predict_pb2.PredictResponse()
            _fill_spec(response.model_spec, spec.name, servable.version, signature)
            for name in wanted or sorted(outputs):
                response.outputs[name].CopyFrom(tensor_proto(outputs[name]))
            return response

    def Classify(self, request: Any, context: grpc.ServicerContext) -> Any:
        with _status(context, self.core, request.model_spec.name, classify_regress.CLASSIFY):
            response = classification_pb2.ClassificationResponse()
            self._examples(classify_regress.CLASSIFY, _model_spec(request), classify_regress.from_input(request.input),
                           response.model_spec, response.result, context)
            return response

    def Regress(self, request: Any, context: grpc.ServicerContext) -> Any:
        with _status(context, self.core, request.model_spec.name, classify_regress.REGRESS):
            response = regression_pb2.RegressionResponse()
            self._examples(classify_regress.REGRESS, _model_spec(request), classify_regress.from_input(request.input),
                           response.model_spec, response.result, context)
            return response

    def MultiInference(self, request: Any, context: grpc.ServicerContext) -> Any:
        """Several classify/regress signatures of one model on the same examples.

        As TF Serving 9d981c5c: one servable, the one ``tasks[0]``'s spec selects (multi_inference_helper.cc;
        no tasks: the empty spec's error), every task checked before any runs, then all on that servable
        (multi_inference.cc ``TensorFlowMultiInferenceRunner::Infer``). TF Serving runs them as one session
        call; here each signature is its own call, all submitted together.
        """
        first = request.tasks[0].model_spec if request.tasks else model_pb2.ModelSpec()
        with _status(context, self.core, first.name, "multi_inference"):
            servable = self.core.servable(*_selects(first))
            tasks = multi_inference_tasks(request.tasks, servable.signature_defs)
            serialized = classify_regress.from_input(request.input)
            inputs = classify_regress.input_tensor(serialized)
            futures = [self.core.submit(servable, signature, inputs) for _, signature in tasks]
            response = inference_pb2.MultiInferenceResponse()
            try:
                for task, (api, signature), future in zip(request.tasks, tasks, futures):
                    result = response.results.add()
                    target = result.classification_result if api == classify_regress.CLASSIFY else result.regression_result
                    _fill_result(api, _within_deadline(future, context), len(serialized), target)
                    _fill_spec(result.model_spec, task.model_spec.name, servable.version, signature)
            finally:
                for future in futures:
                    future.cancel()  # those not yet run, once one has failed or passed the deadline
            return response

    def _examples(self, api: str, spec: Any, serialized: list[bytes], out_spec: Any, result: Any,
                  context: grpc.ServicerContext) -> None:
        """Run one classify/regress signature on ``serialized`` and fill ``result`` and ``out_spec``."""
        servable = self.core.servable(*_selects(spec))
        signature = spec.signature_name or types.DEFAULT_SIGNATURE
        inputs = self.core.examples_inputs(api, servable, signature, serialized)
        outputs = _within_deadline(self.core.submit(servable, signature, inputs), context)
        _fill_result(api, outputs, len(serialized), result)
        _fill_spec(out_spec, spec.name, servable.version, signature)

    def GetModelMetadata(self, request: Any, context: grpc.ServicerContext) -> Any:
        with _status(context, self.core, request.model_spec.name, "metadata"):
            spec = _model_spec(request)
            if not request.metadata_field:
                raise types.invalid("GetModelMetadataRequest must specify at least one metadata_field")
            for name in request.metadata_field:
                if name != SIGNATURE_DEF:
                    raise types.invalid(f"Metadata field {name} is not supported")
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
        with _status(context, self.core, request.model_spec.name, "status"):
            spec = _model_spec(request)  # an empty name is NOT_FOUND here, as get_model_status_impl.cc answers
            doc = self.core.status(spec.name, spec.version.value if spec.HasField("version") else None)
            return json_format.ParseDict(doc, get_model_status_pb2.GetModelStatusResponse())


def multi_inference_tasks(tasks: Sequence[Any], signature_defs: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Each MultiInference task's (API, signature name), checked in multi_inference.cc's order (TF Serving
    9d981c5c): model name, duplicate signature, the signature in the model, its method, the signature's inputs
    and outputs for that method."""
    checked: list[tuple[str, str]] = []
    for task in tasks:
        spec = task.model_spec
        if not spec.name:
            raise types.invalid("Found ModelSpec with an empty model name.")
        if spec.name != tasks[0].model_spec.name:
            raise types.invalid("All ModelSpecs in a MultiInferenceRequest must access the same model name.")
        signature = spec.signature_name or types.DEFAULT_SIGNATURE
        if any(signature == seen for _, seen in checked):
            raise types.invalid(f"Duplicate evaluation of signature: {signature}")
        if signature not in signature_defs:
            raise types.invalid(f"Requested signature not found in model graph: {signature}")
        if task.method_name not in classify_regress.METHOD_NAMES:
            raise types.ServingError("UNIMPLEMENTED", f"Unsupported signature method_name: {task.method_name}")
        api = classify_regress.METHOD_NAMES[task.method_name]
        classify_regress.check_signature(api, signature, signature_defs)
        checked.append((api, signature))
    return checked


def _fill_result(api: str, outputs: Mapping[str, np.ndarray], count: int, result: Any) -> None:
    """A ClassificationResult or RegressionResult from a signature's outputs for ``count`` examples."""
    if api == classify_regress.CLASSIFY:
        for classes in classify_regress.classifications(outputs, count):
            entry = result.classifications.add()
            for label, score in classes:
                entry.classes.add(label=label, score=score)
    else:
        for value in classify_regress.regressions(outputs, count):
            result.regressions.add(value=value)


def _model_spec(request: Any) -> Any:
    """The request's ``ModelSpec``; INVALID_ARGUMENT "Missing ModelSpec" without one, checked first, as TF Serving
    does (predict_impl.cc, classification_service.cc, regression_service.cc, get_model_metadata_impl.cc,
    get_model_status_impl.cc at 9d981c5c): the default spec would otherwise read as model "" (NOT_FOUND)."""
    if not request.HasField("model_spec"):
        raise types.invalid("Missing ModelSpec")
    return request.model_spec


def _selects(spec: Any) -> tuple[str, int | None, str | None]:
    """A ``ModelSpec``'s (model name, version or None, label or None), as ``ServingCore`` takes them.

    No name is INVALID_ARGUMENT, a request that can never succeed (server_core.cc ServableRequestFromModelSpec),
    not the NOT_FOUND of a model not loaded (yet).
    """
    if not spec.name:
        raise types.invalid("ModelSpec has no name specified.")
    return spec.name, spec.version.value if spec.HasField("version") else None, spec.version_label or None


def _fill_spec(model_spec: Any, name: str, version: int, signature: str) -> None:
    model_spec.name = name
    model_spec.version.value = version
    model_spec.signature_name = signature


def _within_deadline(future: Future, context: grpc.ServicerContext) -> dict[str, np.ndarray]:
    """The model's outputs, waited for no longer than the client's deadline (none: as long as it takes).

    TF Serving makes the deadline the model run's timeout (``enforce_session_run_timeout``, on by default:
    prediction_service_impl.cc), so a request the client has given up on does not hold a server thread.
    """
    try:
        return future.result(timeout=_time_left(context))
    except TimeoutError:
        future.cancel()  # not run if it is still queued
        raise types.ServingError("DEADLINE_EXCEEDED", "Deadline Exceeded") from None


def _time_left(context: grpc.ServicerContext) -> float | None:
    """Seconds to the call's deadline; None without one, where grpc's ``time_remaining()`` is gpr_inf_future's
    ~9e18 s, which a lock cannot wait (OverflowError) and a relayed call reads as a deadline already past."""
    remaining = context.time_remaining()
    return remaining if remaining < threading.TIMEOUT_MAX else None


@contextlib.contextmanager
def _status(context: grpc.ServicerContext, core: ServingCore, model: str, api: str) -> Iterator[None]:
    """A ``types.ServingError`` becomes the gRPC status of the same name (``abort`` raises); the call is counted."""
    start, code = time.perf_counter(), "OK"
    try:
        yield
    except types.ServingError as err:
        code = err.code
        context.abort(grpc.StatusCode[err.code], err.message)
    except Exception:
        code = "INTERNAL"  # a bug: grpc answers UNKNOWN with the exception's text
        raise
    finally:
        if core.metrics is not None:
            core.metrics.observe(model, api, "GRPC", code, time.perf_counter() - start)


class _ProfilerProxy(grpc.GenericRpcHandler):
    """``tensorflow.ProfilerService`` on this port, as TF Serving registers it (``enable_profiler``, on by default).

    The service is TensorFlow's own (TSL's ``CreateProfilerService``,
    started by ``tf.profiler.experimental.server.start`` on a free port the
    first time a profiler call arrives); its calls are relayed
    as bytes, so profiler clients such as ``tf.profiler.experimental.client.trace``
    (and TensorBoard) work against the serving port.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        if not details.method.startswith(PROFILER_SERVICE):
            return None
        method = details.method

        def relay(request: bytes, context: grpc.ServicerContext) -> bytes:  # type: ignore[return]
            # (grpc's stubs type ServicerContext.abort as returning None; it raises)
            try:
                return self._target().unary_unary(method)(request, timeout=_time_left(context))
            except grpc.RpcError as err:
                context.abort(err.code(), err.details())

        return grpc.unary_unary_rpc_method_handler(relay)

    def _target(self) -> grpc.Channel:
        with self._lock:
            if self._channel is None:
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", 0))
                    port = probe.getsockname()[1]
                tf.profiler.experimental.server.start(port)
                self._channel = grpc.insecure_channel(f"127.0.0.1:{port}")
            return self._channel
