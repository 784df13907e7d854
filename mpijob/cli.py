"""``hvdk8s render``: a job spec (file and/or flags) -> MPIJob (or TrainJob) YAML for ``kubectl apply -f``."""
from __future__ import annotations

import argparse
import sys
from typing import Any

SPEC_SUFFIXES = (".yaml", ".yml", ".json")


def register(sub: argparse._SubParsersAction) -> None:
    render = sub.add_parser(
        "render",
        help="print (or write) the Kubeflow MPIJob (or TrainJob) manifest of a job spec",
        description="Render an hvdk8s job spec as a kubeflow.org/v2beta1 MPIJob (or, with --api trainjob, "
        "a Kubeflow Trainer TrainJob and its TrainingRuntime). Either give "
        "JOB.yaml (flags then override its fields), or build the spec from flags alone: "
        "hvdk8s render --name digits --image IMAGE --workers 2 -- python /app/examples/train_digits.py",
    )
    render.add_argument(
        "args", nargs="*", metavar="JOB.yaml | COMMAND",
        help="job-spec file (or MPIJob manifest), and/or the training command after --",
    )  # fmt: skip
    render.add_argument("-o", "--output", metavar="FILE", help="write here (atomically) instead of stdout")
    render.add_argument("--podmonitor", action="store_true", help="append a Prometheus Operator PodMonitor")
    render.add_argument("--api", choices=("mpijob", "trainjob"), default="mpijob",
                        help="mpijob: MPI Operator MPIJob (default); trainjob: Kubeflow Trainer v2 TrainJob "
                        "+ its hvdk8s TrainingRuntime")
    render.add_argument("--name", help="job name")
    render.add_argument("--namespace", help="namespace (default: none in the manifest, so kubectl's or the context's)")
    render.add_argument("--image", help="container image for launcher and workers")
    render.add_argument("--workers", type=int, metavar="N", help="worker pods")
    render.add_argument("--slots", dest="slots_per_worker", type=int, metavar="N", help="ranks per worker (= GPUs with --gpu)")
    render.add_argument("--gpu", action="store_true", default=None, help="one GPU per slot")
    render.set_defaults(handler=_render)


def spec_source(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """The job-spec mapping (the file's fields with the flags laid over them) and its origin."""
    from hvdk8s.common.errors import UserError
    from hvdk8s.mpijob.files import is_mpijob, read_yaml

    positional = list(args.args)
    data: dict[str, Any] = {}
    origin = "command line"
    if positional and positional[0].endswith(SPEC_SUFFIXES):
        origin = positional.pop(0)
        data = read_yaml(origin)
        if not isinstance(data, dict):
            raise UserError(f"{origin}: must be a mapping of job-spec fields")
    elif not (args.name and args.image):
        raise UserError("give JOB.yaml, or --name, --image and the training command after --")
    flags = {
        "name": args.name,
        "namespace": args.namespace,
        "image": args.image,
        "workers": args.workers,
        "slotsPerWorker": args.slots_per_worker,
        "gpu": args.gpu,
        "command": positional or None,
    }
    overrides = {key: value for key, value in flags.items() if value is not None}
    if overrides and is_mpijob(data):
        raise UserError(f"{origin}: an MPIJob manifest is used as is; flags cannot change it")
    return data | overrides, origin


def _render(args: argparse.Namespace) -> int:
    from hvdk8s.common.errors import UserError
    from hvdk8s.mpijob import trainjob
    from hvdk8s.mpijob.files import checked_render, is_mpijob, load_spec, manifest_from_data, to_yaml, write_text
    from hvdk8s.mpijob.render import render_podmonitor

    data, origin = spec_source(args)
    if is_mpijob(data):
        for flag, given in (("--podmonitor", args.podmonitor), ("--api trainjob", args.api != "mpijob")):
            if given:
                raise UserError(f"{origin}: {flag} needs a job spec, not an MPIJob manifest")
        manifests = [manifest_from_data(data, origin)]
    else:
        spec = load_spec(data, origin=origin, api=args.api)
        manifests = trainjob.checked_render_trainjob(spec, origin) if args.api == "trainjob" else [
            checked_render(spec, origin)]
        if args.podmonitor:
            if not spec.metrics.enabled:
                raise UserError(f"{origin}: --podmonitor needs metrics.enabled: true")
            manifests.append(render_podmonitor(spec))
    text = to_yaml(*manifests)
    if args.output:
        try:
            write_text(args.output, text)
        except OSError as exc:
            raise UserError(f"-o {args.output}: {exc.strerror}") from None
    else:
        sys.stdout.write(text)
    return 0
