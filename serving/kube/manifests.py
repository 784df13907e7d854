"""Kubernetes manifests that serve an exported model with TensorFlow Serving.

Two ways to run the same model, as plain dicts ready for ``kubectl apply``:

* ``tf_serving_manifests``: ConfigMap (monitoring, batching), Deployment,
  Service and HorizontalPodAutoscaler, for any cluster.
* ``kserve_manifests``: the ConfigMap and a KServe ``InferenceService`` that
  runs the same TF Serving release through KServe's tensorflow runtime.

Both serve TF Serving's Prometheus metrics. The builders are pure; the only
side effect, ``write_manifests``, replaces its output file atomically.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import fields
from pathlib import Path
from typing import Any

from hvdk8s.common import atomic, files
from hvdk8s.serving.kube.options import (
    GRPC_PORT,
    METRICS_PATH,
    REST_PORT,
    Batching,
    ServingOptions,
)

CONFIG_DIR = "/etc/tfserving"
MODELS_DIR = "/models"
MONITORING_FILE = "monitoring_config.txt"
BATCHING_FILE = "batching_parameters.txt"
GPU_RESOURCE = "nvidia.com/gpu"
RUNAS_UID = 1000  # the non-root user KServe's own TF Serving runtime uses
Manifest = dict[str, Any]


def monitoring_config_text() -> str:
    """TF Serving's MonitoringConfig (text proto) serving metrics on the REST port."""
    return f'prometheus_config {{\n  enable: true\n  path: "{METRICS_PATH}"\n}}\n'


def batching_parameters_text(batching: Batching) -> str:
    """TF Serving's BatchingParameters (text proto; every field is an Int64Value)."""
    return "".join(f"{f.name} {{ value: {getattr(batching, f.name)} }}\n" for f in fields(batching))


def labels(opts: ServingOptions) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "tensorflow-serving",
        "app.kubernetes.io/instance": opts.name,
        "app.kubernetes.io/component": "model-server",
        "app.kubernetes.io/part-of": "hvdk8s",
        "app.kubernetes.io/managed-by": "hvdk8s",
    }


def selector(opts: ServingOptions) -> dict[str, str]:
    """The stable subset of the labels: a Deployment's selector cannot change."""
    return {k: labels(opts)[k] for k in ("app.kubernetes.io/name", "app.kubernetes.io/instance")}


def _metadata(opts: ServingOptions, name: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if opts.namespace:
        meta["namespace"] = opts.namespace
    meta["labels"] = labels(opts)
    return meta


def config_map_name(opts: ServingOptions) -> str:
    return f"{opts.name}-tfserving"


def config_map(opts: ServingOptions) -> Manifest:
    data = {MONITORING_FILE: monitoring_config_text()}
    if opts.batching is not None:
        data[BATCHING_FILE] = batching_parameters_text(opts.batching)
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _metadata(opts, config_map_name(opts)), "data": data}


def tf_serving_args(opts: ServingOptions) -> list[str]:
    """Flags past the ones a runtime already sets (KServe sets ports, name, path)."""
    args = [f"--monitoring_config_file={CONFIG_DIR}/{MONITORING_FILE}"]
    if opts.batching is not None:
        args += ["--enable_batching=true", f"--batching_parameters_file={CONFIG_DIR}/{BATCHING_FILE}"]
    return args


def model_base_path(opts: ServingOptions) -> str:
    """Where TF Serving looks for version folders (a mounted volume or gs://)."""
    return opts.storage_uri if opts.storage_uri is not None else f"{MODELS_DIR}/{opts.model_base_path}"


def resource_requirements(opts: ServingOptions) -> dict[str, dict[str, Any]]:
    res = opts.resources
    requests: dict[str, Any] = {"cpu": res.cpu_request, "memory": res.memory_request}
    limits: dict[str, Any] = {}
    if res.cpu_limit is not None:
        limits["cpu"] = res.cpu_limit
    if res.memory_limit is not None:
        limits["memory"] = res.memory_limit
    if res.gpus:
        # Extended resources are set as limits; Kubernetes copies them to requests.
        limits[GPU_RESOURCE] = res.gpus
    return {"requests": requests, "limits": limits} if limits else {"requests": requests}


def _gpu_tolerations(opts: ServingOptions) -> list[dict[str, str]]:
    """GPU node pools are commonly tainted with the GPU resource name."""
    return [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}] if opts.resources.gpus else []


def _config_volume(opts: ServingOptions) -> dict[str, Any]:
    return {"name": "tfserving-config", "configMap": {"name": config_map_name(opts)}}


def _config_mount() -> dict[str, Any]:
    return {"name": "tfserving-config", "mountPath": CONFIG_DIR, "readOnly": True}


def _status_probe(opts: ServingOptions, period: int, failures: int) -> dict[str, Any]:
    # The model's readiness, not just the process's: TF Serving opens its ports only once the first version
    # has loaded, and GET /v1/models/NAME/metadata reads the newest loaded version (get_model_metadata_impl.cc:
    # GetServableHandle), so it is 404 once none is left. The status endpoint would stay 200: it lists
    # unloaded versions too, in state END (get_model_status_impl.cc).
    return {
        "httpGet": {"path": f"/v1/models/{opts.name}/metadata", "port": "http"},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def _container(opts: ServingOptions) -> dict[str, Any]:
    mounts = [_config_mount()]
    if opts.storage_uri is None:
        mounts.append({"name": "model-store", "mountPath": MODELS_DIR, "readOnly": True})
    return {
        "name": "tensorflow-serving",
        "image": opts.image,
        # The image's entrypoint script adds its own --model_name/--port flags.
        "command": ["/usr/bin/tensorflow_model_server"],
        "args": [
            f"--port={GRPC_PORT}",
            f"--rest_api_port={REST_PORT}",
            f"--model_name={opts.name}",
            f"--model_base_path={model_base_path(opts)}",
            *tf_serving_args(opts),
        ],
        "ports": [
            {"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"},
            {"name": "http", "containerPort": REST_PORT, "protocol": "TCP"},
        ],
        # Startup allows 5 minutes to load a large model before liveness counts;
        # liveness only asks whether the server still accepts connections.
        "startupProbe": _status_probe(opts, period=10, failures=30),
        "readinessProbe": _status_probe(opts, period=10, failures=3),
        "livenessProbe": {"tcpSocket": {"port": "grpc"}, "periodSeconds": 20, "timeoutSeconds": 5, "failureThreshold": 3},
        "resources": resource_requirements(opts),
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": mounts,
    }


def _config_checksum(opts: ServingOptions) -> str:
    """Pods restart when the ConfigMap changes (kubelet would not reread flags)."""
    data = json.dumps(config_map(opts)["data"], sort_keys=True).encode()
    return hashlib.sha256(data).hexdigest()


def deployment(opts: ServingOptions) -> Manifest:
    volumes = [_config_volume(opts)]
    if opts.storage_uri is None:
        volumes.append({"name": "model-store", "persistentVolumeClaim": {"claimName": opts.pvc_claim, "readOnly": True}})
    pod_spec: dict[str, Any] = {
        "securityContext": {"runAsNonRoot": True, "runAsUser": RUNAS_UID, "runAsGroup": RUNAS_UID,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [_container(opts)],
        "volumes": volumes,
    }
    if tolerations := _gpu_tolerations(opts):
        pod_spec["tolerations"] = tolerations
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(opts, opts.name),
        # No spec.replicas: the HorizontalPodAutoscaler owns the count, and a
        # re-apply must not reset it.
        "spec": {
            "selector": {"matchLabels": selector(opts)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {
                    "labels": labels(opts),
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(REST_PORT),
                        "prometheus.io/path": METRICS_PATH,
                        "checksum/config": _config_checksum(opts),
                    },
                },
                "spec": pod_spec,
            },
        },
    }


def service(opts: ServingOptions) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(opts, opts.name),
        "spec": {
            "type": "ClusterIP",
            "selector": selector(opts),
            "ports": [
                {"name": "grpc", "port": GRPC_PORT, "targetPort": "grpc", "protocol": "TCP", "appProtocol": "grpc"},
                {"name": "http", "port": REST_PORT, "targetPort": "http", "protocol": "TCP", "appProtocol": "http"},
            ],
        },
    }


def horizontal_pod_autoscaler(opts: ServingOptions) -> Manifest:
    auto = opts.autoscaling
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": _metadata(opts, opts.name),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": opts.name},
            "minReplicas": auto.min_replicas,
            "maxReplicas": auto.max_replicas,
            "metrics": [{
                "type": "Resource",
                "resource": {
                    "name": auto.scale_metric,
                    "target": {"type": "Utilization", "averageUtilization": auto.scale_target},
                },
            }],
        },
    }


def inference_service(opts: ServingOptions) -> Manifest:
    """KServe v1beta1 InferenceService on KServe's TF Serving runtime.

    KServe appends ``model.args`` to its runtime's flags and swaps the image
    tag for ``runtimeVersion``, so this runs the same TF Serving release and
    config files as the plain Deployment.
    """
    auto = opts.autoscaling
    storage_uri = opts.storage_uri or f"pvc://{opts.pvc_claim}/{opts.model_base_path}"
    model = {
        "modelFormat": {"name": "tensorflow"},
        "runtimeVersion": opts.image_tag,
        "storageUri": storage_uri,
        "args": tf_serving_args(opts),
        "resources": resource_requirements(opts),
        "volumeMounts": [_config_mount()],
    }
    predictor: dict[str, Any] = {
        "minReplicas": auto.min_replicas,
        "maxReplicas": auto.max_replicas,
        "scaleMetric": auto.scale_metric,
        "scaleTarget": auto.scale_target,
    }
    if opts.logger_url is not None:
        predictor["logger"] = {"mode": opts.logger_mode, "url": opts.logger_url}
    predictor["model"] = model
    # No GPU tolerations here: Knative rejects pod tolerations unless its
    # kubernetes.podspec-tolerations flag is on.
    predictor["volumes"] = [_config_volume(opts)]
    meta = _metadata(opts, opts.name)
    # KServe's runtime declares metrics on its REST port (8080) at /metrics;
    # TF Serving serves them at METRICS_PATH, so the path is overridden here.
    meta["annotations"] = {
        "serving.kserve.io/enable-prometheus-scraping": "true",
        "prometheus.kserve.io/path": METRICS_PATH,
    }
    return {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService", "metadata": meta,
            "spec": {"predictor": predictor}}


def tf_serving_manifests(opts: ServingOptions) -> list[Manifest]:
    """ConfigMap first: the Deployment's pods mount it."""
    return [config_map(opts), deployment(opts), service(opts), horizontal_pod_autoscaler(opts)]


def kserve_manifests(opts: ServingOptions) -> list[Manifest]:
    return [config_map(opts), inference_service(opts)]


def render(opts: ServingOptions) -> list[Manifest]:
    """The manifests for the target ``opts.kserve`` selects."""
    return kserve_manifests(opts) if opts.kserve else tf_serving_manifests(opts)


def to_yaml(manifests: list[Manifest]) -> str:
    """One multi-document YAML stream, in order, for ``kubectl apply -f``."""
    header = "# Rendered by `hvdk8s serving-manifests`: regenerate rather than edit.\n"
    return header + "---\n" + files.to_yaml(*manifests)


def output_name(opts: ServingOptions) -> str:
    return f"{opts.name}-{'kserve' if opts.kserve else 'tfserving'}.yaml"


def write_manifests(opts: ServingOptions, out_dir: Path) -> Path:
    """Write ``OUT_DIR/NAME-{tfserving,kserve}.yaml`` atomically and return it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / output_name(opts)
    atomic.write_text(target, to_yaml(render(opts)))
    return target
