"""Serving commands of the ``hvdk8s`` CLI: export, select, serve, predict, loadtest."""
from __future__ import annotations

import argparse
import importlib.util
import math
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hvdk8s import doctor
from hvdk8s.common.errors import UserError
from hvdk8s.serving.api.address import GRPC_ADDRESS, GRPC_PORT, HOST, REST_PORT, REST_URL  # stdlib-only modules:
from hvdk8s.serving.model.savedmodel import MAX_VERSION, PREPROCESSING  # they keep the CLI fast


def register(sub: argparse._SubParsersAction) -> None:
    export = sub.add_parser(
        "export",
        help="export a .keras model as the next TensorFlow Serving version",
        description="Write MODEL as BASE_PATH/<version>/ (SavedModel, written atomically) with a "
        "serving_default signature taking JPEG/PNG bytes and a predict_tensor signature. Its answers carry "
        "probabilities and classes, and with --class-names each class's name.",
    )
    export.add_argument("model", type=Path, help=".keras file")
    export.add_argument("--base-path", type=Path, required=True, help="model base path, e.g. models/digits")
    export.add_argument("--version", type=_version, help="version number (default: next integer)")
    _export_options(export)
    export.set_defaults(handler=_export)

    select = sub.add_parser(
        "select",
        help="evaluate candidate .keras models and promote the best to the next serving version",
        description="Evaluate every .keras file in CANDIDATES on the same held-out data, export the "
        "best as the next version under --base-path and record all candidates' metrics in "
        "<version>/assets.extra/hvdk8s.json.",
    )
    select.add_argument("candidates", type=Path, help="folder of .keras candidates")
    select.add_argument("--base-path", type=Path, required=True, help="model base path, e.g. models/digits")
    select.add_argument("--metric", choices=("accuracy", "loss"), default="accuracy")
    select.add_argument(
        "--data", type=Path, help=".npz with arrays x (model inputs) and y (labels); default: digits test split"
    )
    _export_options(select)
    select.set_defaults(handler=_select)

    serve = sub.add_parser(
        "serve",
        help="serve a model base path with TensorFlow Serving's REST and gRPC APIs",
        description="Serve the newest version under MODEL_BASE_PATH at /v1/models/NAME "
        "(status, metadata, :predict, :classify, :regress; gRPC Predict, Classify, Regress, MultiInference) "
        "and pick up new versions without a restart. TF Serving's own command line works too: "
        "--model_base_path/--model_name or --model_config_file instead of MODEL_BASE_PATH, and then "
        "--port is the gRPC port and --rest_api_port the REST port, as in tensorflow_model_server.",
    )
    serve.add_argument("base_path", type=Path, metavar="MODEL_BASE_PATH", nargs="?",
                       help="model base path (its integer sub-folders are versions)")
    serve.add_argument("--model_base_path", type=Path, metavar="PATH", help="TF Serving's spelling of MODEL_BASE_PATH")
    serve.add_argument("--name", "--model_name", dest="name", help="model name in URLs (default: the folder name)")
    serve.add_argument("--host", default=HOST, help="address to bind (default %(default)s; 0.0.0.0 for all)")
    serve.add_argument("--port", type=_port,
                       help=f"with MODEL_BASE_PATH: the REST port (default {REST_PORT}); with TF Serving's "
                       f"--model_base_path or --model_config_file: the gRPC port (default {GRPC_PORT}); 0: any free port")
    serve.add_argument("--rest_api_port", type=_port, metavar="PORT",
                       help=f"REST port (default {REST_PORT}; 0: any free port, where TF Serving would turn REST off)")
    serve.add_argument("--grpc-port", type=_port,
                       help=f"gRPC port (default {GRPC_PORT}; any free port when the REST port is 0)")
    serve.add_argument("--grpc_socket_path", metavar="PATH", help="also serve gRPC on this Unix socket")
    serve.add_argument("--grpc_channel_arguments", default="", metavar="K=V,...",
                       help="gRPC server arguments, e.g. grpc.max_connection_age_ms=2000 (ints where they parse)")
    serve.add_argument("--rest_api_timeout_in_ms", type=_positive(int), metavar="MS",
                       help="a REST request whose model call takes longer gets 504 DEADLINE_EXCEEDED "
                       "(default: no limit; TF Serving's default is 30000)")
    serve.add_argument("--model_config_file", type=Path, metavar="FILE",
                       help="TF Serving's ModelServerConfig text proto: several models, version policies, labels")
    serve.add_argument("--model_config_file_poll_wait_seconds", type=_positive(int, zero=True), default=0,
                       metavar="S", help="re-read --model_config_file every S seconds (default 0: never)")
    serve.add_argument("--monitoring_config_file", type=Path, metavar="FILE",
                       help="TF Serving's MonitoringConfig text proto: prometheus_config { enable: true } serves "
                       "Prometheus metrics at /monitoring/prometheus/metrics on the REST port")
    serve.add_argument(
        "--workers", type=_positive(int), default=1, metavar="N",
        help="server processes sharing the ports (SO_REUSEPORT), each with its own copy of the models: one process "
        "uses about one core (default 1, as TF Serving)")
    serve.add_argument(
        "--max-request-bytes", type=_positive(int), help="larger request bodies get HTTP 413 (default 16 MiB)"
    )
    serve.add_argument(
        "--poll-seconds", "--file_system_poll_wait_seconds", dest="poll_seconds", type=_positive(float), default=1.0,
        help="how often to look for new versions (default 1)"
    )
    serve.add_argument(
        "--num-versions", type=_positive(int), default=1, help="how many of the newest versions to keep loaded"
    )
    batching = serve.add_argument_group(
        "server-side batching (TF Serving's flags and BatchingParameters defaults: max_batch_size 1000, "
        "batch_timeout_micros 0; on by default here)"
    )
    batching.add_argument(
        "--enable_batching", type=_bool, nargs="?", const=True, default=True, metavar="BOOL",
        help="batch concurrent requests (default true; --enable_batching=false runs each request alone)",
    )
    batching.add_argument(
        "--batching_parameters_file", type=Path, metavar="FILE",
        help="TF Serving's BatchingParameters text proto, e.g. 'max_batch_size { value: 64 }'",
    )
    threads = serve.add_argument_group("TensorFlow threads (TF Serving's flags)")
    threads.add_argument(
        "--tensorflow_intra_op_parallelism", type=_positive(int, zero=True), metavar="N",
        help="threads within one op (0: TensorFlow picks; default with batching: the cores divided among the "
        "batch threads, so concurrent batches do not contend for every core; without batching: 0)",
    )
    threads.add_argument(
        "--tensorflow_inter_op_parallelism", type=_positive(int, zero=True), default=0, metavar="N",
        help="threads running independent ops (default 0: TensorFlow picks)",
    )
    serve.set_defaults(handler=_serve)

    predict = sub.add_parser(
        "predict",
        help="classify image files with a TensorFlow Serving (or hvdk8s serve) model",
        description="Send each image as base64 to URL/v1/models/MODEL:predict and print its class "
        "and probabilities.",
    )
    predict.add_argument("images", nargs="+", type=Path, help="JPEG or PNG files")
    predict.add_argument(
        "--url", help=f"server root (default: hvdk8s serve's, {REST_URL}; with --grpc {GRPC_ADDRESS})"
    )
    _target_options(predict)
    predict.set_defaults(handler=_predict)

    load = sub.add_parser(
        "loadtest",
        help="load a TF Serving (or hvdk8s serve) model over REST or gRPC; latency percentiles and errors",
        description="Keep CONCURRENCY :predict requests in flight for --requests N or --duration S and print "
        "requests/s, latency p50/p90/p99/max and errors by status; exit 1 if an --max-* threshold is missed.",
    )
    load.add_argument("url", metavar="URL", nargs="?",
                      help=f"http://host:port (REST) or host:port (with --grpc); default: hvdk8s serve's, {REST_URL} "
                      f"or {GRPC_ADDRESS}")
    _target_options(load)
    load.add_argument("--concurrency", type=_positive(int), default=8, help="requests in flight (default 8)")
    bound = load.add_mutually_exclusive_group()
    bound.add_argument("--requests", type=_positive(int), help="requests to send (default 500)")
    bound.add_argument("--duration", type=_positive(float), help="seconds to send for")
    load.add_argument("--images", type=_positive(int), default=1, help="images per request (default 1)")
    load.add_argument(
        "--image", type=Path, action="append", help="image file to send (repeatable; default: digits PNGs)"
    )
    load.add_argument("--timeout", type=_positive(float), default=30.0, help="per-request timeout in seconds")
    load.add_argument("--json", type=Path, help="write the result as JSON here")
    load.add_argument("--plot", type=Path, help="write a latency histogram PNG here")
    load.add_argument("--max-p99-ms", type=_positive(float), help="fail (exit 1) if p99 latency is above this")
    load.add_argument(
        "--max-error-rate", type=float, help="fail (exit 1) if the share of failed requests is above this"
    )
    load.set_defaults(handler=_loadtest)


def _target_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--grpc", action="store_true", help="use TF Serving's gRPC API instead of REST")
    parser.add_argument("--model", default="digits", help="model name (default: digits)")
    parser.add_argument("--version", type=_version, help="a specific version (default: the newest served)")
    parser.add_argument("--signature", help="signature name (default: serving_default)")


def _export_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--class-names", metavar="NAMES",
                        help="comma-separated names, one per model output in order, e.g. 0,1,2,3,4,5,6,7,8,9 for "
                        "the digits: answers then name their class (`hvdk8s predict` prints it); without, they "
                        "give its number only")
    parser.add_argument(
        "--preprocessing",
        choices=sorted(PREPROCESSING),
        default="unit",
        help="pixel scaling the model was trained with: unit [0,1] (default), symmetric [-1,1], raw [0,255]",
    )


def _positive(kind: type, zero: bool = False) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        value = kind(text)
        if isinstance(value, float) and not math.isfinite(value):  # inf, nan: no timeout or wait can be either
            raise argparse.ArgumentTypeError(f"{text}: must be a finite number")
        if value < 0 or (value == 0 and not zero):
            raise argparse.ArgumentTypeError(f"{text}: must be {'0 or more' if zero else 'positive'}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in "invalid int value" messages
    return parse


def _at_most(most: int, what: str) -> Callable[[str], int]:
    """A parser of integers from 0 to ``most``; a larger one's error says ``{what} is at most {most}``."""
    def parse(text: str) -> int:
        value: int = _positive(int, zero=True)(text)
        if value > most:
            raise argparse.ArgumentTypeError(f"{text}: {what} is at most {most}")
        return value

    parse.__name__ = "int"  # argparse names the type in "invalid int value" messages
    return parse


_port = _at_most(65535, "a TCP port")
"""A TCP port, or 0 for any free one."""
_version = _at_most(MAX_VERSION, "a model version (TF Serving's are int64)")
"""A model version: 0 to int64's maximum, as TF Serving's version folders and requests hold them."""


def _bool(text: str) -> bool:
    """TF Serving's boolean flag values."""
    if text.lower() in ("true", "1"):
        return True
    if text.lower() in ("false", "0"):
        return False
    raise argparse.ArgumentTypeError(f"{text}: expected true or false")


def _class_names(value: str | None) -> list[str] | None:
    return [name.strip() for name in value.split(",")] if value else None


def _export(args: argparse.Namespace) -> int:
    from hvdk8s.serving.model import savedmodel

    try:
        model = savedmodel.load_keras_model(args.model)
        path = savedmodel.export(
            model,
            args.base_path,
            version=args.version,
            class_names=_class_names(args.class_names),
            preprocessing=args.preprocessing,
        )
    except (ValueError, FileExistsError) as err:
        raise UserError(str(err)) from None
    print(f"exported {args.model} as {path}")
    if args.class_names is None:
        print(f"hvdk8s export: without --class-names the answers give class numbers only; name the "
              f"{model.outputs[0].shape[-1]} classes in output order with --class-names NAME,NAME,...", file=sys.stderr)
    return 0


def _select(args: argparse.Namespace) -> int:
    import numpy as np

    from hvdk8s.serving.model import selection

    data = None
    if args.data is not None:
        if not args.data.is_file():
            raise UserError(f"--data {args.data}: no such file")
        try:
            with np.load(args.data) as arrays:
                if "x" not in arrays or "y" not in arrays:
                    raise UserError(f"--data {args.data}: expected arrays named x and y, found {sorted(arrays)}")
                data = (arrays["x"], arrays["y"])
        except (ValueError, TypeError, OSError, EOFError, zipfile.BadZipFile) as err:  # an .npy, text, objects: no x, y
            raise UserError(f"--data {args.data}: not an .npz of numeric arrays x and y ({err})") from None
    try:
        result = selection.select(
            args.candidates,
            args.base_path,
            metric=args.metric,
            data=data,
            class_names=_class_names(args.class_names),
            preprocessing=args.preprocessing,
            data_name=str(args.data),
        )
    except (ValueError, FileNotFoundError, FileExistsError) as err:
        raise UserError(str(err)) from None
    print(selection.format_table(result))
    return 0


def _require_serving_api() -> None:
    """Raise a UserError naming the install command when the ``tensorflow_serving`` package is missing.

    ``pip install -e .`` does not bring it: tensorflow-serving-api's metadata requires the full ``tensorflow``
    package, so scripts/setup.sh installs it with ``--no-deps`` and pyproject.toml cannot list it. Every gRPC
    path (the server, ``--grpc`` clients) and ``--model_config_file`` import its stubs.
    """
    if importlib.util.find_spec("tensorflow_serving") is None:  # only this package: other import errors stay
        import tensorflow as tf

        raise UserError("TF Serving's gRPC API (Python package tensorflow_serving) is not installed: install it with "
                        + doctor.serving_api_install(sys.executable, tf.__version__))


def _serve(args: argparse.Namespace) -> int:
    _require_serving_api()
    from hvdk8s.serving.server import app, batching, grpc_server, monitoring, workers

    if args.batching_parameters_file and not args.enable_batching:
        raise UserError("--batching_parameters_file needs --enable_batching=true")
    try:
        base_path = _base_path(args)
        rest_port, grpc_port = serve_ports(args)
        params = None
        if args.enable_batching:
            params = (batching.read_parameters_file(args.batching_parameters_file)
                      if args.batching_parameters_file else batching.BatchingParameters())
        prometheus = (monitoring.read_config(args.monitoring_config_file) if args.monitoring_config_file
                      else monitoring.PrometheusConfig())
        options = dict(
            base_path=base_path,
            name=args.name,
            model_config_file=args.model_config_file,
            config_poll_seconds=args.model_config_file_poll_wait_seconds,
            host=args.host,
            port=rest_port,
            grpc_port=grpc_port,
            grpc_socket_path=args.grpc_socket_path,
            grpc_options=grpc_server.channel_arguments(args.grpc_channel_arguments),
            rest_timeout_ms=args.rest_api_timeout_in_ms,
            metrics_path=prometheus.path if prometheus.enable else None,
            max_request_bytes=args.max_request_bytes or app.DEFAULT_MAX_REQUEST_BYTES,
            poll_seconds=args.poll_seconds,
            num_versions=args.num_versions,
            batching=params,
            intra_op_threads=args.tensorflow_intra_op_parallelism,
            inter_op_threads=args.tensorflow_inter_op_parallelism,
        )
        if args.workers > 1:
            workers.serve(args.workers, **options)
        else:
            app.serve(**options)
    except (ValueError, FileNotFoundError) as err:
        raise UserError(str(err)) from None
    return 0


def _base_path(args: argparse.Namespace) -> Path | None:
    """The one model source given: MODEL_BASE_PATH, --model_base_path or --model_config_file."""
    given = [flag for flag, value in (("MODEL_BASE_PATH", args.base_path), ("--model_base_path", args.model_base_path),
                                      ("--model_config_file", args.model_config_file)) if value is not None]
    if len(given) != 1:
        raise UserError("give one of MODEL_BASE_PATH, --model_base_path or --model_config_file"
                        + (f" (got {' and '.join(given)})" if given else ""))
    if args.model_config_file is not None and args.name:
        raise UserError("--model_name names the model of --model_base_path; with --model_config_file each "
                        "model's name is in the file")
    return args.base_path or args.model_base_path


def serve_ports(args: argparse.Namespace) -> tuple[int, int | None]:
    """(REST port, gRPC port or None for the server's default) from hvdk8s's or TF Serving's flags.

    With a positional MODEL_BASE_PATH ``--port`` is the REST port (hvdk8s);
    with ``--model_base_path``/``--model_config_file`` it is the gRPC port,
    as tensorflow_model_server reads it, so its command line works unchanged.
    """
    tf_serving = args.base_path is None
    if tf_serving:
        if args.port is not None and args.grpc_port is not None:
            raise UserError("--port and --grpc-port both set the gRPC port (TF Serving's flags: --port is gRPC)")
        rest = args.rest_api_port if args.rest_api_port is not None else REST_PORT
        return rest, args.port if args.port is not None else args.grpc_port
    if args.port is not None and args.rest_api_port is not None:
        raise UserError("--port and --rest_api_port both set the REST port with MODEL_BASE_PATH")
    rest = next((p for p in (args.port, args.rest_api_port) if p is not None), REST_PORT)
    return rest, args.grpc_port


def _read_images(paths: list[Path], flag: str) -> list[bytes]:
    folders = [str(p) for p in paths if p.is_dir()]
    if folders:
        raise UserError(f"{flag}: {', '.join(folders)}: a directory; expected image files (JPEG or PNG), "
                        f"e.g. {Path(folders[0]) / '*.png'}")
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise UserError(f"{flag}: no such file: {', '.join(missing)}")
    return [p.read_bytes() for p in paths]


def _url(args: argparse.Namespace) -> str:
    """The server address given, else hvdk8s serve's default one for the API chosen."""
    return args.url or (GRPC_ADDRESS if args.grpc else REST_URL)


def _predict(args: argparse.Namespace) -> int:
    from hvdk8s.serving.clients import rest_client

    images = _read_images(args.images, "images")
    try:
        if args.grpc:
            _require_serving_api()
            from hvdk8s.serving.clients import grpc_client

            send = grpc_client.predict
        else:
            send = rest_client.predict
        predictions = send(_url(args), images, model=args.model, version=args.version, signature=args.signature)
    except (rest_client.PredictError, ValueError) as err:
        raise UserError(str(err)) from None
    for path, prediction in zip(args.images, predictions):
        print(f"{path}: {rest_client.describe(prediction)}")
    return 0


def _loadtest(args: argparse.Namespace) -> int:
    from hvdk8s.serving.clients import loadtest, rest_client

    if args.max_error_rate is not None and not 0 <= args.max_error_rate <= 1:
        raise UserError(f"--max-error-rate {args.max_error_rate}: must be between 0 and 1")
    if args.grpc:
        _require_serving_api()
    url = _url(args)
    try:
        rest_client.raise_if_nothing_answers(url)  # else every request would count as a connection error, and no more
        result = loadtest.run(
            url,
            args.model,
            grpc=args.grpc,
            concurrency=args.concurrency,
            requests=args.requests,
            duration=args.duration,
            images_per_request=args.images,
            images=_read_images(args.image, "--image") if args.image else None,
            version=args.version,
            signature=args.signature,
            timeout=args.timeout,
            slo=loadtest.Slo(args.max_p99_ms, args.max_error_rate),
            progress=sys.stderr.isatty(),
        )
    except (rest_client.PredictError, ValueError) as err:
        raise UserError(str(err)) from None
    print(result.table())
    if args.json:
        loadtest.write_json(result, args.json)
    if args.plot:
        loadtest.plot(result, args.plot)
    misses = result.slo_misses()
    for miss in misses:
        print(f"hvdk8s loadtest: SLO missed: {miss}", file=sys.stderr)
    if result.requests and not result.ok:  # nothing was measured but failures: a wrong model, signature or image
        errors = ", ".join(f"{status}: {n}" for status, n in result.errors_by_status.items())
        ask = f"GetModelStatus at {url}" if args.grpc else f"GET {url.rstrip('/')}/v1/models/{args.model}"
        print(f"hvdk8s loadtest: error: every request failed ({errors}); check --model {args.model!r} and the "
              f"signature and images against what the server has ({ask})", file=sys.stderr)
        return 1
    return 1 if misses else 0
