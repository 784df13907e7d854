"""The server's own choices, in-process: what a refused request leaves in memory, TensorFlow's thread counts."""
from __future__ import annotations

import asyncio
import gc
import json
import os
import socket
import subprocess
import threading

import grpc
import numpy as np
import pytest
from tensorflow_serving.apis import get_model_status_pb2, model_service_pb2_grpc

from hvdk8s.benchmarks.harness.serving_bench import MALFORMED_BODIES
from hvdk8s.serving.api import rest
from hvdk8s.serving.api.types import ServingError
from hvdk8s.serving.clients import loadtest, rest_client
from hvdk8s.serving.clients.rest_client import request_body
from hvdk8s.serving.server.app import INLINE_BYTES, _within, create_app
from hvdk8s.serving.server.batching import BatchingParameters
from hvdk8s.serving.server.core import ServingCore, tensorflow_threads
from hvdk8s.serving.server.process import running
from hvdk8s.serving.server.repository import ModelRepository, load_servable

from serving_models import CLI, export_untrained


async def _post(app, path: str, body: bytes) -> int:
    """Send one POST through the ASGI interface; its response status."""
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        "server": ("test", 80), "client": ("test", 1),
    }
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict] = []

    async def receive() -> dict:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent[0]["status"]


@pytest.fixture(scope="module")
def base_path(tmp_path_factory):
    base = tmp_path_factory.mktemp("models") / "digits"
    export_untrained(base)
    return base


def cyclic_garbage(core: ServingCore, body: bytes, requests: int = 6) -> tuple[set[int], list[str]]:
    """(statuses, the types of objects left in reference cycles) after ``requests`` POSTs alone, then at once.

    With the cyclic collector off, whatever it then finds was kept alive
    by a cycle only it frees: under load, memory that grows until it runs
    (the serving benchmark's soak saw the server's RSS climb this way).
    """
    app = create_app(core)

    async def send_all() -> list[int]:  # one at a time (a batch each), then all at once (batched together)
        alone = [await _post(app, "/v1/models/digits:predict", body) for _ in range(requests)]
        return alone + list(await asyncio.gather(*(_post(app, "/v1/models/digits:predict", body)
                                                   for _ in range(requests))))

    asyncio.run(send_all())  # first calls build kernels and caches
    gc.collect()
    gc.disable()
    try:
        statuses = asyncio.run(send_all())
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        left = sorted({type(o).__name__ for o in gc.garbage})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    return set(statuses), left


def test_a_large_body_refused_on_the_worker_thread_leaves_no_reference_cycle(tmp_path):
    """Bodies over INLINE_BYTES are parsed on a worker thread; the error came back in a cycle with the body."""
    core = ServingCore(ModelRepository(tmp_path, "digits"), batching=None)
    try:
        assert cyclic_garbage(core, b"[" + b" " * (INLINE_BYTES + 10)) == ({400}, [])
    finally:
        core.close()


@pytest.mark.parametrize("api", ["classify", "regress"])
def test_a_large_examples_body_is_parsed_off_the_event_loop(tmp_path, monkeypatch, api):
    """Over INLINE_BYTES, :classify/:regress bodies are parsed on a worker thread as :predict's: the loop answers
    another request while one is parsed (it was parsed on the loop: everything waited for the slow parse)."""
    core = ServingCore(ModelRepository(tmp_path, "digits"), batching=None)
    started, release, order = threading.Event(), threading.Event(), []
    parse = rest.parse_examples_body

    def held_parse(body: bytes):
        started.set()
        release.wait(timeout=5)
        order.append("large parsed")
        return parse(body)

    monkeypatch.setattr(rest, "parse_examples_body", held_parse)
    app = create_app(core)

    async def both() -> tuple[int, int]:
        large = asyncio.ensure_future(_post(app, f"/v1/models/digits:{api}", b"[" + b" " * (INLINE_BYTES + 10)))
        while not started.is_set():
            await asyncio.sleep(0.01)
        small = await _post(app, "/v1/models/digits:predict", b"{not json")
        order.append("small answered")
        release.set()
        return await large, small

    try:
        assert asyncio.run(both()) == (400, 400)
    finally:
        core.close()
    assert order == ["small answered", "large parsed"]


@pytest.mark.parametrize("batching", [BatchingParameters(), None], ids=["batching", "unbatched"])
@pytest.mark.parametrize("name", [*MALFORMED_BODIES, "good"])
def test_no_request_leaves_a_reference_cycle(base_path, batching, name):
    """Every kind of the soak's requests, including TensorFlow's own errors re-run alone after a failed batch."""
    repository = ModelRepository(base_path, "digits")
    repository.poll()
    core = ServingCore(repository, batching)
    body = MALFORMED_BODIES.get(name) or json.dumps(request_body(loadtest.digits_png(1))).encode()
    try:
        assert cyclic_garbage(core, body) == ({400 if name in MALFORMED_BODIES else 200}, [])
    finally:
        core.close()


@pytest.mark.parametrize(
    "batching, given, cores, expected",
    [
        (BatchingParameters(num_batch_threads=2), None, 2, 1),  # the default: one core per batch thread
        (BatchingParameters(num_batch_threads=2), None, 16, 8),
        (BatchingParameters(num_batch_threads=8), None, 2, 1),  # never fewer than one
        (None, None, 16, 0),  # no batching: TensorFlow's own choice
        (BatchingParameters(num_batch_threads=2), 0, 16, 0),  # given: used as is
        (BatchingParameters(num_batch_threads=2), 3, 16, 3),
    ],
)
def test_intra_op_threads_share_the_cores_among_batch_threads(monkeypatch, batching, given, cores, expected):
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    assert tensorflow_threads(batching, given) == expected


def test_serve_refuses_negative_thread_counts(tmp_path, capsys):
    import hvdk8s.cli

    with pytest.raises(SystemExit):
        hvdk8s.cli.main(["serve", str(tmp_path), "--tensorflow_intra_op_parallelism", "-1"])
    assert "argument --tensorflow_intra_op_parallelism: -1: must be 0 or more" in capsys.readouterr().err


@pytest.mark.parametrize(("args", "message"), [
    (["--port", "65536"], "argument --port: 65536: a TCP port is at most 65535"),
    (["--rest_api_port", "70000"], "argument --rest_api_port: 70000: a TCP port is at most 65535"),
    (["--grpc-port", "70000"], "argument --grpc-port: 70000: a TCP port is at most 65535"),  # not 70000 - 65536
    (["--poll-seconds", "nan"], "argument --poll-seconds/--file_system_poll_wait_seconds: nan: must be a finite number"),
])
def test_serve_refuses_ports_beyond_tcp_and_waits_that_are_not_numbers(tmp_path, capsys, args, message):
    import hvdk8s.cli

    with pytest.raises(SystemExit):
        hvdk8s.cli.main(["serve", str(tmp_path), *args])
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--batching_parameters_file", "--monitoring_config_file", "--model_config_file"])
def test_serve_refuses_a_config_file_it_cannot_read_naming_the_flag_and_file(tmp_path, capsys, flag):
    import hvdk8s.cli

    models = [str(tmp_path)] if flag != "--model_config_file" else []
    binary = tmp_path / "config.txt"
    binary.write_bytes(b"max_batch_size { value: 8 }\n\xff\xfe")
    for path, why in ((binary, "not UTF-8 text (byte 28)"), (tmp_path / "missing.txt", "no such file"),
                      (tmp_path, "is a directory, not a file")):
        assert hvdk8s.cli.main(["serve", *models, flag, str(path)]) == 2
        assert f"{flag} {path}: {why}" in capsys.readouterr().err


def test_serve_runs_tensorflow_with_the_thread_counts_given(base_path, tmp_path):
    log = tmp_path / "serve.log"
    with running(base_path, log, "--tensorflow_intra_op_parallelism", "3", "--tensorflow_inter_op_parallelism", "2"):
        pass
    assert "TensorFlow threads (0: TensorFlow picks): intra-op 3, inter-op 2" in log.read_text()


def _decodable() -> str:
    """TensorFlow's own list of the formats ``decode_image`` takes, from its refusal of a non-image."""
    import tensorflow as tf

    with pytest.raises(tf.errors.InvalidArgumentError) as refused:
        tf.io.decode_image(b"not an image")
    return refused.value.message.partition("One of ")[2]


@pytest.mark.parametrize("data", [b"not an image", b"RIFF\0\0\0\0WEBPVP8 ", b"", b"\x89PNG\r\n\x1a\nxx", b"GIF8xx"])
def test_image_bytes_refused_before_tensorflow_in_tensorflows_own_words(base_path, data):
    """What the check refuses, the signature refuses with the same message; what it lets through goes on to it."""
    servable = load_servable(1, base_path / "1")
    arrays = {"image_bytes": np.array([data], dtype=object)}
    with pytest.raises(ServingError) as by_tensorflow:
        servable.run("serving_default", arrays)
    try:
        servable.check("serving_default", arrays)
    except ServingError as by_check:
        assert (by_check.code, by_check.message) == (by_tensorflow.value.code, by_tensorflow.value.message)
    else:  # a format this TensorFlow decodes (WebP from 2.19 on): only decoding tells it is broken
        assert data.startswith((b"\x89PNG", b"GIF8")) or (data.startswith(b"RIFF") and "WebP" in _decodable())
    servable.check("predict_tensor", {"images": np.zeros((1, 28, 28, 1), "float32")})  # other signatures: unchecked


def test_a_valid_image_leaves_no_image_error_in_the_servers_log(base_path, tmp_path, monkeypatch):
    """Issue #37: every server's first request logged TensorFlow's "Unknown image file format" (the server's own
    probe of the formats TensorFlow decodes), and its exit "ABORTED: Shutdown", though only a PNG was sent.
    With TensorFlow's warnings on, as ``hvdk8s --verbose`` has them."""
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")
    log = tmp_path / "serve.log"
    with running(base_path, log) as served:
        prediction = rest_client.predict(served.url, [loadtest.digits_png(1)[0]])
    assert len(prediction[0]["probabilities"]) == 10
    text = log.read_text()
    assert "TensorFlow threads" in text  # the log is the server's
    assert "Unknown image file format" not in text and "local_rendezvous" not in text, text


def _start(*args: str) -> tuple[subprocess.Popen, str]:
    """``hvdk8s serve ARGS`` and its first line (printed once the models' first scan is done)."""
    proc = subprocess.Popen([*CLI, "serve", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, proc.stdout.readline()


def _stop(proc: subprocess.Popen) -> str:
    proc.terminate()
    return proc.communicate(timeout=30)[1]


def test_port_0_gives_grpc_a_free_port_too_and_says_which(base_path):
    """Issue #28: with --port 0 gRPC still took the fixed 8500, and failed when it was taken."""
    with socket.socket() as taken:
        try:
            taken.bind(("127.0.0.1", 8500))
        except OSError:
            pass  # taken already: the same test
        proc, line = _start(str(base_path), "--port", "0")
        try:
            assert " grpc 127.0.0.1:" in line, _stop(proc)
            grpc_port = int(line.split(" grpc 127.0.0.1:")[1].split()[0])
            assert grpc_port != 8500
            with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
                request = get_model_status_pb2.GetModelStatusRequest()
                request.model_spec.name = "digits"
                status = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(request, timeout=30)
                request.model_spec.version_label = "canary"  # ignored, as get_model_status_impl.cc ignores it
                by_label = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(request, timeout=30)
            assert [v.version for v in status.model_version_status] == [1]
            assert by_label == status
            # a second server on that gRPC port is refused, not given a share of it (SO_REUSEPORT)
            second = subprocess.run([*CLI, "serve", str(base_path), "--port", "0", "--grpc-port", str(grpc_port)],
                                    capture_output=True, text=True, timeout=120)
            assert second.returncode == 2, second.stderr
            assert f"cannot listen on 127.0.0.1:{grpc_port} for gRPC" in second.stderr
        finally:
            _stop(proc)


def test_an_empty_model_directory_says_no_version_is_there_yet_and_where_it_looks(tmp_path):
    """Issue #28: serve on an empty base path waited silently."""
    empty = tmp_path / "digits"
    empty.mkdir()
    proc, line = _start(str(empty), "--port", "0")
    err = _stop(proc)
    assert "serving model 'digits'" in line
    assert (f"model digits: {empty} has no version folder yet; waiting for a version folder named by an integer "
            f"(e.g. {empty / '1'}) holding a SavedModel") in err


@pytest.mark.parametrize(
    "argv, ports",
    [
        (["BASE"], (8501, None)),
        (["BASE", "--port", "0"], (0, None)),  # gRPC then also on any free port (app.serve)
        (["BASE", "--rest_api_port", "9001", "--grpc-port", "9000"], (9001, 9000)),
        # tensorflow_model_server's command line: --port is gRPC
        (["--model_base_path=BASE", "--model_name=m", "--port=9000", "--rest_api_port=9001"], (9001, 9000)),
        (["--model_config_file=FILE"], (8501, None)),
    ],
)
def test_ports_from_hvdk8s_and_tf_serving_flags(argv, ports):
    import hvdk8s.cli
    from hvdk8s.serving.cli import serve_ports

    assert serve_ports(hvdk8s.cli.build_parser().parse_args(["serve", *argv])) == ports


def test_loaded_models_are_frozen_out_of_the_cyclic_collector(base_path):
    """Issue #26: full collections walked the model's ~355k objects (a ~250 ms stall) 1-2 times every 6 s."""
    core = ServingCore(ModelRepository(base_path, "digits"), batching=None)
    app = create_app(core, poll_seconds=60)

    async def started() -> tuple[int, int]:
        async with app.router.lifespan_context(app):
            return gc.get_freeze_count(), len(gc.get_objects())

    try:
        frozen, tracked = asyncio.run(started())
    finally:
        gc.unfreeze()
        core.close()
    assert frozen > 50_000 and tracked < frozen / 10, (frozen, tracked)  # the model is frozen, little is left


def test_a_model_call_past_the_rest_api_timeout_answers_deadline_exceeded():
    """--rest_api_timeout_in_ms: the REST answer is 504 DEADLINE_EXCEEDED (the call itself is left to finish)."""
    async def wait_for_a_call_that_never_ends() -> None:
        await _within(asyncio.get_running_loop().create_future(), 0.01)

    with pytest.raises(ServingError) as err:
        asyncio.run(wait_for_a_call_that_never_ends())
    assert (err.value.code, err.value.http_status) == ("DEADLINE_EXCEEDED", 504)
    assert "no answer within 10 ms (--rest_api_timeout_in_ms)" in err.value.message
