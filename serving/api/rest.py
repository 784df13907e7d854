"""TensorFlow Serving's REST contract as pure functions: paths, JSON to arrays, arrays to JSON.

Follows tensorflow_serving/model_servers/http_rest_api_util.cc and
util/json_tensor.cc: the same URL patterns, the row (``instances`` →
``predictions``) and columnar (``inputs`` → ``outputs``) formats,
``{"b64": ...}`` for binary strings and ``{"error": ...}`` bodies (the
errors, and their TensorFlow status codes' HTTP codes, are ``types``', shared
with gRPC). No TensorFlow import here: the server converts between these
NumPy arrays and tensors.
"""
from __future__ import annotations

import base64
import binascii
import contextlib
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from hvdk8s.serving.api import jsonfloat
from hvdk8s.serving.api.types import DEFAULT_SIGNATURE, InputSpec, ServingError, invalid, tf_type_name

# tensorflow_serving/model_servers/http_rest_api_util.cc: kPredictionApiGegex, kModelStatusApiRegex
_VERSION_OR_LABEL = r"(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?"
_PREDICT_PATH = re.compile(rf"/v1/models/([^/:]+){_VERSION_OR_LABEL}:(classify|regress|predict)", re.IGNORECASE)
_STATUS_PATH = re.compile(rf"/v1/models(?:/([^/:]+))?{_VERSION_OR_LABEL}(?:/(metadata))?", re.IGNORECASE)
_INT64_MAX = 2**63 - 1

MAX_TENSOR_DEPTH = 64
"""Deepest list nesting accepted for one input (TensorFlow allows rank <= 254; images need 4)."""
MAX_NUMBER_CHARS = 400
"""Longest number literal accepted; longer integers cannot be doubles anyway (~309 digits)."""
MAX_JSON_DEPTH = 2 * MAX_TENSOR_DEPTH
"""Deepest nesting of arrays and objects in a request document (room for a tensor and the request's own levels)."""
# A string, terminated or not (an unterminated one runs to the end of the body, a lone trailing backslash
# included), or a bracket. Possessive and total, so the scan is one linear pass on any body: a string
# alternative that could fail would be retried from every later quote (quadratic, under the GIL).
_JSON_TOKEN = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+(?:"|\\?\Z)|[\[\]{}]', re.DOTALL)


@dataclass(frozen=True)
class Route:
    kind: str  # "predict", "classify", "regress", "status" or "metadata"
    model: str
    version: int | None
    label: str | None = None


def parse_path(method: str, path: str) -> Route:
    """The model, version (or label) and API a ``/v1/...`` request addresses.

    Any other method, or a path matching neither pattern, is TF Serving's
    400 ``Malformed request``.
    """
    if method == "POST" and (m := _PREDICT_PATH.fullmatch(path)):
        name, version, label, api = m.groups()
        return Route(api.lower(), name, _version(version), label)
    if method == "GET" and (m := _STATUS_PATH.fullmatch(path)):
        name, version, label, metadata = m.groups()
        if not name:
            raise invalid("Missing model name in request.")
        return Route("metadata" if metadata else "status", name, _version(version), label)
    raise invalid(f"Malformed request: {method} {path}")


def _version(text: str | None) -> int | None:
    if text is None:
        return None
    if len(text) > 19 or int(text) > _INT64_MAX:  # what absl::SimpleAtoi into int64 refuses
        raise invalid(f"Failed to convert version: {text} to numeric.")
    return int(text)


def parse_predict_body(
    body: bytes, inputs_of: Callable[[str], Mapping[str, InputSpec]]
) -> tuple[str, dict[str, np.ndarray], bool]:
    """(signature name, named input arrays, row format?) of a ``:predict`` body.

    ``inputs_of(signature_name)`` returns that signature's ``{name: InputSpec}``
    (raising ``ServingError`` for an unknown signature).
    """
    doc = _parse_json(body)
    signature = _signature_name(doc)
    specs: Mapping[str, InputSpec] = inputs_of(signature)
    if "instances" in doc and "inputs" in doc:
        raise invalid("Not formatted correctly: expecting only one of 'inputs' or 'instances' keys to exist")
    if "instances" in doc:
        arrays, row = _from_instances(doc["instances"], specs), True
    elif "inputs" in doc:
        arrays, row = _from_inputs(doc["inputs"], specs), False
    else:
        raise invalid("Missing 'inputs' or 'instances' key")
    return signature, arrays, row  # shapes are the model's to check, as in TF Serving


def parse_examples_body(body: bytes) -> tuple[str, list[Any], Any]:
    """(signature name, ``examples`` list, ``context`` or None) of a ``:classify``/``:regress`` body.

    json_tensor.cc's ``FillClassifyRegressRequestFromJson`` checks and words.
    """
    doc = _parse_json(body)
    signature = _signature_name(doc)
    if "examples" not in doc:
        # sic: TF Serving's message names classify for both APIs
        raise invalid(f"JSON Value: {_short(doc)} When method is classify, key 'examples' is expected and "
                      "was not found")
    if not isinstance(doc["examples"], list):
        raise invalid(f"JSON Value: {_short(doc)} Expecting 'examples' value to be an list/array")
    if not doc["examples"]:
        raise invalid(f"JSON Value: {_short(doc)} 'examples' value is an empty array")
    return signature, doc["examples"], doc.get("context")


def classify_response(results: list[list[tuple[str, float]]]) -> dict[str, Any]:
    """``{"results": [[[label, score], ...], ...]}`` (``MakeJsonFromClassificationResult``)."""
    return {"results": [[[label, _float32(score)] for label, score in classes] for classes in results]}


def regress_response(values: list[float]) -> dict[str, Any]:
    """``{"results": [value, ...]}`` (``MakeJsonFromRegressionResult``)."""
    return {"results": [_float32(v) for v in values]}


def _float32(value: float) -> float:
    """A float32 result as TF Serving writes it (3.0999999 -> 3.1), as the predict answer."""
    return jsonfloat.number(float(np.float32(value)))


def predict_response(outputs: Mapping[str, np.ndarray], row: bool) -> dict[str, Any]:
    """``{"predictions": [...]}`` (one entry per instance) or ``{"outputs": ...}``."""
    if not outputs:
        raise invalid("Cannot convert empty tensor map to JSON")
    names = sorted(outputs)
    values = {name: _to_json(np.asarray(outputs[name]), name.endswith("_bytes")) for name in names}
    if not row:
        return {"outputs": values[names[0]] if len(names) == 1 else values}
    batch = _common_batch(outputs, names)
    if len(names) == 1:
        return {"predictions": values[names[0]]}
    return {"predictions": [{name: values[name][i] for name in names} for i in range(batch)]}


def _common_batch(outputs: Mapping[str, np.ndarray], names: list[str]) -> int:
    """The outputs' shared first dimension, refused in util/json_tensor.cc MakeRowFormatJsonFromTensors's words
    (TF Serving 9d981c5c), checked in ``names`` order (there: the proto map's)."""
    batch = -1
    for name in names:
        shape = np.shape(outputs[name])
        if not shape:
            raise invalid(f"Tensor name: {name} has no shape information ")  # sic: the trailing space
        if batch >= 0 and shape[0] != batch:
            raise invalid(f"Tensor name: {name} has inconsistent batch size: {shape[0]} expecting: {batch}")
        batch = shape[0]
    return batch


def status_response(versions: list[tuple[int, str, str, str]]) -> dict[str, Any]:
    """GetModelStatusResponse as JSON from (version, state, error code, message) rows."""
    return {
        "model_version_status": [
            {"version": str(v), "state": state, "status": {"error_code": code, "error_message": message}}
            for v, state, code, message in sorted(versions, reverse=True)
        ]
    }


def metadata_response(name: str, version: int, signature_defs: Mapping[str, Any]) -> dict[str, Any]:
    """GetModelMetadataResponse as TF Serving prints it (signature_def map only)."""
    return {
        "model_spec": {"name": name, "signature_name": "", "version": str(version)},
        "metadata": {"signature_def": {"signature_def": dict(signature_defs)}},
    }


def error_body(message: str) -> dict[str, str]:
    return {"error": message}


def dumps(doc: Mapping[str, Any]) -> bytes:
    """JSON as TF Serving writes it (NaN and Infinity allowed)."""
    return json.dumps(doc, allow_nan=True).encode()


def _parse_json(body: bytes) -> dict[str, Any]:
    """The body as a JSON object; numbers as RapidJSON (TF Serving's parser) reads them.

    Integers beyond 64 bits become doubles and a number beyond double range
    is a parse error, where Python would give a huge int or ``inf``. A
    document nested deeper than ``MAX_JSON_DEPTH`` is refused before parsing.
    """
    if not body:
        raise invalid("JSON Parse error: The document is empty")
    _check_depth(body)
    try:
        text = body.decode()
    except UnicodeDecodeError as err:
        raise invalid(f"JSON Parse error: Invalid encoding in string. at offset: {err.start}") from None
    start = len(text) - len(text.lstrip(" \t\n\r"))
    try:  # raw_decode: text after the document is ignored, as with RapidJSON's kParseStopWhenDoneFlag
        doc = _DECODER.raw_decode(text, start)[0]
    except json.JSONDecodeError as err:
        raise invalid(f"JSON Parse error: {_rapidjson_message(err)} at offset: {err.pos}") from None
    if not isinstance(doc, dict):
        raise invalid(f"JSON Value: {_short(doc)} Is not object")
    return doc


# Python's JSON errors in RapidJSON's words (rapidjson/error/en.h, GetParseError_En), as TF Serving reports them
_RAPIDJSON_MESSAGES = [
    ("Expecting property name", "Missing a name for object member."),
    ("Expecting ':' delimiter", "Missing a colon after a name of object member."),
    ("Unterminated string", "Missing a closing quotation mark in string."),
    ("Invalid \\uXXXX escape", "Incorrect hex digit after \\u escape in string."),
    ("Invalid \\escape", "Invalid escape character in string."),
    ("Invalid control character", "Invalid encoding in string."),
    ("Expecting value", "Invalid value."),
]


def _rapidjson_message(err: json.JSONDecodeError) -> str:
    if err.msg.startswith("Expecting ',' delimiter"):  # which one RapidJSON names depends on the open bracket
        return ("Missing a comma or '}' after an object member." if _innermost(err.doc[:err.pos]) == "{"
                else "Missing a comma or ']' after an array element.")
    return next((ours for python, ours in _RAPIDJSON_MESSAGES if err.msg.startswith(python)), err.msg + ".")


def _innermost(text: str) -> str:
    """The innermost bracket still open at the end of ``text`` (strings skipped)."""
    stack = []
    for token in _JSON_TOKEN.finditer(text.encode()):
        bracket = token[0]
        if bracket in (b"[", b"{"):
            stack.append(bracket.decode())
        elif bracket in (b"]", b"}") and stack:
            stack.pop()
    return stack[-1] if stack else ""


def _check_depth(body: bytes) -> None:
    """Refuse a document nested deeper than ``MAX_JSON_DEPTH`` before parsing it.

    The scan stops at the first level too many, so a deep document costs
    neither a parse nor the parser's recursion; brackets inside strings do
    not count. Documents with few brackets skip it.
    """
    if body.count(b"[") + body.count(b"{") <= MAX_JSON_DEPTH:  # cannot be too deep: skip the scan
        return
    depth = 0
    for token in _JSON_TOKEN.finditer(body):
        bracket = token[0]
        if bracket in (b"[", b"{"):
            depth += 1
            if depth > MAX_JSON_DEPTH:
                raise invalid(f"JSON Parse error: the document is nested deeper than {MAX_JSON_DEPTH} levels")
        elif bracket in (b"]", b"}"):
            depth -= 1


def _json_int(text: str) -> int | float:
    if len(text) > MAX_NUMBER_CHARS:
        raise invalid(f"JSON Parse error: Number too big to be stored in double. ({len(text)} characters)")
    value = int(text)
    return value if -(2**63) <= value < 2**64 else _json_float(text)


def _json_float(text: str) -> float:
    value = float(text) if len(text) <= MAX_NUMBER_CHARS else math.inf
    if math.isinf(value):
        raise invalid(f"JSON Parse error: Number too big to be stored in double. ({_short_text(text)})")
    return value


_DECODER = json.JSONDecoder(parse_int=_json_int, parse_float=_json_float)


def _signature_name(doc: Mapping[str, Any]) -> str:
    signature = doc.get("signature_name", DEFAULT_SIGNATURE)
    if not isinstance(signature, str):
        raise invalid(f"JSON Value: {_short(signature)} not formatted correctly. "
                      "'signature_name' key must be a string value.")
    return signature or DEFAULT_SIGNATURE


def is_b64(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get("b64"), str)


def _is_named(value: Any) -> bool:
    return isinstance(value, dict) and not is_b64(value)


def _from_instances(instances: Any, specs: Mapping[str, InputSpec]) -> dict[str, np.ndarray]:
    if not isinstance(instances, list):
        raise invalid("Expecting 'instances' to be an list/array")
    if not instances:
        raise invalid("No values in 'instances' array")
    named = _is_named(instances[0])
    if not named and len(specs) > 1:
        raise invalid(
            "instances is a plain list, but expecting list of objects as multiple input tensors "
            f"required as per tensorinfo_map: {', '.join(sorted(specs))}"
        )
    leaves: dict[str, list[Any]] = {name: [] for name in specs}  # every instance's, in order: one array each
    shapes: dict[str, list[tuple[int, ...]]] = {name: [] for name in specs}
    for i, item in enumerate(instances):
        if named != _is_named(item):
            raise invalid(f"Expecting {'object' if named else 'value/list'} but got "
                          f"{'value/list' if named else 'object'} at item {i} of input list")
        values = item if named else {next(iter(specs)): item}
        if set(values) != set(specs):
            raise invalid(
                f"Failed to process element: {i} of 'instances' list. JSON object: {_short(item)} "
                f"keys must be equal to: {','.join(sorted(specs))}"
            )
        for name, value in values.items():
            try:
                shapes[name].append(_fill(value, specs[name].dtype, leaves[name]))
            except ServingError as err:
                raise invalid(f"Failed to process element: {i} key: {name} of 'instances' list. "
                              f"Error: {err.message}") from None
    arrays = {}
    for name, spec in specs.items():
        distinct = set(shapes[name])
        if len(distinct) > 1:
            raise invalid(f"input {name}: instances have different shapes {sorted(distinct)}")
        arrays[name] = np.array(leaves[name], dtype=spec.dtype).reshape((len(instances), *distinct.pop()))
    return arrays


def _from_inputs(inputs: Any, specs: Mapping[str, InputSpec]) -> dict[str, np.ndarray]:
    if not _is_named(inputs):
        if len(specs) > 1:
            raise invalid(
                "inputs is a plain value/list, but expecting an object as multiple input tensors "
                f"required as per tensorinfo_map: {', '.join(sorted(specs))}"
            )
        inputs = {next(iter(specs)): inputs}
    arrays = {}
    for name, spec in specs.items():
        if name not in inputs:
            raise invalid(f"Missing named input: {name} in 'inputs' object.")
        arrays[name] = to_array(inputs[name], spec.dtype)  # [] is an empty batch, as in TF Serving
    return arrays


def to_array(value: Any, dtype: np.dtype) -> np.ndarray:
    """A dense array from nested JSON lists, leaves converted to ``dtype`` (object = bytes)."""
    leaves: list[Any] = []
    shape = _fill(value, dtype, leaves)
    return np.array(leaves, dtype=dtype).reshape(shape)


def _fill(value: Any, dtype: np.dtype, out: list[Any]) -> tuple[int, ...]:
    """Append the leaves of nested JSON lists to ``out`` (converted to ``dtype``) and return their shape.

    The shape is read along the first elements, then every list is checked
    against it, so a ragged tensor fails naming its level.
    """
    shape: list[int] = []
    probe = value
    while isinstance(probe, list):
        shape.append(len(probe))
        if len(shape) > MAX_TENSOR_DEPTH:
            raise invalid(f"lists nested deeper than {MAX_TENSOR_DEPTH} levels")
        if not probe:
            break
        probe = probe[0]
    _collect(value, 0, shape, np.dtype(dtype), out)
    return tuple(shape)


def _collect(value: Any, level: int, shape: list[int], dtype: np.dtype, out: list[Any]) -> None:
    if isinstance(value, list):
        if level >= len(shape):
            raise invalid(f"Encountered list at unexpected level: {level} expected < {len(shape)}")
        if len(value) != shape[level]:
            raise invalid(
                f"Encountered list at unexpected size: {len(value)} at level: {level} "
                f"expected size: {shape[level]}"
            )
        for item in value:
            _collect(item, level + 1, shape, dtype, out)
        return
    if level != len(shape):
        raise invalid(f"JSON Value: {_short(value)} found at incorrect level: {level + 1} in the JSON DOM. "
                      f"Expected at level: {len(shape)}")
    out.append(_leaf(value, dtype))


def b64decode(text: str) -> bytes:
    """Standard base64 as absl::Base64Unescape (TF Serving) reads it: whitespace skipped, padding optional."""
    if len(text) % 4 == 0:  # the usual, canonical text: decoded as it is (whitespace would fail validation)
        with contextlib.suppress(binascii.Error):
            return base64.b64decode(text, validate=True)
    compact = "".join(text.split())
    return base64.b64decode(compact + "=" * (-len(compact) % 4), validate=True)


def leaf_bytes(value: Any) -> bytes:
    """A string leaf's bytes: UTF-8 text, or ``{"b64": ...}`` decoded."""
    if is_b64(value):
        try:
            return b64decode(value["b64"])
        except (binascii.Error, ValueError):
            raise invalid(f"Unable to base64 decode: {_short(value)}") from None
    return value.encode()


def _leaf(value: Any, dtype: np.dtype) -> Any:
    kind = dtype.kind
    if kind == "O":
        if isinstance(value, str) or is_b64(value):
            return leaf_bytes(value)
        if isinstance(value, dict):
            raise invalid(f"JSON Value: {_short(value)} not formatted correctly for base64 data")
    elif kind == "b" and isinstance(value, bool):
        return value
    elif kind in "iu" and isinstance(value, int) and not isinstance(value, bool):
        limits = np.iinfo(dtype)
        if limits.min <= value <= limits.max:  # out of range: not an integer of this type, as in RapidJSON
            return value
    elif kind == "f" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    raise invalid(f"JSON Value: {_short(value)} Type: {json_type(value)} is not of expected type: "
                  f"{tf_type_name(dtype)}")


def json_type(value: Any) -> str:
    """RapidJSON's type names, as TF Serving's errors use them."""
    if value is None:
        return "Null"
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, (int, float)):
        return "Number"
    names: dict[type, str] = {str: "String", list: "Array", dict: "Object"}
    return names.get(type(value), type(value).__name__)


def _to_json(array: np.ndarray, as_b64: bool) -> Any:
    if array.dtype.kind in "OSU":
        texts = [_text(v, as_b64) for v in array.ravel().tolist()]
        return texts if array.ndim == 1 else np.array(texts, dtype=object).reshape(array.shape).tolist()
    if array.dtype == np.float32:
        return jsonfloat.values(array)  # 0.1, not 0.10000000149, as TF Serving writes it
    return array.tolist()


def _text(value: Any, as_b64: bool) -> Any:
    raw = value if isinstance(value, bytes) else str(value).encode()
    return {"b64": base64.b64encode(raw).decode()} if as_b64 else raw.decode("utf-8", "replace")


def _short(value: Any, limit: int = 200) -> str:
    try:
        text = json.dumps(value)
    except (RecursionError, ValueError):
        text = f"<{type(value).__name__} nested too deeply to show>"
    return _short_text(text, limit)


def _short_text(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
