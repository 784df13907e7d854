"""What TensorFlow Serving's REST and gRPC APIs share: the error a request fails with, a signature input's spec.

A ``ServingError`` carries a TensorFlow status code name (the gRPC API answers with it) and the HTTP status the
REST API answers with; the messages are TF Serving's. No TensorFlow import here.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# In google.rpc code order (CANCELLED = 1 ... UNAUTHENTICATED = 16): the repository numbers them from it.
HTTP_STATUS = {
    "CANCELLED": 499,
    "UNKNOWN": 500,
    "INVALID_ARGUMENT": 400,
    "DEADLINE_EXCEEDED": 504,
    "NOT_FOUND": 404,
    "ALREADY_EXISTS": 409,
    "PERMISSION_DENIED": 403,
    "RESOURCE_EXHAUSTED": 429,
    "FAILED_PRECONDITION": 400,
    "ABORTED": 409,
    "OUT_OF_RANGE": 400,
    "UNIMPLEMENTED": 501,
    "INTERNAL": 500,
    "UNAVAILABLE": 503,
    "DATA_LOSS": 500,
    "UNAUTHENTICATED": 401,
}
DEFAULT_SIGNATURE = "serving_default"


class ServingError(Exception):
    """A request failure: a TensorFlow status code name and a message for the client."""

    def __init__(self, code: str, message: str, http_status: int | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.http_status = http_status or HTTP_STATUS.get(code, 500)

    def detached(self) -> ServingError:
        """The same answer as a new error, without this one's traceback or the error it replaced.

        Those reach the frames the error passed through; handed to another
        thread or coroutine that holds it there, it would close a reference
        cycle keeping the request alive until the cyclic garbage collector runs.
        """
        return ServingError(self.code, self.message, self.http_status)


def invalid(message: str) -> ServingError:
    return ServingError("INVALID_ARGUMENT", message)


@dataclass(frozen=True)
class InputSpec:
    """One signature input: NumPy dtype (``object`` for tf.string) and shape (None = any)."""

    dtype: np.dtype
    shape: tuple[int | None, ...]


def unknown_label(label: str) -> ServingError:
    """A label the model's config (``--model_config_file``) does not define; a model served from a base path
    has none."""
    return invalid(f"Unrecognized servable version label: {label}")


def tf_type_name(dtype: np.dtype) -> str:
    """tensorflow::DataTypeString's name for a NumPy dtype (object and text: string)."""
    dtype = np.dtype(dtype)
    if dtype.kind in "OSU":
        return "string"
    return {"float32": "float", "float64": "double", "float16": "half"}.get(dtype.name, dtype.name)
