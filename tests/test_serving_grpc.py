"""gRPC (TF Serving's PredictionService and ModelService) with the official ``tensorflow-serving-api`` client,
and batching shared by REST and gRPC, against a real ``hvdk8s serve`` process.

The server batches with a 20 ms timeout, so concurrent requests really share
batches, and splits requests into batches of at most 8 images (TF Serving's
large batch splitting); every answer is compared with the SavedModel's own
signature called in this process on that request alone.
"""
from __future__ import annotations

import base64
import contextlib
import io
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from types import SimpleNamespace

import grpc
import numpy as np
import pytest
import requests
import tensorflow as tf
from PIL import Image
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    inference_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)

import hvdk8s.cli
from hvdk8s.serving.api.types import InputSpec
from hvdk8s.serving.clients import loadtest
from hvdk8s.serving.server import grpc_server
from hvdk8s.serving.server.process import running

from serving_models import export_untrained

PNGS = loadtest.digits_png(8)


def jpeg(png: bytes) -> bytes:
    out = io.BytesIO()
    Image.open(io.BytesIO(png)).save(out, "JPEG", quality=90)
    return out.getvalue()


IMAGES = PNGS + [jpeg(p) for p in PNGS]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    base = tmp_path_factory.mktemp("models") / "digits"
    export_untrained(base)
    return base


@pytest.fixture(scope="module")
def server(model_dir):
    params = model_dir.parent / "batching.txt"
    params.write_text("max_batch_size { value: 16 }\nbatch_timeout_micros { value: 20000 }\n"
                      "enable_large_batch_splitting { value: true }\nmax_execution_batch_size { value: 8 }\n")
    with running(model_dir, model_dir.parent / "stderr.log", "--enable_batching",
                 "--batching_parameters_file", str(params)) as srv:
        yield srv


@pytest.fixture(scope="module")
def signature(model_dir):
    return tf.saved_model.load(str(model_dir / "1")).signatures["serving_default"]


@pytest.fixture(scope="module")
def stub(server):
    with grpc.insecure_channel(server.grpc) as channel:
        yield prediction_service_pb2_grpc.PredictionServiceStub(channel)


def request_for(images: list[bytes], model: str = "digits", input_name: str = "image_bytes"):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = "serving_default"
    request.inputs[input_name].CopyFrom(tf.make_tensor_proto(images, dtype=tf.string))
    return request


def unbatched(signature, images: list[bytes]) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in signature(image_bytes=tf.constant(images)).items()}


def test_official_client_predicts_png_and_jpeg_bytes(stub, signature):
    response = stub.Predict(request_for(IMAGES), timeout=60)
    assert (response.model_spec.name, response.model_spec.version.value) == ("digits", 1)
    assert response.model_spec.signature_name == "serving_default"
    expected = unbatched(signature, IMAGES)
    assert sorted(response.outputs) == sorted(expected)
    for name, value in expected.items():
        # float32 sums in the server's order: its process may split a convolution across other threads than this
        # one (2e-8 apart on AMD EPYC); classes and names exactly
        got = tf.make_ndarray(response.outputs[name])
        if value.dtype.kind == "f":
            np.testing.assert_allclose(got, value, rtol=1e-6, atol=1e-7)
        else:
            np.testing.assert_array_equal(got, value)
    only = request_for(IMAGES[:2])
    only.output_filter.append("classes")
    assert list(stub.Predict(only, timeout=60).outputs) == ["classes"]


def test_metadata_and_status(server, stub):
    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    request.model_spec.name = "digits"
    response = stub.GetModelMetadata(request, timeout=30)
    signature_defs = get_model_metadata_pb2.SignatureDefMap()
    response.metadata["signature_def"].Unpack(signature_defs)
    default = signature_defs.signature_def["serving_default"]
    assert default.method_name == "tensorflow/serving/predict"
    assert default.inputs["image_bytes"].dtype == tf.string.as_datatype_enum
    assert set(default.outputs) == {"probabilities", "classes", "class_names"}
    assert {"serving_default", "predict_tensor"} <= set(signature_defs.signature_def)  # as TF Serving lists them

    with grpc.insecure_channel(server.grpc) as channel:
        status_request = get_model_status_pb2.GetModelStatusRequest()
        status_request.model_spec.name = "digits"
        status = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(status_request, timeout=30)
    [version] = status.model_version_status
    assert (version.version, version.state) == (1, get_model_status_pb2.ModelVersionStatus.AVAILABLE)


def metadata_request(field: str, model: str = "digits"):
    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=[field])
    request.model_spec.name = model
    return request


def without_model_spec(request):
    request.ClearField("model_spec")
    return request


def filtered(request, *aliases: str):
    request.output_filter.extend(aliases)
    return request


@pytest.mark.parametrize(
    "call, code, message",
    [
        (lambda s: s.Predict(request_for(PNGS[:1], model="mnist")), "NOT_FOUND",
         "Servable not found for request: Latest(mnist)"),
        (lambda s: s.Predict(request_for(PNGS[:1], input_name="images")), "INVALID_ARGUMENT",
         "input size does not match signature: 1!=1 len({images}) != len({image_bytes}). Sent extra: {images}. "
         "Missing but required: {image_bytes}."),
        (lambda s: s.Predict(request_for([b"not an image"])), "INVALID_ARGUMENT", "Unknown image file format"),
        (lambda s: s.GetModelMetadata(metadata_request("other")), "INVALID_ARGUMENT",
         "Metadata field other is not supported"),
        # TF Serving 9d981c5c: each API checks has_model_spec() first (predict_impl.cc, classification_service.cc,
        # regression_service.cc, get_model_metadata_impl.cc), then ServerCore::ServableRequestFromModelSpec the name
        (lambda s: s.Predict(without_model_spec(request_for(PNGS[:1]))), "INVALID_ARGUMENT", "Missing ModelSpec"),
        (lambda s: s.Classify(classification_pb2.ClassificationRequest()), "INVALID_ARGUMENT", "Missing ModelSpec"),
        (lambda s: s.Regress(regression_pb2.RegressionRequest()), "INVALID_ARGUMENT", "Missing ModelSpec"),
        (lambda s: s.GetModelMetadata(without_model_spec(metadata_request("other"))), "INVALID_ARGUMENT",
         "Missing ModelSpec"),
        (lambda s: s.Predict(request_for(PNGS[:1], model="")), "INVALID_ARGUMENT",
         "ModelSpec has no name specified."),
        (lambda s: s.GetModelMetadata(metadata_request("signature_def", model="")), "INVALID_ARGUMENT",
         "ModelSpec has no name specified."),
        # predict_util.cc PreProcessPrediction checks output_filter before the model runs
        (lambda s: s.Predict(filtered(request_for(PNGS[:1]), "classes", "classes")), "INVALID_ARGUMENT",
         "duplicate output tensor alias: classes"),
        (lambda s: s.Predict(filtered(request_for(PNGS[:1]), "classes", "logits")), "INVALID_ARGUMENT",
         "output tensor alias not found in signature: logits Outputs expected to be in the set "
         "{class_names,classes,probabilities}."),
    ],
    ids=["unknown-model", "wrong-input", "not-an-image", "metadata-field", "predict-no-spec", "classify-no-spec",
         "regress-no-spec", "metadata-no-spec", "predict-no-name", "metadata-no-name", "duplicate-output",
         "unknown-output"],
)
def test_errors_are_tf_serving_status_codes(stub, call, code, message):
    with pytest.raises(grpc.RpcError) as err:
        call(stub)
    assert err.value.code().name == code and message in err.value.details()


def test_model_status_without_model_spec_is_invalid_and_without_a_name_not_found(server):
    """get_model_status_impl.cc: no spec is INVALID_ARGUMENT; a spec with no name looks up model "" (NOT_FOUND)."""
    with grpc.insecure_channel(server.grpc) as channel:
        status = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus
        with pytest.raises(grpc.RpcError) as err:
            status(get_model_status_pb2.GetModelStatusRequest(), timeout=30)
        assert (err.value.code(), err.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, "Missing ModelSpec")
        request = get_model_status_pb2.GetModelStatusRequest()
        request.model_spec.signature_name = "serving_default"  # a spec, but no name
        with pytest.raises(grpc.RpcError) as err:
            status(request, timeout=30)
        assert (err.value.code(), err.value.details()) == (grpc.StatusCode.NOT_FOUND,
                                                           "Could not find any versions of model ")


def test_a_batched_predict_without_a_deadline_waits_as_long_as_it_takes(stub, signature):
    """A call with no timeout (the official client's default): the server's remaining time is then ~9e18 s, which
    the wait for the batch turned into OverflowError, answered UNKNOWN."""
    response = stub.Predict(request_for(PNGS[:2]))
    np.testing.assert_array_equal(tf.make_ndarray(response.outputs["classes"]), unbatched(signature, PNGS[:2])["classes"])


def test_label_and_wrong_dtype(stub):
    request = request_for(PNGS[:1])
    request.model_spec.version_label = "stable"
    with pytest.raises(grpc.RpcError, match="Unrecognized servable version label: stable"):
        stub.Predict(request, timeout=30)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "digits"
    request.inputs["image_bytes"].CopyFrom(tf.make_tensor_proto([1.0, 2.0], dtype=tf.float32))
    with pytest.raises(grpc.RpcError, match="Expects arg\\[0\\] to be string but float is provided"):
        stub.Predict(request, timeout=30)


def test_concurrent_rest_and_grpc_requests_batched_together_match_unbatched_calls(server, stub, signature):
    """32 requests of 1-3 images at once, half REST, half gRPC: each answer is its own unbatched call's.

    Same classes; probabilities equal to float32 rounding, not bit for bit:
    TensorFlow's CPU kernels (oneDNN) block the work differently for
    different batch sizes, as they do inside TF Serving's batching.
    """
    jobs = [IMAGES[i % 16: i % 16 + 1 + i % 3] for i in range(32)]

    def rest_call(images):
        doc = {"instances": [{"b64": base64.b64encode(i).decode()} for i in images]}
        predictions = requests.post(f"{server.url}/v1/models/digits:predict", json=doc, timeout=60).json()
        return {name: np.array([p[name] for p in predictions["predictions"]]) for name in ("probabilities", "classes")}

    def grpc_call(images):
        outputs = stub.Predict(request_for(images), timeout=60).outputs
        return {name: tf.make_ndarray(outputs[name]) for name in ("probabilities", "classes")}

    with ThreadPoolExecutor(32) as pool:
        futures = [pool.submit(rest_call if i % 2 else grpc_call, job) for i, job in enumerate(jobs)]
        answers = [f.result() for f in futures]
    for job, answer in zip(jobs, answers):
        alone = unbatched(signature, job)
        np.testing.assert_array_equal(answer["classes"], alone["classes"])
        np.testing.assert_allclose(answer["probabilities"], alone["probabilities"], rtol=1e-6, atol=1e-7)


def test_predict_and_loadtest_clis_over_grpc(server, tmp_path, capsys):
    files = []
    for i, image in enumerate(IMAGES[:3]):
        (path := tmp_path / f"d{i}.png").write_bytes(image)
        files.append(str(path))
    assert hvdk8s.cli.main(["predict", "--grpc", "--url", server.grpc, *files]) == 0
    over_grpc = capsys.readouterr().out
    assert hvdk8s.cli.main(["predict", "--url", server.url, *files]) == 0
    assert over_grpc == capsys.readouterr().out and len(over_grpc.splitlines()) == 3
    assert hvdk8s.cli.main(["predict", "--grpc", "--url", server.grpc, "--model", "mnist", files[0]]) == 2
    assert "NOT_FOUND: Servable not found for request: Latest(mnist)" in capsys.readouterr().err

    assert hvdk8s.cli.main(["loadtest", server.grpc, "--grpc", "--concurrency", "4", "--requests", "30",
                            "--images", "2", "--max-error-rate", "0"]) == 0
    assert "requests     30 in" in capsys.readouterr().out
    refused = loadtest.run(server.grpc, "mnist", grpc=True, concurrency=2, requests=4)
    assert refused.errors_by_status == {"NOT_FOUND": 4}


@pytest.mark.parametrize(
    "array, field, values",
    [
        (np.array([[1.5], [2.0]], "float32"), "float_val", [1.5, 2.0]),
        (np.array([1.5], "float64"), "double_val", [1.5]),
        (np.array([1, -2], "int32"), "int_val", [1, -2]),
        (np.array([255], "uint8"), "int_val", [255]),
        (np.array([2**40], "int64"), "int64_val", [2**40]),
        (np.array([True, False]), "bool_val", [True, False]),
        (np.array([1.0], "float16"), "half_val", [0x3C00]),  # the 16-bit pattern
        (np.array([1 + 2j], "complex64"), "scomplex_val", [1.0, 2.0]),
        (np.array([b"a", b"b"], dtype=object), "string_val", [b"a", b"b"]),
    ],
)
def test_outputs_go_in_the_typed_fields_as_tf_serving_fills_them(array, field, values):
    """predict_util.cc: Tensor::AsProtoField (not tensor_content), so clients reading float_val etc. see the values."""
    from hvdk8s.serving.server.grpc_server import tensor_proto

    proto = tensor_proto(array)
    assert (list(getattr(proto, field)), proto.tensor_content) == (values, b"")
    np.testing.assert_array_equal(tf.make_ndarray(proto), array)


def test_grpc_channel_arguments_are_parsed_as_tf_serving_parses_them():
    """server.cc parseGrpcChannelArgs: key=value pairs split on commas, the value an int where one parses."""
    from hvdk8s.serving.server.grpc_server import channel_arguments

    assert channel_arguments("grpc.max_connection_age_ms=2000,grpc.lb_policy_name=grpclb,grpc.so_reuseaddr=1") == [
        ("grpc.max_connection_age_ms", 2000), ("grpc.lb_policy_name", "grpclb"), ("grpc.so_reuseaddr", 1)]
    with pytest.raises(ValueError, match="--grpc_channel_arguments: 'grpc.x' is not key=value"):
        channel_arguments("grpc.x")


def test_monitoring_config_as_tf_serving_reads_it():
    from hvdk8s.serving.server import monitoring

    assert monitoring.parse_config("prometheus_config { enable: true }", "f") == monitoring.PrometheusConfig(
        True, "/monitoring/prometheus/metrics")  # kPrometheusPath when no path is given
    assert monitoring.parse_config('prometheus_config { enable: true, path: "/m" }', "f").path == "/m"
    assert not monitoring.parse_config("", "f").enable
    with pytest.raises(ValueError, match="f: Error parsing text-format tensorflow.serving.MonitoringConfig"):
        monitoring.parse_config("prometheus { }", "f")


def test_prometheus_metrics_count_rest_and_grpc_requests(model_dir, tmp_path):
    """--monitoring_config_file: metrics at TF Serving's path on the REST port, both front ends counted."""
    config = tmp_path / "monitoring.config"
    config.write_text("prometheus_config { enable: true }")
    with running(model_dir, tmp_path / "stderr.log", "--monitoring_config_file", str(config)) as served:
        assert requests.get(f"{served.url}/v1/models/digits", timeout=30).status_code == 200
        assert requests.get(f"{served.url}/v1/models/mnist", timeout=30).status_code == 404
        request = get_model_status_pb2.GetModelStatusRequest()
        request.model_spec.name = "digits"
        with grpc.insecure_channel(served.grpc) as channel:
            model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(request, timeout=30)
        text = requests.get(f"{served.url}/monitoring/prometheus/metrics", timeout=30).text
    assert ':tensorflow:serving:request_count_total{model_name="digits",status="OK"} 2.0' in text
    assert ':tensorflow:serving:request_count_total{model_name="mnist",status="NOT_FOUND"} 1.0' in text
    assert ':tensorflow:serving:request_latency_count{API="status",entrypoint="GRPC",model_name="digits"} 1.0' in text


class _NeverAnswers:
    """A ServingCore stand-in whose model never answers: the future a request waits on is kept to inspect."""

    metrics = None

    def __init__(self) -> None:
        self.futures: list[Future] = []

    def servable(self, model, version=None, label=None):
        return SimpleNamespace(version=1, inputs_of=lambda signature: {"x": InputSpec(np.dtype("float32"), (None,))},
                               signature_defs={"serving_default": {"outputs": {"y": {}}}})

    def submit(self, servable, signature, inputs) -> Future:
        self.futures.append(future := Future())
        return future


@contextlib.contextmanager
def in_process(core) -> Iterator[grpc.Channel]:
    """An in-process gRPC server on ``core`` and a channel to it."""
    server, port = grpc_server.create_server(core, "127.0.0.1", 0)
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield channel
    finally:
        server.stop(None)


@contextlib.contextmanager
def stub_serving(core) -> Iterator[prediction_service_pb2_grpc.PredictionServiceStub]:
    """An in-process gRPC server on ``core`` and a PredictionService client stub for it."""
    with in_process(core) as channel:
        yield prediction_service_pb2_grpc.PredictionServiceStub(channel)


def stub_request(*aliases: str):
    request = predict_pb2.PredictRequest(output_filter=aliases)
    request.model_spec.name = "m"
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.ones(2, np.float32)))
    return request


def test_a_predict_past_the_clients_deadline_frees_its_server_thread_and_is_dropped():
    core = _NeverAnswers()
    with stub_serving(core) as stub:
        with pytest.raises(grpc.RpcError) as err:
            stub.Predict(stub_request(), timeout=0.5)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        deadline = time.monotonic() + 10  # the handler gives up on the model once the deadline has passed
        while not (core.futures and core.futures[0].cancelled()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert core.futures[0].cancelled()  # so the batcher drops it unless it already runs


@pytest.mark.parametrize("aliases, message", [
    (["y", "y"], "duplicate output tensor alias: y"),
    (["z"], "output tensor alias not found in signature: z Outputs expected to be in the set {y}."),
])
def test_an_output_filter_refused_never_reaches_the_model(aliases, message):
    """predict_util.cc PreProcessPrediction refuses the filter before Session::Run: no batch slot, no model call."""
    core = _NeverAnswers()
    with stub_serving(core) as stub, pytest.raises(grpc.RpcError) as err:
        stub.Predict(stub_request(*aliases), timeout=30)
    assert (err.value.code(), err.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, message)
    assert core.futures == []


CLASSIFY_SIG = {"inputs": {"inputs": {}}, "outputs": {"classes": {}, "scores": {}}}
REGRESS_SIG = {"inputs": {"inputs": {}}, "outputs": {"outputs": {}}}


class _Versions:
    """A ServingCore stand-in with versions 1 and 2 of model "m" (classify, regress and predict signatures);
    it records the versions asked for and the signatures run, and answers each example at once."""

    metrics = None

    def __init__(self) -> None:
        self.asked: list[tuple] = []
        self.runs: list[tuple[int, str]] = []

    def servable(self, model, version=None, label=None):
        self.asked.append((model, version, label))
        defs = {"classify_x": CLASSIFY_SIG, "regress_x": REGRESS_SIG,
                "predict_x": {"inputs": {"x": {}}, "outputs": {"y": {}}}}
        return SimpleNamespace(version=version or 2, signature_defs=defs)

    def submit(self, servable, signature, inputs) -> Future:
        self.runs.append((servable.version, signature))
        n = len(inputs["inputs"])
        outputs = ({"classes": np.array([[b"a"]] * n, dtype=object), "scores": np.full((n, 1), 0.5, np.float32)}
                   if signature == "classify_x" else {"outputs": np.full((n, 1), 1.5, np.float32)})
        future: Future = Future()
        future.set_result(outputs)
        return future


def multi_request(*tasks: tuple[str, int | None, str, str]):
    """A MultiInferenceRequest of one example; each task (model, version or None, signature, method name)."""
    request = inference_pb2.MultiInferenceRequest()
    request.input.example_list.examples.add().features.feature["x"].float_list.value.append(1.0)
    for model, version, signature, method in tasks:
        task = request.tasks.add(method_name=method)
        task.model_spec.name, task.model_spec.signature_name = model, signature
        if version is not None:
            task.model_spec.version.value = version
    return request


CLASSIFY_METHOD, REGRESS_METHOD = "tensorflow/serving/classify", "tensorflow/serving/regress"


def test_multi_inference_runs_every_task_on_the_version_the_first_task_selects():
    """multi_inference_helper.cc: one servable handle, from tasks[0]'s spec; the other tasks' versions are ignored."""
    core = _Versions()
    with stub_serving(core) as stub:
        response = stub.MultiInference(multi_request(("m", 1, "classify_x", CLASSIFY_METHOD),
                                                     ("m", 2, "regress_x", REGRESS_METHOD)), timeout=30)
    assert core.asked == [("m", 1, None)] and core.runs == [(1, "classify_x"), (1, "regress_x")]
    first, second = response.results
    assert [(r.model_spec.name, r.model_spec.version.value, r.model_spec.signature_name)
            for r in response.results] == [("m", 1, "classify_x"), ("m", 1, "regress_x")]
    [classes] = first.classification_result.classifications
    assert [(c.label, c.score) for c in classes.classes] == [("a", 0.5)]
    assert [r.value for r in second.regression_result.regressions] == [1.5]


@pytest.mark.parametrize(
    "tasks, code, message",
    [
        # no tasks: ModelSpec::default_instance() (multi_inference_helper.cc), refused by server_core.cc
        ((), "INVALID_ARGUMENT", "ModelSpec has no name specified."),
        ((("m", None, "classify_x", CLASSIFY_METHOD), ("", None, "regress_x", REGRESS_METHOD)), "INVALID_ARGUMENT",
         "Found ModelSpec with an empty model name."),
        ((("m", None, "classify_x", CLASSIFY_METHOD), ("n", None, "regress_x", REGRESS_METHOD)), "INVALID_ARGUMENT",
         "All ModelSpecs in a MultiInferenceRequest must access the same model name."),
        ((("m", None, "classify_x", CLASSIFY_METHOD), ("m", None, "classify_x", REGRESS_METHOD)), "INVALID_ARGUMENT",
         "Duplicate evaluation of signature: classify_x"),
        # multi_inference.cc: the signature is looked up before the method name is read
        ((("m", None, "classify_x", CLASSIFY_METHOD), ("m", None, "nope", "tensorflow/serving/predict")),
         "INVALID_ARGUMENT", "Requested signature not found in model graph: nope"),
        ((("m", None, "classify_x", CLASSIFY_METHOD), ("m", None, "regress_x", "tensorflow/serving/predict")),
         "UNIMPLEMENTED", "Unsupported signature method_name: tensorflow/serving/predict"),
        # PreProcessRegression on the second task's signature, before anything runs
        ((("m", None, "classify_x", CLASSIFY_METHOD), ("m", None, "predict_x", REGRESS_METHOD)), "INVALID_ARGUMENT",
         "No regression inputs found in SignatureDef: predict_x"),
    ],
    ids=["no-tasks", "empty-name", "two-models", "duplicate-signature", "unknown-signature", "unknown-method",
         "not-a-regression-signature"],
)
def test_multi_inference_checks_every_task_before_running_any(tasks, code, message):
    core = _Versions()
    with stub_serving(core) as stub, pytest.raises(grpc.RpcError) as err:
        stub.MultiInference(multi_request(*tasks), timeout=30)
    assert (err.value.code().name, err.value.details()) == (code, message)
    assert core.runs == []


def test_a_profiler_call_without_a_deadline_is_relayed_without_one():
    """The relay to TensorFlow's ProfilerService passed grpc's "remaining" ~9e18 s as its timeout: a deadline
    already past, so every profiler call with no deadline was DEADLINE_EXCEEDED."""
    with in_process(_NeverAnswers()) as channel:
        assert channel.unary_unary(f"{grpc_server.PROFILER_SERVICE}Terminate")(b"") == b""  # an empty TerminateResponse
