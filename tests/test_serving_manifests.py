"""TF Serving / KServe manifests: exact objects, real schemas, option errors, CLI, examples.

Kubernetes objects are validated with ``kubernetes-validate`` (the upstream
OpenAPI schemas of each Kubernetes release, shipped in the wheel, strict mode:
unknown fields fail). The KServe InferenceService's embedded Kubernetes types
(container, resources, volumes) are validated the same way; the KServe fields
themselves need the InferenceService CRD in ``../shared/schemas`` (see
``KSERVE_CRD``) and that test is skipped, saying so, where it is absent.
"""
from __future__ import annotations

import argparse
import copy
import difflib
from dataclasses import replace
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from hvdk8s.common.errors import UserError
from hvdk8s.common.fields import SpecError
from hvdk8s.serving.kube import cli as manifests_cli, manifests
from hvdk8s.serving.kube.options import (
    TF_SERVING_VERSION,
    Autoscaling,
    Batching,
    OptionsError,
    Resources,
    ServingOptions,
    installed_tf_serving_version,
    tf_serving_release,
    validate,
)

from conftest import shared

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "serving" / "examples"
# in ../shared (conftest.shared)
KSERVE_CRD = "schemas/kserve-inferenceservice-crd.yaml"
MPIJOB_CRD = "schemas/mpijob-v2beta1-crd.yaml"
# Oldest and newest Kubernetes releases kubernetes-validate ships schemas for.
K8S_VERSIONS = ("1.25", "1.37")

# The checked-in examples and the CLI arguments that render them.
EXAMPLE_ARGS = {
    "digits-tfserving.yaml": ["digits", "--model-base-path", "digits"],
    "digits-gpu-tfserving.yaml": ["digits-gpu", "--storage-uri", "gs://my-bucket/models/digits", "--gpu",
                                  "--batching", "--min-replicas", "2", "--max-replicas", "8"],
    "digits-kserve.yaml": ["digits", "--model-base-path", "digits", "--kserve", "--scale-metric", "concurrency",
                           "--scale-target", "8", "--logger-url", "http://message-dumper.default.svc.cluster.local"],
}

LABELS = {
    "app.kubernetes.io/name": "tensorflow-serving",
    "app.kubernetes.io/instance": "digits",
    "app.kubernetes.io/component": "model-server",
    "app.kubernetes.io/part-of": "hvdk8s",
    "app.kubernetes.io/managed-by": "hvdk8s",
}
SELECTOR = {"app.kubernetes.io/name": "tensorflow-serving", "app.kubernetes.io/instance": "digits"}
MONITORING = 'prometheus_config {\n  enable: true\n  path: "/monitoring/prometheus/metrics"\n}\n'

# Option sets covering every branch of the builders.
VARIANTS = {
    "pvc": ServingOptions(name="digits", model_base_path="digits"),
    "gcs-gpu-batching": ServingOptions(name="digits", storage_uri="gs://b/digits", namespace="ml",
                                       resources=Resources(gpus=2, cpu_limit=None), batching=Batching()),
    "memory-hpa": ServingOptions(name="digits", model_base_path="m/digits",
                                 autoscaling=Autoscaling(scale_metric="memory", scale_target=80)),
    "kserve-pvc": ServingOptions(name="digits", model_base_path="digits", kserve=True,
                                 logger_url="http://logger.ml.svc", logger_mode="response"),
    "kserve-s3-gpu-batching": ServingOptions(name="digits", storage_uri="s3://b/digits", kserve=True,
                                             resources=Resources(gpus=1), batching=Batching(max_batch_size=8),
                                             autoscaling=Autoscaling(min_replicas=0, scale_metric="rps",
                                                                     scale_target=50)),
}


def k8s_validate(obj: dict[str, Any], version: str) -> None:
    kubernetes_validate.validate(obj, version, strict=True)


# KServe fields of a predictor (ComponentExtensionSpec, the implementation
# specs) and of ModelSpec on top of the Kubernetes Container it embeds.
KSERVE_PREDICTOR_KEYS = {"minReplicas", "maxReplicas", "scaleTarget", "scaleMetric", "logger", "model",
                         "containerConcurrency", "timeout", "canaryTrafficPercent", "batcher", "labels",
                         "annotations", "deploymentStrategy"}
KSERVE_MODEL_KEYS = {"modelFormat", "runtime", "runtimeVersion", "storageUri", "protocolVersion", "storage"}


def predictor_as_pod(isvc: dict[str, Any]) -> dict[str, Any]:
    """The Kubernetes part of a predictor: its PodSpec fields and model container."""
    predictor = isvc["spec"]["predictor"]
    container = {k: v for k, v in predictor["model"].items() if k not in KSERVE_MODEL_KEYS}
    spec = {k: v for k, v in predictor.items() if k not in KSERVE_PREDICTOR_KEYS}
    spec["containers"] = [{"name": "kserve-container", "image": "runtime-image", **container}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": isvc["metadata"]["name"]}, "spec": spec}


def _strict(node: Any) -> Any:
    """A CRD schema as the API server's strict field validation applies it."""
    if isinstance(node, dict):
        node = {k: _strict(v) for k, v in node.items()}
        if (node.get("type") == "object" and isinstance(node.get("properties"), dict)
                and "additionalProperties" not in node and not node.get("x-kubernetes-preserve-unknown-fields")):
            node["additionalProperties"] = False
    elif isinstance(node, list):
        node = [_strict(v) for v in node]
    return node


def crd_validator(path: Path, version: str) -> jsonschema.Draft7Validator:
    docs = [d for d in yaml.load_all(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) if d]
    crd = next(d for d in docs if d.get("kind") == "CustomResourceDefinition")
    schema = next(v["schema"]["openAPIV3Schema"] for v in crd["spec"]["versions"] if v["name"] == version)
    return jsonschema.Draft7Validator(_strict(schema))


def run_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="hvdk8s")
    manifests_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["serving-manifests", *argv])
    return args.handler(args)


# --- exact manifests ---------------------------------------------------------------------------


def test_default_tf_serving_manifests_exactly():
    opts = VARIANTS["pvc"]
    cm, dep, svc, hpa = manifests.tf_serving_manifests(opts)
    assert cm == {"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": {"name": "digits-tfserving", "labels": LABELS},
                  "data": {"monitoring_config.txt": MONITORING}}
    template = dep["spec"]["template"]
    assert dep["metadata"] == {"name": "digits", "labels": LABELS}
    assert "replicas" not in dep["spec"]  # the HPA owns it
    assert dep["spec"]["selector"] == {"matchLabels": SELECTOR}
    assert dep["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    assert template["metadata"]["labels"] == LABELS
    annotations = dict(template["metadata"]["annotations"])
    assert len(annotations.pop("checksum/config")) == 64
    assert annotations == {"prometheus.io/scrape": "true", "prometheus.io/port": "8501",
                           "prometheus.io/path": "/monitoring/prometheus/metrics"}
    status_probe = {"httpGet": {"path": "/v1/models/digits/metadata", "port": "http"}, "periodSeconds": 10, "timeoutSeconds": 5}
    assert template["spec"] == {
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{
            "name": "tensorflow-serving",
            "image": "tensorflow/serving:2.21.0",
            "command": ["/usr/bin/tensorflow_model_server"],
            "args": ["--port=8500", "--rest_api_port=8501", "--model_name=digits", "--model_base_path=/models/digits",
                     "--monitoring_config_file=/etc/tfserving/monitoring_config.txt"],
            "ports": [{"name": "grpc", "containerPort": 8500, "protocol": "TCP"},
                      {"name": "http", "containerPort": 8501, "protocol": "TCP"}],
            "startupProbe": {**status_probe, "failureThreshold": 30},
            "readinessProbe": {**status_probe, "failureThreshold": 3},
            "livenessProbe": {"tcpSocket": {"port": "grpc"}, "periodSeconds": 20, "timeoutSeconds": 5,
                              "failureThreshold": 3},
            "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "2Gi"}},
            "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
            "volumeMounts": [{"name": "tfserving-config", "mountPath": "/etc/tfserving", "readOnly": True},
                             {"name": "model-store", "mountPath": "/models", "readOnly": True}],
        }],
        "volumes": [{"name": "tfserving-config", "configMap": {"name": "digits-tfserving"}},
                    {"name": "model-store", "persistentVolumeClaim": {"claimName": "model-store", "readOnly": True}}],
    }
    assert svc == {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "digits", "labels": LABELS},
                   "spec": {"type": "ClusterIP", "selector": SELECTOR, "ports": [
                       {"name": "grpc", "port": 8500, "targetPort": "grpc", "protocol": "TCP", "appProtocol": "grpc"},
                       {"name": "http", "port": 8501, "targetPort": "http", "protocol": "TCP", "appProtocol": "http"}]}}
    assert hpa == {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
                   "metadata": {"name": "digits", "labels": LABELS},
                   "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "digits"},
                            "minReplicas": 1, "maxReplicas": 3,
                            "metrics": [{"type": "Resource", "resource": {
                                "name": "cpu", "target": {"type": "Utilization", "averageUtilization": 70}}}]}}


def test_gcs_gpu_batching_variant():
    opts = VARIANTS["gcs-gpu-batching"]
    cm, dep, svc, hpa = manifests.tf_serving_manifests(opts)
    assert {m["metadata"]["namespace"] for m in (cm, dep, svc, hpa)} == {"ml"}
    assert cm["data"] == {"monitoring_config.txt": MONITORING, "batching_parameters.txt": (
        "max_batch_size { value: 32 }\nbatch_timeout_micros { value: 2000 }\n"
        "num_batch_threads { value: 4 }\nmax_enqueued_batches { value: 100 }\n")}
    pod = dep["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == "tensorflow/serving:2.21.0-gpu"
    assert container["args"] == [
        "--port=8500", "--rest_api_port=8501", "--model_name=digits", "--model_base_path=gs://b/digits",
        "--monitoring_config_file=/etc/tfserving/monitoring_config.txt",
        "--enable_batching=true", "--batching_parameters_file=/etc/tfserving/batching_parameters.txt"]
    assert container["resources"] == {"requests": {"cpu": "500m", "memory": "1Gi"},
                                      "limits": {"memory": "2Gi", "nvidia.com/gpu": 2}}
    # gs:// is read by TF Serving itself: no model volume.
    assert container["volumeMounts"] == [{"name": "tfserving-config", "mountPath": "/etc/tfserving", "readOnly": True}]
    assert pod["volumes"] == [{"name": "tfserving-config", "configMap": {"name": "digits-tfserving"}}]
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def test_config_change_changes_the_pod_template():
    """A new batching config must roll the pods: flags are read only at start."""
    def checksum(opts: ServingOptions) -> str:
        return manifests.deployment(opts)["spec"]["template"]["metadata"]["annotations"]["checksum/config"]

    base = VARIANTS["pvc"]
    batched = replace(base, batching=Batching())
    assert len({checksum(base), checksum(batched), checksum(replace(batched, batching=Batching(max_batch_size=64)))}) == 3
    assert checksum(base) == checksum(replace(base, autoscaling=Autoscaling(max_replicas=9)))


def test_memory_hpa_variant():
    hpa = manifests.horizontal_pod_autoscaler(VARIANTS["memory-hpa"])
    assert hpa["spec"]["metrics"] == [{"type": "Resource", "resource": {
        "name": "memory", "target": {"type": "Utilization", "averageUtilization": 80}}}]
    assert "--model_base_path=/models/m/digits" in manifests.deployment(VARIANTS["memory-hpa"])[
        "spec"]["template"]["spec"]["containers"][0]["args"]


def test_kserve_inference_service_exactly():
    cm, isvc = manifests.kserve_manifests(VARIANTS["kserve-pvc"])
    assert cm == manifests.config_map(VARIANTS["kserve-pvc"])
    assert isvc == {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {"name": "digits", "labels": LABELS, "annotations": {
            "serving.kserve.io/enable-prometheus-scraping": "true",
            "prometheus.kserve.io/path": "/monitoring/prometheus/metrics"}},
        "spec": {"predictor": {
            "minReplicas": 1, "maxReplicas": 3, "scaleMetric": "cpu", "scaleTarget": 70,
            "logger": {"mode": "response", "url": "http://logger.ml.svc"},
            "model": {
                "modelFormat": {"name": "tensorflow"},
                "runtimeVersion": "2.21.0",
                "storageUri": "pvc://model-store/digits",
                "args": ["--monitoring_config_file=/etc/tfserving/monitoring_config.txt"],
                "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "2Gi"}},
                "volumeMounts": [{"name": "tfserving-config", "mountPath": "/etc/tfserving", "readOnly": True}],
            },
            "volumes": [{"name": "tfserving-config", "configMap": {"name": "digits-tfserving"}}],
        }},
    }


def test_kserve_gpu_s3_scale_to_zero_variant():
    predictor = manifests.inference_service(VARIANTS["kserve-s3-gpu-batching"])["spec"]["predictor"]
    assert (predictor["minReplicas"], predictor["scaleMetric"], predictor["scaleTarget"]) == (0, "rps", 50)
    assert "logger" not in predictor
    model = predictor["model"]
    assert (model["runtimeVersion"], model["storageUri"]) == ("2.21.0-gpu", "s3://b/digits")
    assert model["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert model["args"][1:] == ["--enable_batching=true",
                                 "--batching_parameters_file=/etc/tfserving/batching_parameters.txt"]


def test_yaml_is_one_stream_of_the_same_objects():
    for opts in VARIANTS.values():
        objects = manifests.render(opts)
        text = manifests.to_yaml(objects)
        assert list(yaml.safe_load_all(text)) == objects
        assert "monitoring_config.txt: |\n" in text  # config files stay readable


# --- TF Serving's config files parse as its protos ------------------------------------------------


def tf_serving_message(name: str):
    """A message class for TF Serving's config protos, built from their descriptors.

    The tensorflow-serving-api wheel ships neither proto, so the fields we write
    are transcribed from tensorflow/serving: config/monitoring_config.proto and
    servables/tensorflow/session_bundle_config.proto (BatchingParameters).
    """
    pytest.importorskip("google.protobuf")
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, wrappers_pb2

    f = descriptor_pb2.FieldDescriptorProto
    pool = descriptor_pool.DescriptorPool()
    pool.Add(descriptor_pb2.FileDescriptorProto.FromString(wrappers_pb2.DESCRIPTOR.serialized_pb))
    file = descriptor_pb2.FileDescriptorProto(name="tfs.proto", package="tensorflow.serving", syntax="proto3",
                                              dependency=["google/protobuf/wrappers.proto"])
    prometheus = file.message_type.add(name="PrometheusConfig")
    prometheus.field.add(name="enable", number=1, type=f.TYPE_BOOL, label=f.LABEL_OPTIONAL)
    prometheus.field.add(name="path", number=2, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    file.message_type.add(name="MonitoringConfig").field.add(
        name="prometheus_config", number=1, type=f.TYPE_MESSAGE, label=f.LABEL_OPTIONAL,
        type_name=".tensorflow.serving.PrometheusConfig")
    batching = file.message_type.add(name="BatchingParameters")
    for number, field_name in enumerate(("max_batch_size", "batch_timeout_micros", "max_enqueued_batches",
                                         "num_batch_threads"), start=1):
        batching.field.add(name=field_name, number=number, type=f.TYPE_MESSAGE, label=f.LABEL_OPTIONAL,
                           type_name=".google.protobuf.Int64Value")
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"tensorflow.serving.{name}"))


def test_config_files_parse_as_tf_serving_text_protos():
    from google.protobuf import text_format

    monitoring = text_format.Parse(manifests.monitoring_config_text(), tf_serving_message("MonitoringConfig")())
    assert (monitoring.prometheus_config.enable, monitoring.prometheus_config.path) == (
        True, "/monitoring/prometheus/metrics")
    batching = Batching(max_batch_size=64, batch_timeout_micros=0, num_batch_threads=3, max_enqueued_batches=7)
    params = text_format.Parse(manifests.batching_parameters_text(batching), tf_serving_message("BatchingParameters")())
    assert (params.max_batch_size.value, params.batch_timeout_micros.value, params.num_batch_threads.value,
            params.max_enqueued_batches.value) == (64, 0, 3, 7)
    # The classic mistake, a bare number for a wrapper-typed field, does not parse.
    with pytest.raises(text_format.ParseError):
        text_format.Parse("max_batch_size: 64\n", tf_serving_message("BatchingParameters")())


# --- real schema validation ----------------------------------------------------------------------


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_kubernetes_object_validates_against_upstream_schemas(variant, version):
    validated = []
    for obj in manifests.render(VARIANTS[variant]):
        if obj["kind"] == "InferenceService":
            obj = predictor_as_pod(obj)
        k8s_validate(obj, version)
        validated.append(obj["kind"])
    assert validated in (["ConfigMap", "Deployment", "Service", "HorizontalPodAutoscaler"], ["ConfigMap", "Pod"])


def _broken(kind: str, mutate) -> dict[str, Any]:
    obj = copy.deepcopy(next(o for o in manifests.render(VARIANTS["pvc"]) if o["kind"] == kind))
    mutate(obj)
    return obj


BROKEN = {
    "unknown top-level field": ("Deployment", lambda d: d["spec"].update(replica=2)),
    "port as a string": ("Deployment", lambda d: d["spec"]["template"]["spec"]["containers"][0]["ports"][0]
                         .update(containerPort="8500")),
    "probe handler misspelt": ("Deployment", lambda d: d["spec"]["template"]["spec"]["containers"][0]
                               ["readinessProbe"].update(httpget={"path": "/"})),
    "service port missing": ("Service", lambda s: s["spec"]["ports"][0].pop("port")),
    "hpa target type missing": ("HorizontalPodAutoscaler",
                                lambda h: h["spec"]["metrics"][0]["resource"]["target"].pop("type")),
    "hpa v1 field in v2": ("HorizontalPodAutoscaler", lambda h: h["spec"].update(targetCPUUtilizationPercentage=70)),
    "configmap data not strings": ("ConfigMap", lambda c: c["data"].update(x=1)),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_objects_fail_validation(case):
    kind, mutate = BROKEN[case]
    with pytest.raises(kubernetes_validate.ValidationError):
        k8s_validate(_broken(kind, mutate), K8S_VERSIONS[-1])


def test_broken_kserve_model_container_fails_validation():
    isvc = manifests.inference_service(VARIANTS["kserve-pvc"])
    isvc["spec"]["predictor"]["model"]["resources"]["limit"] = {"cpu": "1"}
    with pytest.raises(kubernetes_validate.ValidationError, match="limit"):
        k8s_validate(predictor_as_pod(isvc), K8S_VERSIONS[-1])
    isvc = manifests.inference_service(VARIANTS["kserve-pvc"])
    isvc["spec"]["predictor"]["volumes"][0]["configMap"]["name"] = 7
    with pytest.raises(kubernetes_validate.ValidationError):
        k8s_validate(predictor_as_pod(isvc), K8S_VERSIONS[-1])


def test_strict_crd_validation_rejects_unknown_and_mistyped_fields():
    """The CRD helper the KServe test uses, proven on a real CRD that is present."""
    validator = crd_validator(shared(MPIJOB_CRD), "v2beta1")
    job = {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "metadata": {"name": "j"},
           "spec": {"slotsPerWorker": 1, "mpiReplicaSpecs": {"Launcher": {"replicas": 1, "template": {
               "spec": {"containers": [{"name": "l", "image": "i"}]}}}}}}
    assert list(validator.iter_errors(job)) == []
    assert list(validator.iter_errors({**job, "spec": {**job["spec"], "slotsPerWorkr": 1}}))
    assert list(validator.iter_errors({**job, "spec": {**job["spec"], "slotsPerWorker": "1"}}))


@pytest.mark.parametrize("variant", ["kserve-pvc", "kserve-s3-gpu-batching"])
def test_inference_service_validates_against_kserve_crd(variant):
    validator = crd_validator(shared(KSERVE_CRD), "v1beta1")
    isvc = manifests.inference_service(VARIANTS[variant])
    assert [e.message for e in validator.iter_errors(isvc)] == []
    broken = copy.deepcopy(isvc)
    broken["spec"]["predictor"]["scaleMetric"] = "gpu"
    assert list(validator.iter_errors(broken))


# --- option errors name the field ------------------------------------------------------------------


BAD_OPTIONS = [
    (dict(name="Digits"), "name: 'Digits' is not a DNS-1035 label"),
    (dict(name="1digits"), "name: '1digits' is not a DNS-1035 label"),
    (dict(name="d" * 64), "name:"),
    (dict(name="d" * 54, kserve=True), "KServe adds '-predictor'"),
    (dict(namespace="ML"), "namespace: 'ML'"),
    (dict(model_base_path=None), "model_base_path: give the model's location: model_base_path (a folder on the "
                                 "'model-store' volume) or storage_uri"),
    (dict(storage_uri="gs://b/m"), "model_base_path: give either model_base_path (a folder on the 'model-store' "
                                   "volume) or storage_uri, not both"),
    (dict(model_base_path="/abs/path"), "model_base_path: '/abs/path' must be a relative path"),
    (dict(model_base_path="a/../b"), "model_base_path: 'a/../b' must be a relative path"),
    (dict(pvc_claim="Models_1"), "pvc_claim: 'Models_1' is not a DNS-1123 subdomain"),
    (dict(model_base_path=None, storage_uri="s3://b/m"), "storage_uri: 's3://b/m' must look like"),
    (dict(model_base_path=None, storage_uri="/local/dir"), "storage_uri: '/local/dir' must look like"),
    (dict(model_base_path=None, storage_uri="ftp://h/m", kserve=True), "storage_uri: 'ftp://h/m'"),
    (dict(tf_serving_version="latest"), "tf_serving_version: 'latest' is not a release number"),
    (dict(resources=Resources(cpu_request="0")), "resources.cpu_request: '0' must be positive"),
    (dict(resources=Resources(memory_request="1 GB")), "resources.memory_request: '1 GB' is not a Kubernetes quantity"),
    (dict(resources=Resources(memory_request="4Gi")), "resources.memory_limit: '2Gi' is below resources.memory_request"),
    (dict(resources=Resources(cpu_limit="-1")), "resources.cpu_limit: '-1' must be positive"),
    (dict(resources=Resources(gpus=-1)), "resources.gpus: -1"),
    (dict(resources=Resources(gpus=True)), "resources.gpus: expected int, got bool"),
    (dict(autoscaling=Autoscaling(min_replicas="2")), "autoscaling.min_replicas: expected int, got str '2'"),
    (dict(autoscaling=Autoscaling(min_replicas=4, max_replicas=3)), "autoscaling.max_replicas: 3 must be at least"),
    (dict(autoscaling=Autoscaling(min_replicas=0)), "autoscaling.min_replicas: 0 must be at least 1"),
    (dict(autoscaling=Autoscaling(scale_metric="concurrency")), "need KServe's Knative autoscaler"),
    (dict(autoscaling=Autoscaling(scale_metric="gpu"), kserve=True), "autoscaling.scale_metric: 'gpu' is not one of"),
    (dict(autoscaling=Autoscaling(scale_target=0)), "autoscaling.scale_target: 0 must be a positive integer"),
    (dict(batching=Batching(num_batch_threads=0)), "batching.num_batch_threads: 0 must be at least 1"),
    (dict(batching=Batching(batch_timeout_micros=-1)), "batching.batch_timeout_micros: -1 must be at least 0"),
    (dict(batching=5), "batching: expected Batching or None, got int 5"),
    (dict(logger_url="http://l"), "logger_url: the request logger is a KServe feature"),
    (dict(logger_url="logger:8080", kserve=True), "logger_url: 'logger:8080' must be an http:// or https:// URL"),
    (dict(logger_mode="everything", kserve=True), "logger_mode: 'everything' is not one of all, request, response"),
]


@pytest.mark.parametrize(("overrides", "message"), BAD_OPTIONS, ids=[m for _, m in BAD_OPTIONS])
def test_bad_options_raise_user_error_naming_the_field(overrides, message):
    kwargs = {"name": "digits", "model_base_path": "digits", **overrides}
    with pytest.raises(UserError) as err:
        ServingOptions(**kwargs)
    assert message in str(err.value)


def test_every_bad_option_is_reported_at_once():
    with pytest.raises(SpecError) as err:
        ServingOptions(name="Digits", model_base_path="/abs", resources=Resources(cpu_request="0"),
                       autoscaling=Autoscaling(min_replicas=0), batching=Batching(num_batch_threads=0))
    assert err.value.errors == [
        "name: 'Digits' is not a DNS-1035 label (lowercase letters, digits and '-', starting with a letter)",
        "model_base_path: '/abs' must be a relative path inside the volume (letters, digits, '.', '_', '-', '/'; "
        "no leading '/', no '..')",
        "resources.cpu_request: '0' must be positive",
        "autoscaling.min_replicas: 0 must be at least 1 (only KServe scales to zero)",
        "batching.num_batch_threads: 0 must be at least 1",
    ]


def test_the_validator_reports_under_any_prefix_and_spelling():
    with pytest.raises(OptionsError) as err:
        ServingOptions(name="digits", model_base_path="digits", autoscaling=Autoscaling(min_replicas=4, max_replicas=3))
    opts = err.value.options
    assert [str(e) for e in validate(opts)] == err.value.errors == [
        "autoscaling.max_replicas: 3 must be at least 1 and at least autoscaling.min_replicas (4)"]
    assert [str(e) for e in validate(opts, "spec.serving", str.upper)] == [
        "spec.serving.AUTOSCALING.MAX_REPLICAS: 3 must be at least 1 and at least "
        "spec.serving.AUTOSCALING.MIN_REPLICAS (4)"]


def test_cli_lists_every_bad_option_under_its_flag(tmp_path):
    with pytest.raises(SpecError) as err:
        run_cli("Digits", "--model-base-path", "d", "--storage-uri", "gs://b/m", "--pvc", "Claim_1",
                "--max-batch-size", "8", "--num-batch-threads", "2", "--min-replicas", "5", "--logger-url", "http://l",
                "-o", str(tmp_path))
    assert str(err.value) == "\n  ".join([
        "command line: invalid:",
        "--max-batch-size: needs --batching",
        "--num-batch-threads: needs --batching",
        "NAME: 'Digits' is not a DNS-1035 label (lowercase letters, digits and '-', starting with a letter)",
        "--model-base-path: give either --model-base-path (a folder on the 'Claim_1' volume) or --storage-uri, "
        "not both",
        "--max-replicas: 3 must be at least 1 and at least --min-replicas (5)",
        "--logger-url: the request logger is a KServe feature: render with --kserve",
    ])
    assert list(tmp_path.iterdir()) == []


def test_kserve_accepts_what_only_kserve_can_do():
    opts = ServingOptions(name="d" * 53, storage_uri="s3://b/m", kserve=True,
                          autoscaling=Autoscaling(min_replicas=0, scale_metric="concurrency", scale_target=4))
    assert manifests.inference_service(opts)["spec"]["predictor"]["scaleMetric"] == "concurrency"


# --- CLI and checked-in examples -------------------------------------------------------------------


def test_cli_prints_the_same_stream_it_writes(tmp_path, capsys):
    assert run_cli("digits", "--model-base-path", "digits") == 0
    printed = capsys.readouterr().out
    assert run_cli("digits", "--model-base-path", "digits", "-o", str(tmp_path)) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["digits-tfserving.yaml"]
    assert (tmp_path / "digits-tfserving.yaml").read_text() == printed
    assert list(yaml.safe_load_all(printed)) == manifests.render(
        replace(VARIANTS["pvc"], tf_serving_version=installed_tf_serving_version()))


def test_cli_maps_every_flag(capsys):
    run_cli("digits", "--storage-uri", "s3://b/m", "--kserve", "-n", "ml", "--gpus", "2", "--cpu-request", "1",
            "--cpu-limit", "none", "--memory-request", "3Gi", "--memory-limit", "6Gi", "--min-replicas", "0",
            "--max-replicas", "5", "--scale-metric", "rps", "--scale-target", "20", "--batching",
            "--max-batch-size", "16", "--batch-timeout-micros", "500", "--num-batch-threads", "2",
            "--max-enqueued-batches", "9", "--logger-url", "https://l", "--logger-mode", "request",
            "--tf-serving-version", "2.17.1")
    cm, isvc = yaml.safe_load_all(capsys.readouterr().out)
    assert cm["data"]["batching_parameters.txt"] == (
        "max_batch_size { value: 16 }\nbatch_timeout_micros { value: 500 }\n"
        "num_batch_threads { value: 2 }\nmax_enqueued_batches { value: 9 }\n")
    predictor = isvc["spec"]["predictor"]
    assert isvc["metadata"]["namespace"] == "ml"
    assert {k: predictor[k] for k in ("minReplicas", "maxReplicas", "scaleMetric", "scaleTarget", "logger")} == {
        "minReplicas": 0, "maxReplicas": 5, "scaleMetric": "rps", "scaleTarget": 20,
        "logger": {"mode": "request", "url": "https://l"}}
    assert predictor["model"]["runtimeVersion"] == "2.17.1-gpu"
    assert predictor["model"]["storageUri"] == "s3://b/m"
    assert predictor["model"]["resources"] == {"requests": {"cpu": "1", "memory": "3Gi"},
                                               "limits": {"memory": "6Gi", "nvidia.com/gpu": 2}}


@pytest.mark.parametrize(("tensorflow", "release"), [
    ("2.21.0", "2.21.0"), ("2.18.1", "2.18.0"), ("2.22.0rc1", "2.22.0"), ("2.20.0-dev20250601", "2.20.0"), ("3.0", "3.0.0"),
])
def test_the_tf_serving_release_built_on_a_tensorflow(tensorflow, release):
    assert tf_serving_release(tensorflow) == release


def test_a_tensorflow_version_that_is_none_is_refused():
    with pytest.raises(ValueError, match="TensorFlow version 'nightly': expected MAJOR.MINOR"):
        tf_serving_release("nightly")


def test_cli_defaults_to_the_release_of_the_installed_tensorflow(capsys):
    """Issue #37: the manifests said 2.18.0 while the default stack exports with TensorFlow 2.21."""
    import tensorflow as tf  # what `hvdk8s export` here writes SavedModels with

    release = ".".join(tf.__version__.split(".")[:2]) + ".0"
    run_cli("digits", "--model-base-path", "digits")
    deployment = next(o for o in yaml.safe_load_all(capsys.readouterr().out) if o["kind"] == "Deployment")
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == f"tensorflow/serving:{release}"
    run_cli("digits", "--model-base-path", "digits", "--kserve", "--gpu")
    isvc = next(o for o in yaml.safe_load_all(capsys.readouterr().out) if o["kind"] == "InferenceService")
    assert isvc["spec"]["predictor"]["model"]["runtimeVersion"] == f"{release}-gpu"


def test_without_tensorflow_the_default_stacks_release(monkeypatch):
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "distributions", lambda: iter(()))
    assert installed_tf_serving_version() == TF_SERVING_VERSION


def test_the_fixed_default_is_the_default_stacks_release():
    """``ServingOptions``' default (and the CLI's without TensorFlow) is the release of the stack `make setup`
    installs and the GPU image is built with."""
    setup = (REPO / "scripts" / "setup.sh").read_text()
    dockerfile = (REPO / "Dockerfile.gpu").read_text()
    stacks = {setup.split("TF_STACK=${HVDK8S_TF:-")[1].split("}")[0], dockerfile.split("ARG TF_STACK=")[1].split()[0]}
    assert {tf_serving_release(stack) for stack in stacks} == {TF_SERVING_VERSION}


@pytest.mark.parametrize(("argv", "message"), [
    (["digits"], "give the model's location"),
    (["digits", "--model-base-path", "d", "--storage-uri", "gs://b/m"], "not both"),
    (["digits", "--model-base-path", "d", "--max-batch-size", "8"], "--max-batch-size: needs --batching"),
    (["digits", "--model-base-path", "d", "--min-replicas", "5"],
     r"--max-replicas: 3 must be at least 1 and at least --min-replicas \(5\)"),
    (["digits", "--storage-uri", "s3://b/m"], "--storage-uri: 's3://b/m' .* render with --kserve for s3://"),
])
def test_cli_errors_are_user_errors(argv, message, tmp_path):
    with pytest.raises(UserError, match=message):
        run_cli(*argv, "-o", str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_checked_in_examples_match_the_renderer(tmp_path, monkeypatch):
    # the examples show the default stack's release, whichever TensorFlow runs this test
    monkeypatch.setattr(manifests_cli, "installed_tf_serving_version", lambda: TF_SERVING_VERSION)
    assert sorted(p.name for p in EXAMPLES.glob("*.yaml")) == sorted(EXAMPLE_ARGS)
    for name, argv in EXAMPLE_ARGS.items():
        run_cli(*argv, "-o", str(tmp_path))
        fresh, checked_in = (tmp_path / name).read_text(), (EXAMPLES / name).read_text()
        if fresh != checked_in:
            diff = "".join(difflib.unified_diff(checked_in.splitlines(True), fresh.splitlines(True),
                                                f"checked-in/{name}", f"rendered/{name}"))
            pytest.fail(f"serving/examples/{name} is stale; regenerate it with\n"
                        f"  hvdk8s serving-manifests {' '.join(argv)} -o serving/examples\n{diff}")


@pytest.mark.parametrize("name", sorted(EXAMPLE_ARGS))
def test_checked_in_examples_validate(name):
    for obj in yaml.safe_load_all((EXAMPLES / name).read_text()):
        k8s_validate(predictor_as_pod(obj) if obj["kind"] == "InferenceService" else obj, K8S_VERSIONS[-1])
