"""``hvdk8s serving-manifests``: render TF Serving or KServe manifests as YAML."""
from __future__ import annotations

import argparse
import sys
from dataclasses import fields

from hvdk8s.common.fields import SpecError, invalid
from hvdk8s.serving.kube.options import (
    GRPC_PORT,
    HPA_SCALE_METRICS,
    KSERVE_SCALE_METRICS,
    LOGGER_MODES,
    METRICS_PATH,
    REST_PORT,
    TF_SERVING_VERSION,
    Autoscaling,
    Batching,
    OptionsError,
    Resources,
    ServingOptions,
    installed_tf_serving_version,
    validate,
)

_BATCH_FIELDS = tuple(f.name for f in fields(Batching))


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serving-manifests",
        help="render Kubernetes manifests that serve an exported model with TensorFlow Serving or KServe",
        description=(
            "Render a ConfigMap, Deployment (gRPC %d, REST %d, Prometheus metrics at %s), Service and "
            "HorizontalPodAutoscaler for TensorFlow Serving, or with --kserve a KServe InferenceService, "
            "as one multi-document YAML for `kubectl apply -f`. The model is TF Serving's layout: a base "
            "folder of integer version folders, new versions are picked up without a restart."
        ) % (GRPC_PORT, REST_PORT, METRICS_PATH),
    )
    d_res, d_auto, d_batch = Resources(), Autoscaling(), Batching()
    p.add_argument("name", metavar="NAME", help="model name: TF Serving's model_name and the objects' name")
    src = p.add_argument_group("model source (one of)")
    src.add_argument("--model-base-path", metavar="PATH",
                     help="folder inside the --pvc volume holding the version folders, e.g. models/digits")
    src.add_argument("--pvc", default="model-store", metavar="CLAIM",
                     help="PersistentVolumeClaim holding --model-base-path, mounted read-only (default: %(default)s)")
    src.add_argument("--storage-uri", metavar="URI",
                     help="instead of the volume: gs://BUCKET/PATH (TF Serving reads it), or with --kserve also "
                          "s3://, pvc://, https:// (KServe's storage initializer downloads it)")
    p.add_argument("-n", "--namespace", help="namespace to put in the manifests (default: kubectl's)")
    p.add_argument("--tf-serving-version", metavar="X.Y.Z",
                   help="tensorflow/serving image tag, -gpu added for GPUs (default: the release matching the "
                   f"installed TensorFlow, which exports the models: X.Y.0 for TensorFlow X.Y; {TF_SERVING_VERSION} "
                   "where none is installed)")
    res = p.add_argument_group("resources (per pod)")
    res.add_argument("--cpu-request", default=d_res.cpu_request, help="(default: %(default)s)")
    res.add_argument("--cpu-limit", default=d_res.cpu_limit, help="(default: %(default)s; 'none' for no limit)")
    res.add_argument("--memory-request", default=d_res.memory_request, help="(default: %(default)s)")
    res.add_argument("--memory-limit", default=d_res.memory_limit, help="(default: %(default)s; 'none' for no limit)")
    res.add_argument("--gpu", dest="gpus", action="store_const", const=1, default=0,
                     help="one nvidia.com/gpu per pod and the -gpu image")
    res.add_argument("--gpus", dest="gpus", type=int, metavar="N", help="N GPUs per pod")
    auto = p.add_argument_group("autoscaling")
    auto.add_argument("--min-replicas", type=int, default=d_auto.min_replicas, help="(default: %(default)s)")
    auto.add_argument("--max-replicas", type=int, default=d_auto.max_replicas, help="(default: %(default)s)")
    auto.add_argument("--scale-metric", default=d_auto.scale_metric,
                      help=f"{'|'.join(HPA_SCALE_METRICS)}, with --kserve also "
                           f"{'|'.join(m for m in KSERVE_SCALE_METRICS if m not in HPA_SCALE_METRICS)} "
                           "(default: %(default)s)")
    auto.add_argument("--scale-target", type=int, default=d_auto.scale_target,
                      help="utilisation %% of the requests for cpu/memory, else requests (default: %(default)s)")
    bat = p.add_argument_group("server-side batching")
    bat.add_argument("--batching", action="store_true", help="enable TF Serving's request batching")
    for f in _BATCH_FIELDS:
        bat.add_argument("--" + f.replace("_", "-"), type=int, metavar="N",
                         help=f"(with --batching; default: {getattr(d_batch, f)})")
    ks = p.add_argument_group("KServe")
    ks.add_argument("--kserve", action="store_true", help="render a KServe InferenceService instead of the Deployment")
    ks.add_argument("--logger-url", metavar="URL", help="send requests/responses as CloudEvents to URL (KServe logger)")
    ks.add_argument("--logger-mode", default="all", help=f"{'|'.join(LOGGER_MODES)} (default: %(default)s)")
    p.add_argument("-o", "--output-dir", metavar="DIR",
                   help="write DIR/NAME-tfserving.yaml (or NAME-kserve.yaml) instead of printing to stdout")
    p.set_defaults(handler=_serving_manifests)


def _limit(text: str | None) -> str | None:
    return None if text is None or text.lower() == "none" else text


def flag(option: str) -> str:
    """The command-line name of a ServingOptions option (its dotted Python name)."""
    return _FLAGS.get(option) or "--" + option.rpartition(".")[2].replace("_", "-")


_FLAGS = {"name": "NAME", "pvc_claim": "--pvc"}  # the options whose flag is not their last name with dashes


def options_from_args(args: argparse.Namespace) -> ServingOptions:
    """Build the validated options; every bad value is listed in one SpecError, each under its flag."""
    errors = [invalid(flag(f"batching.{f}"), "needs --batching")
              for f in _BATCH_FIELDS if getattr(args, f) is not None and not args.batching]
    try:
        opts = ServingOptions(
            name=args.name,
            model_base_path=args.model_base_path,
            storage_uri=args.storage_uri,
            pvc_claim=args.pvc,
            namespace=args.namespace,
            tf_serving_version=(installed_tf_serving_version() if args.tf_serving_version is None
                                else args.tf_serving_version),
            resources=Resources(cpu_request=args.cpu_request, memory_request=args.memory_request,
                                cpu_limit=_limit(args.cpu_limit), memory_limit=_limit(args.memory_limit),
                                gpus=args.gpus),
            autoscaling=Autoscaling(min_replicas=args.min_replicas, max_replicas=args.max_replicas,
                                    scale_metric=args.scale_metric, scale_target=args.scale_target),
            batching=Batching(**{f: getattr(args, f) for f in _BATCH_FIELDS if getattr(args, f) is not None})
            if args.batching else None,
            kserve=args.kserve,
            logger_url=args.logger_url,
            logger_mode=args.logger_mode,
        )
    except OptionsError as err:
        errors += validate(err.options, spell=flag)
    if errors:
        raise SpecError("command line", errors)
    return opts


def _serving_manifests(args: argparse.Namespace) -> int:
    from pathlib import Path

    from hvdk8s.serving.kube import manifests

    opts = options_from_args(args)
    if args.output_dir is None:
        sys.stdout.write(manifests.to_yaml(manifests.render(opts)))
    else:
        path = manifests.write_manifests(opts, Path(args.output_dir))
        print(f"wrote {path}: kubectl apply -f {path}", file=sys.stderr)
    return 0
