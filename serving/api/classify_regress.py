"""TF Serving's Classify and Regress APIs: ``tf.Example`` inputs, one signature, results as TF Serving shapes them.

Both APIs feed one DT_STRING tensor of serialized ``tf.Example`` protos to a
signature's ``inputs`` and read ``classes``/``scores`` (classify) or
``outputs`` (regress). The checks and messages follow TF Serving's
tensorflow_serving/servables/tensorflow/classifier.cc, regressor.cc and
util.cc (``InputToSerializedExampleTensor``); JSON examples become features
as util/json_tensor.cc's ``AddValueToFeature`` makes them (a JSON number
with a fraction or exponent: float_list; an integer or boolean: int64_list;
a string or ``{"b64": ...}``: bytes_list). Source version: the github
tensorflow/serving snapshot at 9d981c5 (July 2026).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from hvdk8s.serving.api import rest, types

CLASSIFY, REGRESS = "classify", "regress"
METHOD_NAMES = {"tensorflow/serving/classify": CLASSIFY, "tensorflow/serving/regress": REGRESS}
INPUT = "inputs"  # kClassifyInputs / kRegressInputs


def check_signature(api: str, signature: str, signature_defs: Mapping[str, Any]) -> None:
    """Refuse a signature ``api`` cannot run, with TF Serving's messages (``PreProcessClassification``/``...Regression``).

    The default ``--enable_signature_method_name_check=false``: the
    signature's method name is not checked, its inputs and outputs are.
    """
    sig = signature_defs.get(signature)
    if sig is None:
        raise types.invalid(f"No signature was found with the name: {signature}")
    inputs, outputs = sig.get("inputs", {}), sig.get("outputs", {})
    if len(inputs) != 1:
        raise types.invalid("Expected one input Tensor.")
    if api == CLASSIFY:
        if len(outputs) not in (1, 2):
            raise types.invalid(f"Expected one or two output Tensors, found {len(outputs)}")
        if INPUT not in inputs:
            raise types.invalid(f"No classification inputs found in SignatureDef: {signature}")
        if "classes" not in outputs and "scores" not in outputs:
            raise types.invalid('Expected classification signature outputs to contain at least one of "classes" or '
                               f'"scores". Signature was: {signature}')
    else:
        if len(outputs) != 1:
            raise types.invalid("Expected one output Tensor.")
        if INPUT not in inputs:
            raise types.invalid(f"No regression inputs found in SignatureDef: {signature}")
        if "outputs" not in outputs:
            raise types.invalid(f"No regression outputs found in SignatureDef: {signature}")


def input_tensor(serialized: Sequence[bytes]) -> dict[str, np.ndarray]:
    """The signature's inputs: the serialized examples as one string vector."""
    if not serialized:
        raise types.invalid("Input is empty.")
    return {INPUT: np.array(list(serialized), dtype=object)}


def from_json(examples: list[Any], context: Any = None) -> list[bytes]:
    """Serialized ``tf.Example`` protos from a REST body's ``examples`` (and ``context``) values.

    With a context, each example is the context's features merged with its
    own (the proto concatenation ``InputToSerializedExampleTensor`` makes).
    """
    prefix = _example(context).SerializeToString() if context is not None else b""
    return [prefix + _example(item).SerializeToString() for item in examples]


def from_input(proto: Any) -> list[bytes]:
    """Serialized examples from a gRPC ``tensorflow.serving.Input`` (example_list or example_list_with_context)."""
    kind = proto.WhichOneof("kind")
    if kind == "example_list":
        return [e.SerializeToString() for e in proto.example_list.examples]
    if kind == "example_list_with_context":
        prefix = proto.example_list_with_context.context.SerializeToString()
        return [prefix + e.SerializeToString() for e in proto.example_list_with_context.examples]
    return []


def classifications(outputs: Mapping[str, np.ndarray], num_examples: int) -> list[list[tuple[str, float]]]:
    """Each example's (label, score) pairs (``PostProcessClassificationResult``; a missing part: "" or 0)."""
    classes, scores = outputs.get("classes"), outputs.get("scores")
    for name, tensor, dtype in (("classes", classes, "DT_STRING"), ("scores", scores, "DT_FLOAT")):
        if tensor is None:
            continue
        if tensor.ndim != 2:
            raise types.invalid(f"Expected Tensor shape: [batch_size num_classes] but got {_shape(tensor)}")
        if (tensor.dtype.kind in "OSU") != (dtype == "DT_STRING") or (dtype == "DT_FLOAT" and tensor.dtype != np.float32):
            raise types.invalid(f"Expected {name} Tensor of {dtype}. Got: {_dtype_name(tensor)}")
        if tensor.shape[0] != num_examples:
            raise types.invalid(f"Expected {name} output batch size of {num_examples}. Got: {tensor.shape[0]}")
    if classes is not None and scores is not None and classes.shape[1] != scores.shape[1]:
        raise types.invalid("Tensors class and score should match in dim_size(1). "
                           f"Got {classes.shape[1]} vs. {scores.shape[1]}")
    present = classes if classes is not None else scores
    assert present is not None  # check_signature refused a classification signature with neither output
    width = present.shape[1]
    return [
        [(_label(classes[i, c]) if classes is not None else "",
          float(scores[i, c]) if scores is not None else 0.0) for c in range(width)]
        for i in range(num_examples)
    ]


def regressions(outputs: Mapping[str, np.ndarray], num_examples: int) -> list[float]:
    """Each example's value (``PostProcessRegressionResult``: shape [batch] or [batch, 1], DT_FLOAT)."""
    tensor = outputs["outputs"]
    if not (tensor.ndim == 1 or (tensor.ndim == 2 and tensor.shape[1] == 1)):
        raise types.invalid("Expected output Tensor shape to be either [batch_size] or [batch_size, 1] but got "
                           f"{_shape(tensor)}")
    if tensor.shape[0] != num_examples:
        raise types.invalid(f"Input batch size did not match output batch size: {num_examples} vs. {tensor.shape[0]}")
    if tensor.dtype != np.float32:
        raise types.invalid(f"Expected output Tensor of DT_FLOAT.  Got: {_dtype_name(tensor)}")
    return [float(v) for v in tensor.ravel()]


def _example(value: Any) -> Any:
    """One JSON object as a ``tf.Example`` (``MakeExampleFromJsonObject``)."""
    from tensorflow.core.example import example_pb2

    if not isinstance(value, dict):
        raise types.invalid(f"Example must be JSON object but got JSON {rest.json_type(value)}")
    example = example_pb2.Example()
    for name, content in value.items():
        feature = example.features.feature[name]
        for item in content if isinstance(content, list) else [content]:
            _add_value(item, name, feature)
    return example


def _add_value(value: Any, name: str, feature: Any) -> None:
    if value is None or isinstance(value, list) or (isinstance(value, dict) and not rest.is_b64(value)):
        raise types.invalid(f"Feature: {name} has element with unexpected JSON type: {rest.json_type(value)}")
    if isinstance(value, bool) or (isinstance(value, int) and not isinstance(value, bool)):
        _same_kind(feature, "int64_list", name)
        if isinstance(value, int) and value >= 2**63:
            raise types.invalid(f"Feature: {name} has uint64_t element. Only int64_t is supported.")
        feature.int64_list.value.append(int(value))
    elif isinstance(value, float):
        _same_kind(feature, "float_list", name)
        feature.float_list.value.append(value)
    else:
        _same_kind(feature, "bytes_list", name)
        feature.bytes_list.value.append(rest.leaf_bytes(value))


def _same_kind(feature: Any, kind: str, name: str) -> None:
    """A feature holds one kind of list (``IsFeatureOfKind``, ``IncompatibleFeatureKindError``)."""
    have = feature.WhichOneof("kind")
    if have not in (None, kind):
        raise types.invalid(f"Unexpected element type in feature: {name} expecting type: {have.split('_')[0]}")


def _label(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _shape(tensor: np.ndarray) -> str:
    return "[" + ",".join(str(d) for d in tensor.shape) + "]"


def _dtype_name(tensor: np.ndarray) -> str:
    return "DT_" + types.tf_type_name(tensor.dtype).upper()
