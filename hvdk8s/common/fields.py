"""Kubernetes' rules for the fields hvdk8s checks, and the errors that name them: pure functions, no client.

Naming, label and quantity rules (as apimachinery's validation spells them),
field errors in the API server's shape (kind, field path, detail), the path
builder every validator reports under (``join``) and the error that carries all
of a file's. Shared by ``mpijob``, ``cluster``, ``serving``, ``pipeline`` and
``benchmarks``; it imports none of them, so none of them import each other for
it. Talking to a cluster is ``hvdk8s.cluster``'s; reading and writing the YAML
files is ``files``'.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, localcontext
from typing import Any, Literal

from hvdk8s.common.errors import UserError

# \Z, not $: $ also matches before a final newline (YAML block scalars end in one).
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?\Z")
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?\Z")
LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]\Z")
# Kubernetes resource.Quantity, as CRD schemas spell it.
QUANTITY = re.compile(
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?\Z"
)
# The API's integer formats (OpenAPI int32/int64): replicas, slotsPerWorker, runPolicy's counts and seconds.
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*\Z")
# Kueue: the label that queues a job in a LocalQueue, and the managedBy value of MultiKueue.
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
MULTIKUEUE = "kueue.x-k8s.io/multikueue"

# ---- field errors ----------------------------------------------------------

# apimachinery's field.ErrorType names, which the operators' validation uses.
ErrorKind = Literal["Required", "Invalid", "TypeInvalid", "NotSupported", "Forbidden", "Duplicate"]


@dataclass(frozen=True)
class FieldError:
    """One problem at one field path, like a StatusCause of a 422 answer."""

    kind: ErrorKind
    path: str
    detail: str

    def __str__(self) -> str:
        return f"{self.path}: {self.detail}"


class SpecError(UserError):
    """An invalid job spec or MPIJob: ``field_errors`` holds every problem, ``errors`` them as ``path: detail``."""

    def __init__(self, source: str, field_errors: list[FieldError]):
        self.source, self.field_errors = source, field_errors
        self.errors = [str(e) for e in field_errors]
        super().__init__(f"{source}: invalid:\n  " + "\n  ".join(self.errors))


def join(path: str, *keys: str | int) -> str:
    """``path`` then ``keys``, each a field (``.key``) or a list index (``[i]``): apimachinery's
    ``field.Path`` Child/Index, which the MPI Operator passes down its validators (v0.8.2
    ``pkg/apis/kubeflow/validation/validation.go``) so each one reports under whatever prefix it is given."""
    for key in keys:
        path = f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}" if path else key
    return path


def required(path: str, detail: str = "required") -> FieldError:
    return FieldError("Required", path, detail)


def invalid(path: str, detail: str) -> FieldError:
    return FieldError("Invalid", path, detail)


def forbidden(path: str, detail: str) -> FieldError:
    return FieldError("Forbidden", path, detail)


def not_supported(path: str, value: Any, allowed: tuple[str, ...]) -> FieldError:
    return FieldError("NotSupported", path, f"{value!r} is not one of {', '.join(allowed)}")


def one_of(path: str, value: Any, allowed: tuple[str, ...]) -> list[FieldError]:
    return [] if value in allowed else [not_supported(path, value, allowed)]


def at_least(path: str, value: Any, low: int, most: int | None = None) -> list[FieldError]:
    """``value`` an integer >= ``low`` (and, with ``most``, <= ``most``: an int32 field's INT32_MAX); None passes."""
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < low):
        return [invalid(path, f"must be >= {low}, got {value!r}")]
    if value is not None and most is not None and value > most:
        return [invalid(path, f"must be <= {most}, got {value!r}")]
    return []


def value_kind(value: Any) -> str:
    """What a value read from YAML or JSON is, as a type error names it to the file's author."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"number {value}"
    if isinstance(value, str):
        return f"string {value!r}"
    names: dict[type, str] = {list: "a list", dict: "a mapping"}
    return names.get(type(value), type(value).__name__)


def quantity_problem(value: str) -> str | None:
    """Why ``value`` is no amount of a resource, or None: a Kubernetes quantity (resource.Quantity's syntax,
    which takes a sign) that is not negative, since the API server refuses negative requests and limits
    (ValidateResourceQuantityValue: "must be greater than or equal to 0")."""
    match = QUANTITY.match(value)
    if not match:
        return f"{value!r} is not a Kubernetes quantity (e.g. 500m, 2, 4Gi)"
    if match.group(1) == "-" and Decimal(match.group(2)) != 0:  # -0 is 0
        return f"must not be negative, got {value!r}"
    return None


def quantity(path: str, value: str) -> list[FieldError]:
    problem = quantity_problem(value)
    return [invalid(path, problem)] if problem else []


def scale_quantity(value: str | int, times: int) -> str:
    """``times`` x a Kubernetes quantity, in its own unit (``500m`` x 3 = ``1500m``, ``4Gi`` x 2 = ``8Gi``,
    ``1e3`` x 2 = ``2e3``), exactly; any quantity ``QUANTITY`` matches (callers check that first)."""
    match = QUANTITY.match(str(value))
    if not match:
        raise ValueError(f"{value!r} is not a Kubernetes quantity")
    sign, number, unit = match.group(1) or "", match.group(2), match.group(6) or ""
    # The number alone (the unit, an SI suffix or an exponent, stays text): its digits and times' digits
    # bound the product's, so it is exact and never overflows whatever the exponent.
    with localcontext() as context:
        context.prec = len(number) + len(str(abs(times))) + 1
        scaled = Decimal(sign + number) * times
        return (format(scaled.normalize(), "f") if scaled else "0") + unit


# ---- names and labels ------------------------------------------------------


NameRule = Literal["DNS-1035 label", "DNS-1123 label", "DNS-1123 subdomain"]
# apimachinery's name rules (validation.IsDNS1035Label, IsDNS1123Label, IsDNS1123Subdomain): pattern,
# longest length, and the words every hvdk8s message uses for them.
NAME_RULES: dict[NameRule, tuple[re.Pattern[str], int, str]] = {
    "DNS-1035 label": (DNS1035_LABEL, 63, "lowercase letters, digits and '-', starting with a letter"),
    "DNS-1123 label": (DNS1123_LABEL, 63, "lowercase letters, digits and '-', starting with a letter or digit"),
    "DNS-1123 subdomain": (DNS1123_SUBDOMAIN, 253, "lowercase letters, digits, '-' and '.'"),
}


def name_problem(name: str, rule: NameRule = "DNS-1035 label", *, limit: int | None = None) -> str | None:
    """Why ``name`` breaks ``rule`` (at most ``limit`` characters, when a suffix will be added), or None.

    The one wording of Kubernetes' name rules: DNS-1035 labels name pod hostnames and Services, DNS-1123
    labels namespaces, DNS-1123 subdomains most other objects (PVCs, Secrets, PriorityClasses).
    """
    pattern, longest, words = NAME_RULES[rule]
    limit = longest if limit is None else limit
    if len(name) > limit:
        most = f"a {rule} has at most {limit}" if limit == longest else f"at most {limit} fit here"
        return f"is {len(name)} characters; {most} (shorten the name)"
    if not pattern.match(name):
        return f"is not a {rule} ({words})"
    return None


def is_label_value(value: str) -> bool:
    return len(value) <= 63 and bool(LABEL_VALUE.match(value))


def is_label_key(key: str) -> bool:
    """``[prefix/]name``: prefix a DNS-1123 subdomain, name at most 63 characters."""
    prefix, _, name = key.rpartition("/")
    if prefix and name_problem(prefix, "DNS-1123 subdomain"):
        return False
    return len(name) <= 63 and bool(LABEL_NAME.match(name))


def labels_errors(path: str, labels: Mapping[str, str], *, values: bool = True) -> list[FieldError]:
    """Label keys (and, with ``values``, label values); annotations check keys only."""
    errors = []
    for key, value in labels.items():
        if not is_label_key(key):
            errors.append(invalid(f"{path}.{key}", f"{key!r} is not a label key ([prefix/]name)"))
        elif values and not is_label_value(value):
            errors.append(invalid(f"{path}.{key}", f"{value!r} is not a label value (at most 63 of A-Z a-z 0-9 -_.)"))
    return errors
