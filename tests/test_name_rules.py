"""hvdk8s.common.fields.name_problem: Kubernetes' name rules, worded once for every file hvdk8s reads."""
from __future__ import annotations

import pytest

from hvdk8s.common.fields import name_problem

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
