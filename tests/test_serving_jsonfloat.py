"""Float32 outputs are written with TF Serving's numbers (``WriteDecimal`` in tensorflow_serving/util/json_tensor.cc).

TF Serving writes ``absl::StrCat(value)`` (six digits, ``%g``) and, if that
does not read back as the same float32, ``%.9g``. The reference here is
that rule written with C's formatting through ``ctypes`` (``snprintf``
and ``strtof``, the same printf family and a correctly rounding text to
float32 reader, as absl's), so the tests do not share code with the server.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import json

import numpy as np
import pytest

from hvdk8s.serving.api import jsonfloat, rest

_libc = ctypes.CDLL(ctypes.util.find_library("c"))
_libc.strtof.restype = ctypes.c_float
_libc.strtof.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p)]


def tf_serving_text(value: np.float32) -> str:
    """WriteDecimal's text for a finite float32."""
    buffer = ctypes.create_string_buffer(64)
    _libc.snprintf(buffer, 64, b"%.6g", ctypes.c_double(float(value)))
    if np.float32(_libc.strtof(buffer.value, None)) != value:
        _libc.snprintf(buffer, 64, b"%.9g", ctypes.c_double(float(value)))
    return buffer.value.decode()


def test_short_text_when_it_reads_back_else_nine_digits():
    got = rest.predict_response({"p": np.array([[0.1, 0.12345678, 3.0999999, 1e6, 16777216.0, 2.5e-8]],
                                               dtype="float32")}, row=True)
    # 0.12345678 as float32 needs nine digits in TF Serving's text: 0.123456784, not Python's shortest 0.12345678
    assert rest.dumps(got) == b'{"predictions": [[0.1, 0.123456784, 3.1, 1000000.0, 16777216.0, 2.5e-08]]}'


def test_nan_infinity_and_signed_zero_as_tf_serving():
    doc = rest.predict_response({"p": np.array([np.nan, np.inf, -np.inf, -0.0], dtype="float32")}, row=False)
    assert rest.dumps(doc) == b'{"outputs": [NaN, Infinity, -Infinity, -0.0]}'


@pytest.mark.parametrize("size", [1, 10, jsonfloat.VECTOR_FROM - 1, jsonfloat.VECTOR_FROM, 4096])
def test_every_float32_kind_matches_the_c_reference(size):
    """Random bit patterns (all exponents, denormals, NaNs) and unit-interval values, at both paths' sizes."""
    rng = np.random.default_rng(size)
    bits = rng.integers(0, 2**32, 20 * size, dtype=np.uint64).astype(np.uint32).view(np.float32)
    unit = rng.random(20 * size).astype(np.float32)
    ties = np.array([67108896, 67108904, 0.5, 1e-45, 3.4028235e38, -1.1754944e-38], dtype=np.float32)
    for data in (bits, unit, ties):
        for chunk in np.array_split(data, max(1, len(data) // size)):
            got = jsonfloat.values(chunk)
            assert len(got) == len(chunk)
            for value, number in zip(chunk.tolist(), got, strict=True):
                if np.isfinite(value):
                    assert number == float(tf_serving_text(np.float32(value))), value
                else:
                    assert json.dumps(number) == json.dumps(value)


def test_nested_shapes_keep_their_lists():
    for shape in [(2, 3), (2, 1, 3), (40, 2), (0, 10)]:
        array = np.arange(np.prod(shape), dtype=np.float32).reshape(shape) / 7
        got = jsonfloat.values(array)
        assert np.array(got).shape == np.array(array.tolist()).shape  # tolist's nesting ((0, 10) is [])
        assert np.array_equal(np.array(got, dtype=np.float32).reshape(shape), array)
