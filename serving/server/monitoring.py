"""``--monitoring_config_file``: Prometheus metrics on the REST port, where TF Serving puts them.

The file is TF Serving's text-format ``MonitoringConfig``
(tensorflow_serving/config/monitoring_config.proto, rebuilt here as the
``tensorflow-serving-api`` wheel lacks it): ``prometheus_config { enable:
true, path: "..." }``, the path defaulting to
``/monitoring/prometheus/metrics`` (``kPrometheusPath``,
model_servers/http_server.cc). The metric names follow TF Serving's
(``/tensorflow/serving/request_count`` exported as
``:tensorflow:serving:request_count``, prometheus_exporter.cc's renaming;
the Prometheus client adds ``_total`` to the counter), REST and gRPC
requests alike (``entrypoint``).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

DEFAULT_PATH = "/monitoring/prometheus/metrics"


@dataclass(frozen=True)
class PrometheusConfig:
    enable: bool = False
    path: str = DEFAULT_PATH


def parse_config(text: str, source: str) -> PrometheusConfig:
    from hvdk8s.serving.server import textproto

    message = textproto.parse(text, _message_class()(), source, "tensorflow.serving.MonitoringConfig")
    path = message.prometheus_config.path or DEFAULT_PATH
    if not path.startswith("/"):
        raise ValueError(f"{source}: prometheus_config.path {path!r} must start with /")
    return PrometheusConfig(message.prometheus_config.enable, path)


def read_config(path: str | os.PathLike[str]) -> PrometheusConfig:
    from hvdk8s.serving.server import textproto

    return parse_config(*textproto.read(path, "--monitoring_config_file"))


class Metrics:
    """Request counts and latencies by model, API and outcome, both front ends alike."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._count = Counter(":tensorflow:serving:request_count", "The total number of requests.",
                              ["model_name", "status"], registry=self.registry)
        self._latency = Histogram(":tensorflow:serving:request_latency",
                                  "Distribution of wall time (in microseconds) for a request.",
                                  ["model_name", "API", "entrypoint"], registry=self.registry,
                                  buckets=[10 * 1.8**i for i in range(33)])

    def observe(self, model: str, api: str, entrypoint: str, code: str, seconds: float) -> None:
        self._count.labels(model, code).inc()
        self._latency.labels(model, api, entrypoint).observe(seconds * 1e6)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def _message_class() -> type:
    """tensorflow.serving.MonitoringConfig's prometheus_config part (monitoring_config.proto)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="hvdk8s/monitoring_config.proto", package="tensorflow.serving",
                                               syntax="proto3")
    prometheus = proto.message_type.add(name="PrometheusConfig")
    prometheus.field.add(name="enable", number=1, type=F.TYPE_BOOL, label=F.LABEL_OPTIONAL)
    prometheus.field.add(name="path", number=2, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    config = proto.message_type.add(name="MonitoringConfig")
    config.field.add(name="prometheus_config", number=1, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                     type_name=".tensorflow.serving.PrometheusConfig")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.serving.MonitoringConfig"))
