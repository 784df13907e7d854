"""Typed, validated options for the TensorFlow Serving / KServe manifests.

Validation happens when the options object is built, so no manifest is ever
rendered from options a cluster would reject (or silently misread). Every
error names the option's path, e.g. ``autoscaling.min_replicas``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, fields, is_dataclass
from decimal import Decimal
from typing import Any, NoReturn

from hvdk8s.errors import UserError
from hvdk8s.k8s import name_problem

# tensorflow/serving publishes X.Y.Z and X.Y.Z-gpu tags per TF Serving release.
# 2.18.0 matches the TensorFlow 2.18 used for training; there is no 2.18.1
# TF Serving release (its version bump was never merged upstream).
TF_SERVING_VERSION = "2.18.0"
TF_SERVING_IMAGE = "tensorflow/serving"
GRPC_PORT = 8500
REST_PORT = 8501
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
        validate(self)

    @property
    def image(self) -> str:
        return f"{TF_SERVING_IMAGE}:{self.image_tag}"

    @property
    def image_tag(self) -> str:
        return self.tf_serving_version + ("-gpu" if self.resources.gpus else "")


def validate(opts: ServingOptions) -> None:
    """Raise UserError naming the first invalid option's path."""
    _check_types(opts, "")
    _check_name(opts)
    _check_source(opts)
    _check_resources(opts.resources)
    _check_autoscaling(opts.autoscaling, opts.kserve)
    if opts.batching is not None:
        _check_batching(opts.batching)
    _check_logger(opts)
    if not _VERSION.fullmatch(opts.tf_serving_version):
        _fail("tf_serving_version", f"{opts.tf_serving_version!r} is not a release number like {TF_SERVING_VERSION}")


_TYPES: dict[str, type] = {"str": str, "int": int, "bool": bool, "Resources": Resources,
                           "Autoscaling": Autoscaling, "Batching": Batching}


def _fail(path: str, message: str) -> NoReturn:
    raise UserError(f"{path}: {message}")


def _check_types(obj: Any, prefix: str) -> None:
    """Catch e.g. ``min_replicas="2"`` from API callers before it reaches YAML."""
    for f in fields(obj):
        value, path = getattr(obj, f.name), prefix + f.name
        kinds = [k.strip() for k in str(f.type).split("|")]
        if value is None and "None" in kinds:
            continue
        if not any(_is_a(value, _TYPES[k]) for k in kinds if k in _TYPES):
            _fail(path, f"expected {' or '.join(kinds)}, got {type(value).__name__} {value!r}")
        if is_dataclass(value):
            _check_types(value, path + ".")


def _is_a(value: Any, kind: type) -> bool:
    # bool is an int subclass: True must not pass as a replica count.
    return isinstance(value, kind) and (kind is bool or not isinstance(value, bool))


def _check_name(opts: ServingOptions) -> None:
    if problem := name_problem(opts.name, limit=KSERVE_NAME_MAX if opts.kserve else None):
        _fail("name", f"{opts.name!r} {problem}" + (" (KServe adds '-predictor' to it)" if opts.kserve else ""))
    if opts.namespace is not None and (problem := name_problem(opts.namespace, "DNS-1123 label")):
        _fail("namespace", f"{opts.namespace!r} {problem}")


def _check_source(opts: ServingOptions) -> None:
    if (opts.model_base_path is None) == (opts.storage_uri is None):
        _fail("model_base_path", "give exactly one model source: model_base_path (a folder on the "
              f"{opts.pvc_claim!r} volume) or storage_uri")
    if opts.model_base_path is not None:
        if not _REL_PATH.fullmatch(opts.model_base_path) or ".." in opts.model_base_path.split("/"):
            _fail("model_base_path", f"{opts.model_base_path!r} must be a relative path inside the volume "
                  "(letters, digits, '.', '_', '-', '/'; no leading '/', no '..')")
        if problem := name_problem(opts.pvc_claim, "DNS-1123 subdomain"):
            _fail("pvc_claim", f"{opts.pvc_claim!r} {problem}")
        return
    match = _URI.fullmatch(opts.storage_uri)
    schemes = KSERVE_URI_SCHEMES if opts.kserve else TF_SERVING_URI_SCHEMES
    if match is None or match.group(1) not in schemes:
        hint = "" if opts.kserve else (
            "; TF Serving images cannot read s3:// since 2.7, render with kserve (--kserve) for s3:// "
            "(its storage initializer downloads the model)")
        _fail("storage_uri", f"{opts.storage_uri!r} must look like SCHEME://BUCKET/PATH with SCHEME one of "
              f"{', '.join(schemes)}{hint}")


def _quantity(path: str, text: str) -> Decimal:
    from kubernetes.utils.quantity import parse_quantity

    try:
        value = parse_quantity(text)
    except ValueError:
        _fail(path, f"{text!r} is not a Kubernetes quantity (e.g. 500m, 2, 512Mi, 4Gi)")
    if value <= 0:
        _fail(path, f"{text!r} must be positive")
    return value


def _check_resources(res: Resources) -> None:
    for kind in ("cpu", "memory"):
        request = _quantity(f"resources.{kind}_request", getattr(res, f"{kind}_request"))
        limit_text = getattr(res, f"{kind}_limit")
        if limit_text is not None and _quantity(f"resources.{kind}_limit", limit_text) < request:
            _fail(f"resources.{kind}_limit", f"{limit_text!r} is below resources.{kind}_request "
                  f"({getattr(res, f'{kind}_request')!r}); Kubernetes rejects such a pod")
    if res.gpus < 0:
        _fail("resources.gpus", f"{res.gpus} must be 0 (CPU only) or a positive GPU count")


def _check_autoscaling(auto: Autoscaling, kserve: bool) -> None:
    lowest = 0 if kserve else 1  # scale to zero exists only with KServe (Knative)
    if auto.min_replicas < lowest:
        _fail("autoscaling.min_replicas", f"{auto.min_replicas} must be at least {lowest}"
              + ("" if kserve else " (only KServe scales to zero)"))
    if auto.max_replicas < max(1, auto.min_replicas):
        _fail("autoscaling.max_replicas", f"{auto.max_replicas} must be at least 1 and at least "
              f"autoscaling.min_replicas ({auto.min_replicas})")
    metrics = KSERVE_SCALE_METRICS if kserve else HPA_SCALE_METRICS
    if auto.scale_metric not in metrics:
        hint = "" if kserve or auto.scale_metric not in KSERVE_SCALE_METRICS else (
            " (concurrency and rps need KServe's Knative autoscaler: render with kserve (--kserve))")
        _fail("autoscaling.scale_metric", f"{auto.scale_metric!r} is not one of {', '.join(metrics)}{hint}")
    if auto.scale_target < 1:
        _fail("autoscaling.scale_target", f"{auto.scale_target} must be a positive integer")


def _check_batching(batching: Batching) -> None:
    for f in fields(batching):
        value, lowest = getattr(batching, f.name), 0 if f.name == "batch_timeout_micros" else 1
        if value < lowest:
            _fail(f"batching.{f.name}", f"{value} must be at least {lowest}")


def _check_logger(opts: ServingOptions) -> None:
    if opts.logger_mode not in LOGGER_MODES:
        _fail("logger_mode", f"{opts.logger_mode!r} is not one of {', '.join(LOGGER_MODES)}")
    if opts.logger_url is None:
        return
    if not opts.kserve:
        _fail("logger_url", "the request logger is a KServe feature: render with kserve (--kserve)")
    match = _URI.fullmatch(opts.logger_url)
    if match is None or match.group(1) not in ("http", "https"):
        _fail("logger_url", f"{opts.logger_url!r} must be an http:// or https:// URL (KServe posts CloudEvents to it)")
