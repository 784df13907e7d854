"""``hvdk8s serve`` over real HTTP keep-alive connections: TF Serving's answers, limits, no resets.

Each row sends one request on a connection that has already served a good
request, checks status, JSON error text (TF Serving's words, source cited)
or, for a 200 answer, that it equals the answer to the request TF Serving
treats it as, and that the same connection then serves a good request again.
"""
from __future__ import annotations

import base64
import http.client
import json
import socket
import threading
import time
from pathlib import Path

import pytest

from hvdk8s.serving.clients import loadtest
from hvdk8s.serving.server.process import running

from serving_models import export_untrained

LIMIT = 300_000
PNG = loadtest.digits_png(1)[0]
GOOD = json.dumps({"instances": [{"b64": base64.b64encode(PNG).decode()}]}).encode()
PREDICT = "/v1/models/digits:predict"
STATUS = "/v1/models/digits"
# A 200 row's answer must equal the answer to one of these requests, sent on the same connection right after it
AS_GOOD = ("POST", PREDICT, GOOD)  # the same image's predictions, bit for bit (same model, same batch of one)
AS_STATUS = ("GET", STATUS, None)  # every version's status


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("models") / "digits"
    export_untrained(base)
    return base


@pytest.fixture(scope="module")
def server(exported):
    with running(exported, exported.parent / "stderr.log", "--max-request-bytes", str(LIMIT)) as srv:
        yield srv


def connect(server) -> http.client.HTTPConnection:
    host, port = server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.connect()
    return conn


def send(conn: http.client.HTTPConnection, method: str, path: str, body: bytes | None = None, headers=None):
    """(status, JSON document, the server asked to close?) on this connection, which must not be replaced."""
    sock = conn.sock
    conn.request(method, path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
    response = conn.getresponse()
    raw = response.read()
    assert conn.sock is sock, "the connection was closed and reopened"
    doc = json.loads(raw) if method != "HEAD" else None
    assert response.getheader("content-type") == "application/json"
    return response.status, doc, response.will_close


def b64_lines(data: bytes) -> str:
    return base64.encodebytes(data).decode()  # MIME style: a line break every 76 characters


ROWS = [
    # (id, method, path, body, status, error substring or, for 200, the request (method, path, body) whose answer
    # it must equal)  -- TF Serving source in comments
    # json_tensor.cc ParseJson: RapidJSON refuses numbers beyond double range
    ("float-beyond-double", "POST", "/v1/models/digits/versions/1:predict",
     b'{"signature_name": "predict_tensor", "instances": [[[[1e400]]]]}', 400, "Number too big to be stored in double"),
    ("400-digit-int", "POST", PREDICT, b'{"instances": [' + b"9" * 400 + b"]}", 400, "Number too big"),
    ("100000-deep", "POST", PREDICT, b'{"instances": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400,
     "nested deeper than 128 levels"),
    ("huge-body", "POST", PREDICT, b'{"instances": ["' + b"A" * (LIMIT + 10) + b'"]}', 413,
     f"exceeds the limit of {LIMIT} bytes"),
    ("not-json", "POST", PREDICT, b"instances = [1, 2]", 400, "JSON Parse error"),
    ("not-utf8", "POST", PREDICT, b"\xff\xfe{}", 400, "JSON Parse error"),
    ("not-an-image", "POST", PREDICT, b'{"instances": [{"b64": "AAAA"}]}', 400, "Unknown image file format"),
    # absl::Base64Unescape skips whitespace and needs no padding
    ("b64-line-breaks", "POST", PREDICT, json.dumps({"instances": [{"b64": b64_lines(PNG)}]}).encode(), 200,
     AS_GOOD),
    # (the PNG decoder ignores the byte after IEND that makes the encoding need padding)
    ("b64-no-padding", "POST", PREDICT,
     json.dumps({"instances": [{"b64": base64.b64encode(PNG + b"\0").decode().rstrip("=")}]}).encode(), 200,
     AS_GOOD),
    # classifier.cc / regressor.cc on a predict signature (default: no method-name check)
    ("classify", "POST", "/v1/models/digits:classify", b'{"examples": [{"x": 1}]}', 400,
     "Expected one or two output Tensors, found 3"),
    ("regress", "POST", "/v1/models/digits:regress", b'{"examples": [{"x": 1}]}', 400,
     "Expected one output Tensor."),
    ("classify-no-examples", "POST", "/v1/models/digits:classify", b'{"instances": [1]}', 400,
     "When method is classify, key 'examples' is expected and was not found"),
    # server_core.cc GetModelVersionForLabel: no labels without a model config file
    ("label-predict", "POST", "/v1/models/digits/labels/stable:predict", GOOD, 400,
     "Unrecognized servable version label: stable"),
    # get_model_status_impl.cc GetModelStatusWithModelSpec reads only the spec's version: every version, by any label
    # (http_rest_api_handler_test.cc GetStatus expects the label's answer to be the plain one)
    ("label-status", "GET", "/v1/models/digits/labels/canary", None, 200, AS_STATUS),
    # http_rest_api_util.cc ParseModelInfo: versions beyond int64
    ("version-beyond-int64", "POST", "/v1/models/digits/versions/99999999999999999999:predict", GOOD, 400,
     "Failed to convert version: 99999999999999999999 to numeric."),
    ("version-missing", "POST", "/v1/models/digits/versions/7:predict", GOOD, 404,
     "Servable not found for request: Specific(digits, 7)"),
    # http_rest_api_handler.cc: other methods are malformed requests (400 JSON, not 405 text)
    ("put", "PUT", "/v1/models/digits", b"{}", 400, "Malformed request: PUT /v1/models/digits"),
    ("delete", "DELETE", "/v1/models/digits", None, 400, "Malformed request: DELETE /v1/models/digits"),
    ("get-predict", "GET", PREDICT, None, 400, "Malformed request: GET /v1/models/digits:predict"),
    # http_server.cc: OPTIONS is a CORS preflight that needs an Origin header
    ("options", "OPTIONS", "/v1/models/digits", None, 400, "Origin header is missing in CORS preflight"),
    # kHTTPRestApiHandlerPathRegex "(?i)/v1/.*": case-insensitive
    ("upper-case-path", "POST", "/V1/MODELS/digits:PREDICT", GOOD, 200, AS_GOOD),
    ("outside-v1", "GET", "/healthz", None, 404, "Not found: /healthz"),
    ("signature-not-string", "POST", PREDICT, b'{"signature_name": 100, "instances": [1]}', 400,
     "'signature_name' key must be a string value."),
]


@pytest.fixture(scope="module")
def conn(server):
    conn = connect(server)
    yield conn
    conn.close()


@pytest.mark.parametrize("method, path, body, status, expected", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_tf_serving_answers_and_the_connection_survives(conn, method, path, body, status, expected):
    got, doc, closing = send(conn, method, path, body)
    assert (got, closing) == (status, False), doc
    if isinstance(expected, str):
        assert expected in doc["error"], doc
    else:
        reference_status, reference, _ = send(conn, *expected)
        assert reference_status == 200, reference
        assert doc == reference
    assert send(conn, "POST", PREDICT, GOOD)[0] == 200


def test_the_references_are_real_answers(conn):
    """What the 200 rows are compared with: one prediction of ten probabilities; version 1's status."""
    status, doc, _ = send(conn, *AS_GOOD)
    assert status == 200 and len(doc["predictions"]) == 1 and len(doc["predictions"][0]["probabilities"]) == 10, doc
    status, doc, _ = send(conn, *AS_STATUS)
    assert (status, doc) == (200, {"model_version_status": [
        {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}]})


def test_empty_inputs_go_to_the_model_which_answers(conn, exported):
    """FillTensorMapFromInputsMap: ``"inputs": []`` is a [0]-shaped tensor that goes to the model, and its answer,
    outputs or TensorFlow's own error, is TF Serving's. Which of the two depends on the CPU's convolution kernels
    (an empty batch ran on AMD EPYC's; Intel Xeon's refused it: 'input depth must be evenly divisible by
    filter'), so the signature itself, run here, says what the server must answer."""
    import tensorflow as tf

    signature = tf.saved_model.load(str(exported / "1")).signatures["serving_default"]
    try:
        direct = {k: v.numpy().tolist() for k, v in signature(image_bytes=tf.zeros([0], tf.string)).items()}
    except tf.errors.InvalidArgumentError as err:
        status, doc, closing = send(conn, "POST", PREDICT, b'{"inputs": []}')
        assert (status, closing) == (400, False), doc
        assert err.message.splitlines()[0] in doc["error"], doc
    else:
        status, doc, closing = send(conn, "POST", PREDICT, b'{"inputs": []}')
        assert (status, closing) == (200, False), doc
        assert doc == {"outputs": {k: [] for k in direct}}, doc
        assert all(v == [] for v in direct.values()), direct
    assert send(conn, "POST", PREDICT, GOOD)[0] == 200


def test_head_and_cors_preflight_with_origin(conn):
    assert send(conn, "OPTIONS", "/v1/models/digits", None, {"Origin": "http://example.test"})[0] == 200
    assert send(conn, "HEAD", "/v1/models/digits")[0] == 400


def test_mixed_good_and_malformed_load_has_no_unexpected_errors_or_resets(server):
    """4 keep-alive clients x 60 requests cycling through every row: each gets its row's status, on one socket."""
    failures: list[str] = []

    def client(offset: int) -> None:
        conn = connect(server)
        try:
            for i in range(60):
                name, method, path, body, status, _ = ROWS[(offset + i) % len(ROWS)]
                got = send(conn, method, path, body)
                if (got[0], got[2]) != (status, False):
                    failures.append(f"{name}: {got}")
        except Exception as err:  # noqa: BLE001  (a reset or a reconnect is the failure looked for)
            failures.append(f"client {offset}: {type(err).__name__}: {err}")
        finally:
            conn.close()

    threads = [threading.Thread(target=client, args=(k * 5,), daemon=True) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    stuck = [t.name for t in threads if t.is_alive()]
    assert stuck == [], f"clients still running after 120 s: {stuck}; failures so far: {failures}"
    assert failures == []


def test_a_client_gone_before_its_whole_body_is_one_log_line_and_the_server_answers_on(server, exported):
    """Content-Length 100000, 10 bytes sent, then the connection closed: one warning naming the client, no
    traceback (Starlette's ClientDisconnect), and the next request is answered."""
    log = exported.parent / "stderr.log"
    start = log.stat().st_size
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(f"POST {PREDICT} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                     "Content-Length: 100000\r\n\r\n".encode() + GOOD[:10])
        client = "{}:{}".format(*sock.getsockname())
    deadline = time.monotonic() + 30
    while "closed the connection" not in (logged := log.read_bytes()[start:].decode()) and time.monotonic() < deadline:
        time.sleep(0.1)
    lines = logged.splitlines()
    assert "Traceback" not in logged and len(lines) == 1 and lines[0].endswith(
        f" hvdk8s.serving WARNING POST {PREDICT}: {client} closed the connection before sending the whole "
        "request body"), logged
    conn = connect(server)
    try:
        assert send(conn, "POST", PREDICT, GOOD)[0] == 200
    finally:
        conn.close()
