"""The numbers TF Serving writes for float32 outputs in its JSON answers, as Python floats.

TF Serving's ``WriteDecimal`` (tensorflow_serving/util/json_tensor.cc, 2.x
master) writes ``absl::StrCat(value)``, six significant digits as printf's
``%g``, and, when that text does not read back as the same float, ``%.9g``
(``max_digits10``). So float32 0.1 is ``0.1`` and float32 0.12345678 is
``0.123456784``. ``values(array)`` returns, for each element, the float64
that text reads as, which ``json.dumps`` then writes (``1e+06`` there is
``1000000.0`` here: the same number). NaN and infinities stay as they are
(JSON's ``NaN``/``Infinity``, as TF Serving writes them).

Two ways to the same numbers, chosen by size because their costs differ:
a Python loop (about 0.5 µs an element, no fixed cost) for the usual
answer of one instance, and NumPy arithmetic (a fixed ~20 µs, then ~0.1
µs an element) for large ones, whose few elements it cannot decide
exactly fall back to the loop's formatting.
"""
from __future__ import annotations

import struct
from typing import Any

import numpy as np

VECTOR_FROM = 64
"""Arrays with at least this many elements take the NumPy path (measured crossover: 8x10 costs both alike)."""
_FLOAT32 = struct.Struct("f")  # packing rounds a double to the nearest float32, ties to even, as absl::SimpleAtof
_POWERS = 10.0 ** np.arange(23)  # exact in float64 (10**22 < 2**53 * 2**22)


def values(array: np.ndarray) -> Any:
    """The float32 ``array`` as nested lists of TF Serving's numbers (``array.tolist()``'s shape)."""
    if array.size >= VECTOR_FROM:
        return _vectorised(array).reshape(array.shape).tolist()
    numbers = [number(v) for v in array.ravel().tolist()]
    if array.ndim == 1:
        return numbers
    if array.ndim == 2:
        width = array.shape[1]
        return [numbers[i:i + width] for i in range(0, len(numbers), width)]
    return np.array(numbers, dtype=np.float64).reshape(array.shape).tolist()


def number(value: float) -> float:
    """TF Serving's number for one float32 (given as the Python float it converts to exactly)."""
    short = float(f"{value:.6g}")
    if _FLOAT32.unpack(_FLOAT32.pack(short))[0] == value:  # NaN never equals: "%.9g" keeps it NaN
        return short
    return float(f"{value:.9g}")


def _vectorised(array: np.ndarray) -> np.ndarray:
    """``number`` of every element, flat, in NumPy."""
    with np.errstate(invalid="ignore"):  # signalling NaNs convert quietly, as tolist() converts them
        flat = array.astype(np.float64).ravel()
    out = _rounded(flat, 6)
    redo = (out.astype(np.float32) != array.ravel()) & np.isfinite(flat)
    if redo.any():
        out[redo] = _rounded(flat[redo], 9)
    return out


def _rounded(x: np.ndarray, digits: int) -> np.ndarray:
    """``float(f"{v:.{digits}g}")`` for every ``v`` of ``x``.

    The value of ``M * 10**-shift`` (M the ``digits``-digit integer) is one
    division or multiplication of exact float64 operands when ``|shift| <=
    22``, so correctly rounded, as ``float()`` of the text is. M itself is
    ``rint`` of the scaled value, computed with one rounding: elements whose
    scaled value lies too near a half (where that rounding could decide
    the side), outside the expected decade (``log10`` off by one near a
    power of ten) or beyond the exact powers are formatted one by one.
    """
    out = x.copy()  # zeros, NaN and infinities are their own numbers
    magnitude = np.abs(x)
    live = np.isfinite(x) & (magnitude > 0)
    exponent = np.floor(np.log10(magnitude, where=live, out=np.zeros_like(x))).astype(np.int64)
    shift = digits - 1 - exponent
    exact = live & (np.abs(shift) < len(_POWERS))
    power = _POWERS[np.where(exact, np.abs(shift), 0)]
    up = shift >= 0
    scaled = np.where(up, magnitude * power, magnitude / power)
    mantissa = np.rint(scaled)
    exact &= ((scaled >= 10.0 ** (digits - 1)) & (scaled < 10.0 ** digits)
              & (np.abs(scaled - np.floor(scaled) - 0.5) > scaled * 2.0**-50))
    out[exact] = np.copysign(np.where(up, mantissa / power, mantissa * power), x)[exact]
    for i in np.flatnonzero(live & ~exact).tolist():
        out[i] = float(f"{x[i]:.{digits}g}")
    return out
