"""TensorFlow Serving's REST contract (serving/rest.py): pure conversions, no TensorFlow."""
from __future__ import annotations

import base64
import json
import subprocess
import sys

import numpy as np
import pytest

from hvdk8s.serving import rest
from hvdk8s.serving.rest import InputSpec, ServingError

IMAGE = {"image_bytes": InputSpec(np.dtype(object), (None,))}
TWO = {"a": InputSpec(np.dtype("float32"), (None, 2)), "b": InputSpec(np.dtype("int64"), (None,))}


def body(doc) -> bytes:
    return json.dumps(doc).encode()


def specs_for(specs):
    def inputs_of(signature: str):
        if signature != "serving_default":
            raise rest.invalid(f'Serving signature name: "{signature}" not found in signature def')
        return specs

    return inputs_of


@pytest.mark.parametrize(
    "method, path, expected",
    [
        ("POST", "/v1/models/digits:predict", rest.Route("predict", "digits", None)),
        ("POST", "/v1/models/digits/versions/12:predict", rest.Route("predict", "digits", 12)),
        ("GET", "/v1/models/digits", rest.Route("status", "digits", None)),
        ("GET", "/v1/models/digits/versions/3", rest.Route("status", "digits", 3)),
        ("GET", "/v1/models/digits/metadata", rest.Route("metadata", "digits", None)),
        ("GET", "/v1/models/digits/versions/3/metadata", rest.Route("metadata", "digits", 3)),
    ],
)
def test_paths_follow_tf_serving(method, path, expected):
    assert rest.parse_path(method, path) == expected


@pytest.mark.parametrize(
    "method, path, status, message",
    [
        ("GET", "/v1/models/digits:predict", 400, "Malformed request: GET /v1/models/digits:predict"),
        ("POST", "/v1/models/digits", 400, "Malformed request: POST /v1/models/digits"),
        ("GET", "/v1/models", 400, "Missing model name in request."),
        ("POST", "/v1/models/digits:classify", 501, "classify is not implemented"),
    ],
)
def test_bad_paths(method, path, status, message):
    with pytest.raises(ServingError) as err:
        rest.parse_path(method, path)
    assert err.value.http_status == status and message in err.value.message


def test_instances_of_b64_images_become_a_bytes_batch():
    images = [b"\x89PNG first", b"\xff\xd8 second"]
    doc = {"instances": [{"b64": base64.b64encode(i).decode()} for i in images]}
    signature, arrays, row = rest.parse_predict_body(body(doc), specs_for(IMAGE))
    assert (signature, row) == ("serving_default", True)
    assert arrays["image_bytes"].shape == (2,) and arrays["image_bytes"].tolist() == images


def test_named_instances_and_columnar_inputs_agree():
    rows = {"instances": [{"a": [1.5, 2], "b": 7}, {"a": [3, 4.25], "b": -1}]}
    cols = {"inputs": {"a": [[1.5, 2], [3, 4.25]], "b": [7, -1], "ignored": 1}}
    _, from_rows, row = rest.parse_predict_body(body(rows), specs_for(TWO))
    _, from_cols, columnar = rest.parse_predict_body(body(cols), specs_for(TWO))
    assert row and not columnar
    for arrays in (from_rows, from_cols):
        np.testing.assert_array_equal(arrays["a"], np.array([[1.5, 2], [3, 4.25]], dtype="float32"))
        assert arrays["a"].dtype == np.float32 and arrays["b"].dtype == np.int64
        assert arrays["b"].tolist() == [7, -1]


@pytest.mark.parametrize(
    "doc, specs, message",
    [
        ({"instances": []}, IMAGE, "No values in 'instances' array"),
        ({"inputs": []}, IMAGE, "No values in 'inputs'"),
        ({"instances": [{"b64": "not base64!"}]}, IMAGE, "Unable to base64 decode"),
        ({"instances": [{"image": {"b64": "AAAA"}}]}, IMAGE, "keys must be equal to: image_bytes"),
        ({"inputs": {"image": [{"b64": "AAAA"}]}}, IMAGE, "Missing named input: image_bytes"),
        ({"instances": [1.5]}, IMAGE, "is not of expected type: DT_STRING"),
        ({"instances": [{"a": [1, 2], "b": 1.5}]}, TWO, "is not of expected type: DT_INT64"),
        ({"instances": [{"a": [1, 2], "b": 1}, {"a": [1, 2, 3], "b": 1}]}, TWO, "different shapes"),
        ({"inputs": {"a": [[1, 2], [3]], "b": [1, 2]}}, TWO, "unexpected size: 1 at level: 1"),
        ({"inputs": {"a": [1, 2], "b": [1, 2]}}, TWO, "input a: got shape (2,), the signature expects (-1, 2)"),
        ({"instances": [[1.0, 2.0]]}, TWO, "expecting list of objects"),
        ({"instances": [1], "inputs": [1]}, IMAGE, "only one of 'inputs' or 'instances'"),
        ({"signature_name": "other", "instances": ["x"]}, IMAGE, 'signature name: "other" not found'),
        ({"signature_name": 3, "instances": ["x"]}, IMAGE, "'signature_name' key must be a string"),
        ({"rows": []}, IMAGE, "Missing 'inputs' or 'instances' key"),
        ([1, 2], IMAGE, "Is not object"),
    ],
)
def test_invalid_bodies_are_invalid_argument(doc, specs, message):
    with pytest.raises(ServingError) as err:
        rest.parse_predict_body(body(doc), specs_for(specs))
    assert (err.value.code, err.value.http_status) == ("INVALID_ARGUMENT", 400)
    assert message in err.value.message


def test_unparseable_json():
    for raw in (b"", b"{not json", b"\xff\xfe"):
        with pytest.raises(ServingError, match="JSON Parse error"):
            rest.parse_predict_body(raw, specs_for(IMAGE))


def test_row_and_columnar_responses():
    outputs = {
        "probabilities": np.array([[0.1, 0.9], [0.75, 0.25]], dtype="float32"),
        "classes": np.array([1, 0], dtype="int64"),
        "class_names": np.array([b"cat", b"dog"], dtype=object),
    }
    assert rest.predict_response(outputs, row=True) == {
        "predictions": [
            {"class_names": "cat", "classes": 1, "probabilities": [0.1, 0.9]},
            {"class_names": "dog", "classes": 0, "probabilities": [0.75, 0.25]},
        ]
    }
    assert rest.predict_response(outputs, row=False) == {
        "outputs": {"class_names": ["cat", "dog"], "classes": [1, 0], "probabilities": [[0.1, 0.9], [0.75, 0.25]]}
    }
    single = {"scores": np.array([[1.0], [2.0]], dtype="float32")}
    assert rest.predict_response(single, row=True) == {"predictions": [[1.0], [2.0]]}
    assert rest.predict_response(single, row=False) == {"outputs": [[1.0], [2.0]]}


def test_bytes_outputs_are_base64_and_floats_shortest():
    doc = rest.predict_response({"thumb_bytes": np.array([b"\x00\xff"], dtype=object)}, row=True)
    assert doc == {"predictions": [{"b64": "AP8="}]}
    # float32 0.1 prints as 0.1 (TF Serving's shortest round-trip form), not 0.10000000149011612
    doc = rest.predict_response({"p": np.array([0.1], dtype="float32")}, row=False)
    assert rest.dumps(doc) == b'{"outputs": [0.1]}'


def test_outputs_without_common_batch_are_rejected():
    with pytest.raises(ServingError, match="no common batch dimension"):
        rest.predict_response({"a": np.zeros((2, 3)), "b": np.zeros((3,))}, row=True)


def test_status_and_metadata_documents():
    assert rest.status_response([(1, "END", "OK", ""), (2, "AVAILABLE", "OK", "")]) == {
        "model_version_status": [
            {"version": "2", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}},
            {"version": "1", "state": "END", "status": {"error_code": "OK", "error_message": ""}},
        ]
    }
    doc = rest.metadata_response("digits", 2, {"serving_default": {"method_name": "tensorflow/serving/predict"}})
    assert doc["model_spec"] == {"name": "digits", "signature_name": "", "version": "2"}
    assert doc["metadata"]["signature_def"]["signature_def"]["serving_default"]["method_name"] == (
        "tensorflow/serving/predict"
    )


def test_importing_the_package_and_its_cli_stays_light():
    """`hvdk8s serving-manifests` and `hvdk8s predict` must not pay for TensorFlow or the web server."""
    code = (
        "import sys, hvdk8s.serving, hvdk8s.serving.cli, hvdk8s.serving.client; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'tensorflow', 'keras', 'starlette', 'uvicorn'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
