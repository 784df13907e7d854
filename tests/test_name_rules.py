"""hvdk8s.common.fields.name_problem: Kubernetes' name rules, worded once for every file hvdk8s reads."""
from __future__ import annotations

import pytest

from hvdk8s.common.fields import QUANTITY, name_problem, quantity_problem, scale_quantity

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("name", "rule", "limit", "problem"), [
    ("digits-worker-1", "DNS-1035 label", None, None),
    ("1digits", "DNS-1035 label", None, "is not a DNS-1035 label (lowercase letters, digits and '-', starting with a letter)"),
    ("digits\n", "DNS-1035 label", None, "is not a DNS-1035 label (lowercase letters, digits and '-', starting with a letter)"),
    ("a" * 64, "DNS-1035 label", None, "is 64 characters; a DNS-1035 label has at most 63 (shorten the name)"),
    ("a" * 41, "DNS-1035 label", 40, "is 41 characters; at most 40 fit here (shorten the name)"),
    ("1team", "DNS-1123 label", None, None),
    ("team.a", "DNS-1123 label", None, "is not a DNS-1123 label (lowercase letters, digits and '-', starting with a letter or digit)"),
    ("models.v1", "DNS-1123 subdomain", None, None),
    ("Models_1", "DNS-1123 subdomain", None, "is not a DNS-1123 subdomain (lowercase letters, digits, '-' and '.')"),
    ("a" * 254, "DNS-1123 subdomain", None, "is 254 characters; a DNS-1123 subdomain has at most 253 (shorten the name)"),
])  # fmt: skip
def test_name_problem(name: str, rule: str, limit: int | None, problem: str | None) -> None:
    assert name_problem(name, rule, limit=limit) == problem  # type: ignore[arg-type]


@pytest.mark.parametrize(("value", "problem"), [
    ("500m", None), ("4Gi", None), ("+1Gi", None), ("1e3", None), ("-0", None), ("-0.0Mi", None),
    ("-1Gi", "must not be negative, got '-1Gi'"),
    ("-500m", "must not be negative, got '-500m'"),
    ("-1", "must not be negative, got '-1'"),
    ("-.5e3", "must not be negative, got '-.5e3'"),
    ("1 Gi", "'1 Gi' is not a Kubernetes quantity (e.g. 500m, 2, 4Gi)"),
])  # fmt: skip
def test_quantity_problem(value: str, problem: str | None) -> None:
    """resource.Quantity's syntax takes a sign; the API server refuses negative requests and limits."""
    assert quantity_problem(value) == problem


@pytest.mark.parametrize(("value", "times", "scaled"), [
    ("500m", 3, "1500m"), ("4Gi", 2, "8Gi"), ("2", 4, "8"), (2, 4, "8"), ("0", 5, "0"), ("1.50", 2, "3"),
    ("+1Gi", 3, "3Gi"), ("-1Gi", 2, "-2Gi"), ("-500m", 3, "-1500m"), ("-0", 2, "0"),  # signs (refused elsewhere)
    ("1e3", 2, "2e3"), ("1E-2", 3, "3E-2"), ("-.5e+3", 2, "-1e+3"),  # the exponent stays the unit
    ("1e9999999", 3, "3e9999999"),  # no overflow, whatever the exponent
    ("99999999999999999999999999999999999", 3, "299999999999999999999999999999999997"),  # exact
    ("1", 99999999999999999999999, "99999999999999999999999"),
])  # fmt: skip
def test_scale_quantity_takes_every_quantity(value: str | int, times: int, scaled: str) -> None:
    assert QUANTITY.match(str(value)) and QUANTITY.match(scaled)
    assert scale_quantity(value, times) == scaled


def test_scale_quantity_refuses_what_is_no_quantity() -> None:
    with pytest.raises(ValueError, match="'2 cores' is not a Kubernetes quantity"):
        scale_quantity("2 cores", 2)
