"""Typed, validated options for the TensorFlow Serving / KServe manifests.

Validation happens when the options object is built, so no manifest is ever
rendered from options a cluster would reject (or silently misread). ``validate``
returns every problem as a field error, under the path and in the spelling its
caller's users write (Python names, a pipeline file's keys, the CLI's flags).
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields, is_dataclass
from decimal import Decimal
from typing import Any

from hvdk8s.common.fields import FieldError, SpecError, invalid, join, name_problem, required
from hvdk8s.serving.api.address import GRPC_PORT as GRPC_PORT, REST_PORT as REST_PORT  # TF Serving's, the container's

# tensorflow/serving publishes X.Y.Z and X.Y.Z-gpu tags per TF Serving release: an X.Y.0 built on each
# TensorFlow X.Y (2.18.0 through 2.21.0), patch releases for some (2.19.1; never 2.18.1).
TF_SERVING_VERSION = "2.21.0"
"""The release matching the default stack's TensorFlow (2.21, what `make setup` and the GPU image export with):
``ServingOptions``' default, and the command line's where no TensorFlow is installed."""
TF_SERVING_IMAGE = "tensorflow/serving"
METRICS_PATH = "/monitoring/prometheus/metrics"

# The HorizontalPodAutoscaler scales a plain Deployment on resource metrics;
# KServe (scaleMetric, an enum in its CRD) adds Knative's request metrics.
HPA_SCALE_METRICS = ("cpu", "memory")
KSERVE_SCALE_METRICS = ("cpu", "memory", "concurrency", "rps")
LOGGER_MODES = ("all", "request", "response")
# TF Serving reads gs:// itself; s3:// left the TF Serving images in 2.7
# (tensorflow/serving#1963), so only KServe's storage initializer takes it.
TF_SERVING_URI_SCHEMES = ("gs",)
KSERVE_URI_SCHEMES = ("gs", "s3", "pvc", "https", "http", "hdfs", "webhdfs")
# KServe names the predictor Service "<name>-predictor": a 63-char DNS label.
KSERVE_NAME_MAX = 63 - len("-predictor")

_REL_PATH = re.compile(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*")
_URI = re.compile(r"([a-z][a-z0-9+.-]*)://([^/\s]+)(/\S*)?")
_VERSION = re.compile(r"\d+\.\d+\.\d+")


def tf_serving_release(tensorflow_version: str) -> str:
    """The TF Serving release built on TensorFlow ``tensorflow_version``'s major.minor: 2.21.1 -> 2.21.0.

    TF Serving loads SavedModels its own TensorFlow can run; one built on an
    older TensorFlow can lack ops (or op attributes) a newer one writes.
    """
    match = re.match(r"(\d+)\.(\d+)", tensorflow_version)
    if match is None:
        raise ValueError(f"TensorFlow version {tensorflow_version!r}: expected MAJOR.MINOR[.PATCH]")
    return f"{match[1]}.{match[2]}.0"


def installed_tf_serving_version() -> str:
    """The release matching the TensorFlow installed here, the one ``hvdk8s export`` writes SavedModels with,
    from the metadata of the distribution whose top-level package is ``tensorflow`` (``tensorflow``,
    ``tensorflow-cpu``, ...; importing it takes seconds); ``TF_SERVING_VERSION`` where there is none.
    The command lines' default, read there, never while rendering."""
    from importlib import metadata

    version = next((d.version for d in metadata.distributions()
                    if "tensorflow" in (d.read_text("top_level.txt") or "").split()), None)
    return TF_SERVING_VERSION if version is None else tf_serving_release(version)


@dataclass(frozen=True)
class Resources:
    """Per-pod compute. Requests also anchor the HPA's utilisation percentages."""

    cpu_request: str = "500m"
    memory_request: str = "1Gi"
    cpu_limit: str | None = "2"
    memory_limit: str | None = "2Gi"
    gpus: int = 0


@dataclass(frozen=True)
class Autoscaling:
    """Replica bounds and the metric the autoscaler holds at ``scale_target``.

    For cpu/memory the target is a utilisation percentage of the requests; for
    KServe's concurrency/rps it is in-flight requests / requests per second.
    """

    min_replicas: int = 1
    max_replicas: int = 3
    scale_metric: str = "cpu"
    scale_target: int = 70


@dataclass(frozen=True)
class Batching:
    """TF Serving's server-side batching (its BatchingParameters proto)."""

    max_batch_size: int = 32
    batch_timeout_micros: int = 2000
    num_batch_threads: int = 4
    max_enqueued_batches: int = 100


@dataclass(frozen=True)
class ServingOptions:
    """Everything the manifests depend on; exactly one model source is set.

    ``model_base_path`` is the folder inside the ``pvc_claim`` volume that holds
    TF Serving's integer version folders; ``storage_uri`` replaces the volume.
    """

    name: str
    model_base_path: str | None = None
    storage_uri: str | None = None
    pvc_claim: str = "model-store"
    namespace: str | None = None
    tf_serving_version: str = TF_SERVING_VERSION
    resources: Resources = field(default_factory=Resources)
    autoscaling: Autoscaling = field(default_factory=Autoscaling)
    batching: Batching | None = None
    kserve: bool = False
    logger_url: str | None = None
    logger_mode: str = "all"

    def __post_init__(self) -> None:
        if errors := validate(self):
            raise OptionsError(self, errors)

    @property
    def image(self) -> str:
        return f"{TF_SERVING_IMAGE}:{self.image_tag}"

    @property
    def image_tag(self) -> str:
        return self.tf_serving_version + ("-gpu" if self.resources.gpus else "")


class OptionsError(SpecError):
    """Invalid serving options, every problem listed under their Python names; ``options`` are the options
    as given, for a caller whose users name them otherwise (``validate(err.options, path, spell)``)."""

    def __init__(self, options: ServingOptions, field_errors: list[FieldError]):
        super().__init__("serving options", field_errors)
        self.options = options


def validate(opts: ServingOptions, path: str = "", spell: Callable[[str], str] = str) -> list[FieldError]:
    """Every problem of ``opts``, each at ``path`` plus the option as ``spell`` writes its dotted Python name
    (``autoscaling.min_replicas`` as is by default; a pipeline file's ``autoscaling.minReplicas``; a flag).

    Other options a problem refers to are written the same way, so a pipeline file's or a command
    line's user reads only the names they typed. Values are judged only once every type is right.
    """
    def at(option: str) -> str:
        return join(path, spell(option))

    if errors := _check_types(opts, "", at):
        return errors
    return [
        *_check_name(opts, at),
        *_check_source(opts, at),
        *_check_resources(opts.resources, at),
        *_check_autoscaling(opts.autoscaling, opts.kserve, at),
        *(_check_batching(opts.batching, at) if opts.batching is not None else ()),
        *_check_logger(opts, at),
        *([] if _VERSION.fullmatch(opts.tf_serving_version) else [invalid(
            at("tf_serving_version"), f"{opts.tf_serving_version!r} is not a release number like {TF_SERVING_VERSION}")]),
    ]


_TYPES: dict[str, type] = {"str": str, "int": int, "bool": bool, "Resources": Resources,
                           "Autoscaling": Autoscaling, "Batching": Batching}
At = Callable[[str], str]  # an option's dotted Python name -> its path as the user writes it


def _check_types(obj: Any, prefix: str, at: At) -> list[FieldError]:
    """Catch e.g. ``min_replicas="2"`` from API callers before it reaches YAML."""
    errors = []
    for f in fields(obj):
        value, option = getattr(obj, f.name), prefix + f.name
        kinds = [k.strip() for k in str(f.type).split("|")]
        if value is None and "None" in kinds:
            continue
        if not any(_is_a(value, _TYPES[k]) for k in kinds if k in _TYPES):
            errors.append(FieldError("TypeInvalid", at(option),
                                     f"expected {' or '.join(kinds)}, got {type(value).__name__} {value!r}"))
        elif is_dataclass(value):
            errors += _check_types(value, option + ".", at)
    return errors


def _is_a(value: Any, kind: type) -> bool:
    # bool is an int subclass: True must not pass as a replica count.
    return isinstance(value, kind) and (kind is bool or not isinstance(value, bool))


def _check_name(opts: ServingOptions, at: At) -> list[FieldError]:
    errors = []
    if problem := name_problem(opts.name, limit=KSERVE_NAME_MAX if opts.kserve else None):
        errors.append(invalid(at("name"), f"{opts.name!r} {problem}"
                              + (" (KServe adds '-predictor' to it)" if opts.kserve else "")))
    if opts.namespace is not None and (problem := name_problem(opts.namespace, "DNS-1123 label")):
        errors.append(invalid(at("namespace"), f"{opts.namespace!r} {problem}"))
    return errors


def _check_source(opts: ServingOptions, at: At) -> list[FieldError]:
    sources = f"{at('model_base_path')} (a folder on the {opts.pvc_claim!r} volume) or {at('storage_uri')}"
    if opts.model_base_path is None and opts.storage_uri is None:
        return [required(at("model_base_path"), f"give the model's location: {sources}")]
    if opts.model_base_path is not None and opts.storage_uri is not None:
        return [invalid(at("model_base_path"), f"give either {sources}, not both")]
    if opts.model_base_path is not None:
        errors = []
        if not _REL_PATH.fullmatch(opts.model_base_path) or ".." in opts.model_base_path.split("/"):
            errors.append(invalid(at("model_base_path"), f"{opts.model_base_path!r} must be a relative path inside "
                                  "the volume (letters, digits, '.', '_', '-', '/'; no leading '/', no '..')"))
        if problem := name_problem(opts.pvc_claim, "DNS-1123 subdomain"):
            errors.append(invalid(at("pvc_claim"), f"{opts.pvc_claim!r} {problem}"))
        return errors
    match = _URI.fullmatch(opts.storage_uri or "")
    schemes = KSERVE_URI_SCHEMES if opts.kserve else TF_SERVING_URI_SCHEMES
    if match is None or match.group(1) not in schemes:
        hint = "" if opts.kserve else (
            f"; TF Serving images cannot read s3:// since 2.7, render with {at('kserve')} for s3:// "
            "(its storage initializer downloads the model)")
        return [invalid(at("storage_uri"), f"{opts.storage_uri!r} must look like SCHEME://BUCKET/PATH with SCHEME "
                        f"one of {', '.join(schemes)}{hint}")]
    return []


def _quantity(option: str, text: str, at: At, errors: list[FieldError]) -> Decimal | None:
    """``text`` as a positive quantity, or None after adding why it is not one to ``errors``."""
    from kubernetes.utils.quantity import parse_quantity

    try:
        value = parse_quantity(text)
    except ValueError:
        errors.append(invalid(at(option), f"{text!r} is not a Kubernetes quantity (e.g. 500m, 2, 512Mi, 4Gi)"))
        return None
    if value <= 0:
        errors.append(invalid(at(option), f"{text!r} must be positive"))
        return None
    return value


def _check_resources(res: Resources, at: At) -> list[FieldError]:
    errors: list[FieldError] = []
    for kind in ("cpu", "memory"):
        request_text, limit_text = getattr(res, f"{kind}_request"), getattr(res, f"{kind}_limit")
        request = _quantity(f"resources.{kind}_request", request_text, at, errors)
        limit = None if limit_text is None else _quantity(f"resources.{kind}_limit", limit_text, at, errors)
        if request is not None and limit is not None and limit < request:
            errors.append(invalid(at(f"resources.{kind}_limit"), f"{limit_text!r} is below "
                                  f"{at(f'resources.{kind}_request')} ({request_text!r}); Kubernetes rejects such a pod"))
    if res.gpus < 0:
        errors.append(invalid(at("resources.gpus"), f"{res.gpus} must be 0 (CPU only) or a positive GPU count"))
    return errors


def _check_autoscaling(auto: Autoscaling, kserve: bool, at: At) -> list[FieldError]:
    errors = []
    lowest = 0 if kserve else 1  # scale to zero exists only with KServe (Knative)
    if auto.min_replicas < lowest:
        errors.append(invalid(at("autoscaling.min_replicas"), f"{auto.min_replicas} must be at least {lowest}"
                              + ("" if kserve else " (only KServe scales to zero)")))
    if auto.max_replicas < max(1, auto.min_replicas):
        errors.append(invalid(at("autoscaling.max_replicas"), f"{auto.max_replicas} must be at least 1 and at least "
                              f"{at('autoscaling.min_replicas')} ({auto.min_replicas})"))
    metrics = KSERVE_SCALE_METRICS if kserve else HPA_SCALE_METRICS
    if auto.scale_metric not in metrics:
        hint = "" if kserve or auto.scale_metric not in KSERVE_SCALE_METRICS else (
            f" (concurrency and rps need KServe's Knative autoscaler: render with {at('kserve')})")
        errors.append(FieldError("NotSupported", at("autoscaling.scale_metric"),
                                 f"{auto.scale_metric!r} is not one of {', '.join(metrics)}{hint}"))
    if auto.scale_target < 1:
        errors.append(invalid(at("autoscaling.scale_target"), f"{auto.scale_target} must be a positive integer"))
    return errors


def _check_batching(batching: Batching, at: At) -> list[FieldError]:
    errors = []
    for f in fields(batching):
        value, lowest = getattr(batching, f.name), 0 if f.name == "batch_timeout_micros" else 1
        if value < lowest:
            errors.append(invalid(at(f"batching.{f.name}"), f"{value} must be at least {lowest}"))
    return errors


def _check_logger(opts: ServingOptions, at: At) -> list[FieldError]:
    errors = []
    if opts.logger_mode not in LOGGER_MODES:
        errors.append(FieldError("NotSupported", at("logger_mode"),
                                 f"{opts.logger_mode!r} is not one of {', '.join(LOGGER_MODES)}"))
    if opts.logger_url is None:
        return errors
    if not opts.kserve:
        errors.append(invalid(at("logger_url"), f"the request logger is a KServe feature: render with {at('kserve')}"))
    match = _URI.fullmatch(opts.logger_url)
    if match is None or match.group(1) not in ("http", "https"):
        errors.append(invalid(at("logger_url"), f"{opts.logger_url!r} must be an http:// or https:// URL (KServe "
                              "posts CloudEvents to it)"))
    return errors
