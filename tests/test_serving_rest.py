"""TensorFlow Serving's REST contract (serving/api/rest.py): pure conversions, no TensorFlow."""
from __future__ import annotations

import base64
import json
import subprocess
import sys

import numpy as np
import pytest

from hvdk8s.serving.api import classify_regress, rest
from hvdk8s.serving.api.types import InputSpec, ServingError, invalid

IMAGE = {"image_bytes": InputSpec(np.dtype(object), (None,))}
TWO = {"a": InputSpec(np.dtype("float32"), (None, 2)), "b": InputSpec(np.dtype("int64"), (None,))}


def body(doc) -> bytes:
    return json.dumps(doc).encode()


def specs_for(specs):
    def inputs_of(signature: str):
        if signature != "serving_default":
            raise invalid(f'Serving signature name: "{signature}" not found in signature def')
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
        # kPredictionApiGegex / kModelStatusApiRegex: case-insensitive, /labels/{label}, :classify, :regress
        ("POST", "/V1/Models/digits/labels/stable:Predict", rest.Route("predict", "digits", None, "stable")),
        ("GET", "/v1/models/digits/labels/canary/metadata", rest.Route("metadata", "digits", None, "canary")),
        ("POST", "/v1/models/digits:classify", rest.Route("classify", "digits", None)),
        ("POST", "/v1/models/digits/versions/2:regress", rest.Route("regress", "digits", 2)),
        ("GET", f"/v1/models/digits/versions/{2**63 - 1}", rest.Route("status", "digits", 2**63 - 1)),
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
        # http_rest_api_util.cc ParseModelInfo: absl::SimpleAtoi into int64
        ("POST", f"/v1/models/digits/versions/{2**63}:predict", 400, f"Failed to convert version: {2**63} to"),
        ("GET", "/v1/models/digits/versions/" + "9" * 40, 400, "Failed to convert version: 9999"),
        # http_rest_api_handler.cc: any other method is a malformed request
        ("PUT", "/v1/models/digits", 400, "Malformed request: PUT /v1/models/digits"),
        ("DELETE", "/v1/models/digits/versions/1", 400, "Malformed request: DELETE /v1/models/digits/versions/1"),
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
        ({"instances": [{"b64": "not base64!"}]}, IMAGE, "Unable to base64 decode"),
        ({"instances": [{"b64": "QUJD-_"}]}, IMAGE, "Unable to base64 decode"),  # web-safe alphabet: not standard
        ({"instances": [{"image": {"b64": "AAAA"}}]}, IMAGE, "keys must be equal to: image_bytes"),
        ({"inputs": {"image": [{"b64": "AAAA"}]}}, IMAGE, "Missing named input: image_bytes"),
        ({"instances": [1.5]}, IMAGE, "JSON Value: 1.5 Type: Number is not of expected type: string"),
        ({"instances": [{"a": [1, 2], "b": 1.5}]}, TWO, "Type: Number is not of expected type: int64"),
        ({"instances": [{"a": [1, "x"], "b": 1}]}, TWO, "Type: String is not of expected type: float"),
        # RapidJSON: an integer beyond uint64 is a double, so not an int64
        ({"instances": [{"a": [1, 2], "b": 2**64}]}, TWO, "is not of expected type: int64"),
        ({"instances": [{"a": [1, 2], "b": 2**63}]}, TWO, "is not of expected type: int64"),
        ({"instances": [{"a": [1, 2], "b": 1}, {"a": [1, 2, 3], "b": 1}]}, TWO, "different shapes"),
        ({"inputs": {"a": [[1, 2], [3]], "b": [1, 2]}}, TWO, "unexpected size: 1 at level: 1"),
        ({"instances": [[1.0, 2.0]]}, TWO, "expecting list of objects"),
        ({"instances": [1], "inputs": [1]}, IMAGE, "only one of 'inputs' or 'instances'"),
        ({"signature_name": "other", "instances": ["x"]}, IMAGE, 'signature name: "other" not found'),
        ({"signature_name": 3, "instances": ["x"]}, IMAGE, "JSON Value: 3 not formatted correctly. 'signature_name' key "
         "must be a string value."),
        ({"rows": []}, IMAGE, "Missing 'inputs' or 'instances' key"),
        ([1, 2], IMAGE, "Is not object"),
    ],
)
def test_invalid_bodies_are_invalid_argument(doc, specs, message):
    with pytest.raises(ServingError) as err:
        rest.parse_predict_body(body(doc), specs_for(specs))
    assert (err.value.code, err.value.http_status) == ("INVALID_ARGUMENT", 400)
    assert message in err.value.message


@pytest.mark.parametrize(
    "raw, message",
    [
        (b"", "JSON Parse error: The document is empty"),
        # RapidJSON's own words (GetParseError_En) and the offset, as json_tensor.cc ParseJson reports them
        (b"{not json", "JSON Parse error: Missing a name for object member. at offset: 1"),
        (b"instances = [1, 2]", "JSON Parse error: Invalid value. at offset: 0"),
        (b'{"instances": [1 2]}', "JSON Parse error: Missing a comma or ']' after an array element. at offset: 17"),
        (b'{"instances": [1] "x"}', "JSON Parse error: Missing a comma or '}' after an object member. at offset: 18"),
        (b'{"instances" [1]}', "JSON Parse error: Missing a colon after a name of object member. at offset: 13"),
        (b'{"instances": ["x', "JSON Parse error: Missing a closing quotation mark in string. at offset: 15"),
        (b"\xff\xfe", "JSON Parse error: Invalid encoding in string. at offset: 0"),
        # RapidJSON (json_tensor.cc ParseJson) refuses numbers beyond double range; Python would give inf
        (b'{"instances": [[1e400]]}', "JSON Parse error: Number too big to be stored in double"),
        (b'{"instances": [[-1e400]]}', "JSON Parse error: Number too big to be stored in double"),
        (b'{"instances": [[' + b"9" * 400 + b"]]}", "JSON Parse error: Number too big to be stored in double"),
        (b'{"instances": [[' + b"9" * 5000 + b"]]}", "Number too big"),  # refused before any conversion
        (b'{"instances": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "the document is nested deeper than 128 levels"),
        (b'{"instances": ' + b"[" * 128 + b"]" * 128 + b"}", "the document is nested deeper than 128 levels"),
        (b'{"instances": ' + b"[" * 100 + b"1.5" + b"]" * 100 + b"}", "lists nested deeper than 64 levels"),
    ],
)
def test_unparseable_json_and_numbers_beyond_limits(raw, message):
    specs = {"x": InputSpec(np.dtype("float32"), None)}
    with pytest.raises(ServingError) as err:
        rest.parse_predict_body(raw, lambda _: specs)
    assert err.value.http_status == 400 and message in err.value.message


def test_brackets_inside_strings_do_not_count_as_nesting():
    text = "[" * 200 + '\\"{' * 100 + "]"
    _, arrays, _ = rest.parse_predict_body(body({"instances": [text, "x"]}), specs_for(IMAGE))
    assert arrays["image_bytes"].tolist() == [text.encode(), b"x"]


ENOUGH_BRACKETS = b"[]," * (rest.MAX_JSON_DEPTH + 1)  # more than MAX_JSON_DEPTH "[": the depth scan runs
ESCAPED_QUOTES = b'\\"' * 200_000  # every quote would restart a failing string match to the end: ~10^11 steps


@pytest.mark.parametrize(
    "raw, message",
    [
        # RapidJSON stops after the first document (json_tensor.cc: kParseStopWhenDoneFlag): `[]` is not an object
        (ENOUGH_BRACKETS.replace(b",", b"") + b'"' + ESCAPED_QUOTES, "JSON Value: [] Is not object"),
        (b'{"instances": [' + ENOUGH_BRACKETS + b'"' + ESCAPED_QUOTES,
         "JSON Parse error: Missing a closing quotation mark in string. at offset: "),
        (b'{"instances": [' + ENOUGH_BRACKETS + b'"' + ESCAPED_QUOTES + b"\\",
         "JSON Parse error: Missing a closing quotation mark in string. at offset: "),
        (b'{"instances": [' + ENOUGH_BRACKETS + b'"' + ESCAPED_QUOTES + b'\\\n"]]}',  # `\` + newline: not `.`
         "JSON Parse error: Invalid escape character in string. at offset: "),
    ],
    ids=["not-object", "unterminated", "trailing-backslash", "backslash-newline"],
)
def test_unterminated_string_after_many_brackets_is_refused_in_one_pass(raw, message):
    """The depth scan is linear: before, each of these took minutes of regex backtracking under the GIL."""
    with pytest.raises(ServingError) as err:
        rest._parse_json(raw)
    assert err.value.http_status == 400 and err.value.message.startswith(message)


def test_json_numbers_read_as_tf_serving_reads_them():
    """NaN/Infinity literals are accepted (kParseNanAndInfFlag); long integers become doubles."""
    specs = {"x": InputSpec(np.dtype("float32"), (None,))}
    doc = b'{"inputs": [NaN, Infinity, -Infinity, 1e38, 123456789012345678901234567890]}'
    _, arrays, _ = rest.parse_predict_body(doc, lambda _: specs)
    np.testing.assert_array_equal(arrays["x"], np.array([np.nan, np.inf, -np.inf, 1e38, 1.2345679e29], "float32"))


@pytest.mark.parametrize(
    "text",
    ["QUJD\nREVG", "QUJDREVG\r\n", "QU JD RE VG", "QUJDREU", "QUJDRQ"],  # line breaks, spaces, no padding
)
def test_base64_as_absl_reads_it(text):
    """absl::Base64Unescape (json_tensor.cc) skips whitespace and needs no padding."""
    expected = base64.b64decode(text.replace("\n", "").replace("\r", "").replace(" ", "") + "==")
    _, arrays, _ = rest.parse_predict_body(body({"instances": [{"b64": text}]}), specs_for(IMAGE))
    assert arrays["image_bytes"].tolist() == [expected]


def test_empty_inputs_is_an_empty_batch():
    """``"inputs": []`` is a tensor of shape [0] for TF Serving (FillTensorMapFromInputsMap), not an error."""
    _, arrays, row = rest.parse_predict_body(body({"inputs": []}), specs_for(IMAGE))
    assert not row and arrays["image_bytes"].shape == (0,)
    _, arrays, _ = rest.parse_predict_body(body({"inputs": {"image_bytes": []}}), specs_for(IMAGE))
    assert arrays["image_bytes"].shape == (0,)
    empty = {"probabilities": np.zeros((0, 10), "float32"), "classes": np.zeros((0,), "int64")}
    assert rest.predict_response(empty, row=False) == {"outputs": {"classes": [], "probabilities": []}}


CLASSIFY_SIG = {"method_name": "tensorflow/serving/classify", "inputs": {"inputs": {}},
                "outputs": {"classes": {}, "scores": {}}}


@pytest.mark.parametrize(
    "api, doc, signature_defs, status, message",
    [
        # json_tensor.cc FillClassifyRegressRequestFromJson (its message says classify for both APIs)
        ("regress", {"instances": [1]}, {}, 400, "When method is classify, key 'examples' is expected"),
        ("classify", {"examples": {}}, {}, 400, "Expecting 'examples' value to be an list/array"),
        ("classify", {"examples": []}, {}, 400, "'examples' value is an empty array"),
        # classifier.cc / regressor.cc PreProcess*, default --enable_signature_method_name_check=false
        ("classify", {"examples": [{"x": 1}]}, {"other": {}}, 400, "No signature was found with the name: serving_default"),
        ("classify", {"examples": [{"x": 1}]}, {"serving_default": {"inputs": {"image_bytes": {}}, "outputs": {
            "probabilities": {}, "classes": {}, "class_names": {}}}}, 400, "Expected one or two output Tensors, found 3"),
        ("regress", {"examples": [{"x": 1}]}, {"serving_default": {"inputs": {"image_bytes": {}}, "outputs": {
            "probabilities": {}, "classes": {}}}}, 400, "Expected one output Tensor."),
        ("regress", {"examples": [{"x": 1}]}, {"serving_default": CLASSIFY_SIG}, 400, "Expected one output Tensor."),
        # json_tensor.cc AddValueToFeature
        ("classify", {"examples": [{"x": [1, 2.5]}]}, {"serving_default": CLASSIFY_SIG}, 400,
         "Unexpected element type in feature: x expecting type: int64"),
        ("classify", {"examples": [{"x": None}]}, {"serving_default": CLASSIFY_SIG}, 400,
         "Feature: x has element with unexpected JSON type: Null"),
        ("classify", {"examples": [{"x": 2**63}]}, {"serving_default": CLASSIFY_SIG}, 400,
         "Feature: x has uint64_t element. Only int64_t is supported."),
        ("classify", {"examples": [3]}, {"serving_default": CLASSIFY_SIG}, 400,
         "Example must be JSON object but got JSON Number"),
    ],
)
def test_classify_and_regress_refuse_as_tf_serving(api, doc, signature_defs, status, message):
    with pytest.raises(ServingError) as err:
        signature, items, context = rest.parse_examples_body(body(doc))
        classify_regress.from_json(items, context)
        classify_regress.check_signature(api, signature, signature_defs)
    assert err.value.http_status == status and message in err.value.message


def test_json_examples_become_tf_examples_as_tf_serving_builds_them():
    from tensorflow.core.example import example_pb2

    signature, items, context = rest.parse_examples_body(body(
        {"signature_name": "s", "context": {"c": "ctx"},
         "examples": [{"f": 2.0, "i": [1, True], "b": {"b64": "AP8="}, "t": "text"}]}))
    assert signature == "s"
    (serialized,) = classify_regress.from_json(items, context)
    example = example_pb2.Example.FromString(serialized)  # the context's features merged into the example
    features = example.features.feature
    assert list(features["f"].float_list.value) == [2.0]
    assert list(features["i"].int64_list.value) == [1, 1]
    assert list(features["b"].bytes_list.value) == [b"\x00\xff"]
    assert list(features["t"].bytes_list.value) == [b"text"]
    assert list(features["c"].bytes_list.value) == [b"ctx"]


def test_classification_and_regression_results_as_tf_serving_shapes_them():
    scores = np.array([[0.25, 0.75]], dtype="float32")
    classes = np.array([[b"cat", b"dog"]], dtype=object)
    assert classify_regress.classifications({"scores": scores, "classes": classes}, 1) == [[("cat", 0.25), ("dog", 0.75)]]
    assert rest.classify_response(classify_regress.classifications({"scores": np.array([[3.1]], "float32")}, 1)) == {
        "results": [[["", 3.1]]]}  # no classes output: empty labels; float32 3.1 printed as 3.1
    assert rest.regress_response(classify_regress.regressions({"outputs": np.array([[42.0]], "float32")}, 1)) == {
        "results": [42.0]}
    with pytest.raises(ServingError, match=r"Expected output Tensor shape to be either \[batch_size\] or "
                                           r"\[batch_size, 1\] but got \[1,2\]"):
        classify_regress.regressions({"outputs": scores}, 1)
    with pytest.raises(ServingError, match="Expected scores output batch size of 2. Got: 1"):
        classify_regress.classifications({"scores": scores}, 2)


def test_predict_leaves_shapes_to_the_model_as_tf_serving_does():
    """TF Serving's REST predict builds the tensor from the JSON and lets the model judge its shape:
    ``[1.0, 2.0, 5.0]`` goes to an input of shape (-1, 1) as a (3,) tensor (http_rest_api_handler_test.cc's Predict)."""
    specs = {"x": InputSpec(np.dtype("float32"), (None, 1))}
    _, arrays, row = rest.parse_predict_body(body({"instances": [1.0, 2.0, 5.0]}), specs_for(specs))
    assert arrays["x"].shape == (3,) and row


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


@pytest.mark.parametrize(
    "outputs, message",
    [
        ({"a": np.zeros((2, 3)), "b": np.zeros((3,))}, "Tensor name: b has inconsistent batch size: 3 expecting: 2"),
        ({"a": np.zeros((2, 3)), "b": np.float32(1)}, "Tensor name: b has no shape information "),
        ({"scores": np.float32(1)}, "Tensor name: scores has no shape information "),
    ],
)
def test_outputs_without_common_batch_are_rejected_in_tf_serving_words(outputs, message):
    """util/json_tensor.cc MakeRowFormatJsonFromTensors (TF Serving 9d981c5c); the columnar format takes any."""
    with pytest.raises(ServingError) as err:
        rest.predict_response(outputs, row=True)
    assert (err.value.code, err.value.message) == ("INVALID_ARGUMENT", message)
    assert rest.predict_response(outputs, row=False)


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
        "import sys, hvdk8s.serving, hvdk8s.serving.cli, hvdk8s.serving.clients.rest_client; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'tensorflow', 'keras', 'starlette', 'uvicorn'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
