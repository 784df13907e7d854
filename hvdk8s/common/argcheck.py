"""Checks for the Python API's numeric arguments: a wrong one is named where it is passed.

Without them a string or float from a config file or ``argparse`` without ``type=int`` fails later, inside
TensorFlow or Horovod, with a message about ``<`` or an op attribute, often at the first training step.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Sequence


def whole(name: str, value: object, least: int = 1) -> int:
    """``value`` as an int of at least ``least``: TypeError for a non-integer (a bool, a float, a string), ValueError
    below ``least``; numpy integers are accepted."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected a whole number, got {type(value).__name__} {value!r}")
    if value < least:
        raise ValueError(f"{name}={value}: must be >= {least}")
    return int(value)


def real(name: str, value: object, above: float | None = None, least: float | None = None) -> float:
    """``value`` as a finite float, greater than ``above`` and at least ``least`` where given: TypeError for a
    non-number (a bool, a string), ValueError for nan, inf or a value out of range."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a number, got {type(value).__name__} {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{name}={value}: must be a finite number")
    if above is not None and number <= above:
        raise ValueError(f"{name}={value}: must be > {above:g}")
    if least is not None and number < least:
        raise ValueError(f"{name}={value}: must be >= {least:g}")
    return number


def sizes(name: str, value: object, least: Sequence[int], shape: str) -> tuple[int, ...]:
    """``value`` as a tuple of ``len(least)`` whole numbers, the i-th at least ``least[i]``: ValueError naming
    ``shape`` (e.g. ``"(height, width)"``) for anything but a tuple or list of that length."""
    if not isinstance(value, (tuple, list)) or len(value) != len(least):
        raise ValueError(f"{name}={value!r}: expected {shape}")
    return tuple(whole(f"{name}[{i}]", side, low) for i, (side, low) in enumerate(zip(value, least)))
