"""``hvdk8s serve``: TensorFlow Serving's REST (Starlette on uvicorn) and gRPC APIs for one model or several.

The HTTP layer is Starlette (routing, requests, responses) served by uvicorn
with uvloop and httptools; the contract itself (paths, JSON formats, error
codes) lives in ``hvdk8s.serving.api`` (``rest``, ``types``,
``classify_regress``), the gRPC services in ``grpc_server``, and both share
one ``ServingCore`` (models, versions and batching). A background thread polls the base paths (and the model config
file, if one is given), so a version exported while the server runs is
picked up without a restart.

Every request body is read to its end before answering, and every failure
is a JSON ``{"error": ...}``, so a client's keep-alive connection survives
any request it sends. Every accepted connection has ``TCP_NODELAY``, or
small responses wait for Nagle's algorithm against the client's delayed ACK
(~40 ms each): uvloop, which the server runs on, sets it on each itself
(``TCPTransport.new``, uvloop/handles/tcp.pyx, 0.23). The listening socket
sets it too, and is made with protocol ``IPPROTO_TCP``, only as a defence
for asyncio's own loop, which sets it only on sockets of that protocol
(``_set_nodelay``, asyncio/base_events.py).
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from hvdk8s.serving.api import classify_regress, rest, types
from hvdk8s.serving.api.address import GRPC_PORT, HOST, REST_PORT
from hvdk8s.serving.server.batching import BatchingParameters
from hvdk8s.serving.server.core import ServingCore, tensorflow_threads
from hvdk8s.serving.server.monitoring import Metrics
from hvdk8s.serving.server.registry import ConfigWatcher, ModelConfig, Models
from hvdk8s.serving.server.repository import VersionPolicy, image_check

DEFAULT_MAX_REQUEST_BYTES = 16 * 1024 * 1024
INLINE_BYTES = 64 * 1024
"""Bodies up to this size are decoded on the event loop; larger ones in a worker thread."""
METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "TRACE", "CONNECT"]
"""Every method httptools parses reaches the endpoint, so each gets TF Serving's JSON answer (not a text 405)."""
log = logging.getLogger("hvdk8s.serving")


class _TooLarge(types.ServingError):
    def __init__(self, limit: int):
        super().__init__(
            "INVALID_ARGUMENT",
            f"Request body exceeds the limit of {limit} bytes (hvdk8s serve --max-request-bytes)",
            http_status=413,
        )


def create_app(
    core: ServingCore,
    *,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    poll_seconds: float = 1.0,
    on_ready: Sequence[Callable[[], object]] = (),
    on_stop: Sequence[Callable[[], object]] = (),
    watcher: ConfigWatcher | None = None,
    timeout_seconds: float | None = None,
    metrics_path: str | None = None,
) -> Starlette:
    """The ASGI app; its lifespan loads the models, runs ``on_ready``, polls until shutdown, then runs ``on_stop``.

    Every path is answered by one endpoint, as TF Serving's REST API routes it.
    ``serve`` builds one and runs it with uvicorn; build one yourself to run it
    in another ASGI server or a test client.

    Args:
        core: The models and the batching and metrics that serve them.
        max_request_bytes: Larger request bodies are refused (HTTP 413).
        poll_seconds: How often the model base paths are scanned for new versions.
        on_ready: Called once the models' first scan is done.
        on_stop: Called at shutdown, after polling stops.
        watcher: Re-reads the model config file as it polls; None for none.
        timeout_seconds: A model call taking longer answers DEADLINE_EXCEEDED (TF Serving's
            ``--rest_api_timeout_in_ms``); None for no limit.
        metrics_path: ``core.metrics`` is served there as Prometheus text; None for no metrics.

    Returns:
        The Starlette application.
    """
    models = core.models
    freeze_loaded_models = ModelFreezer(models)

    def tick() -> None:
        import tensorflow as tf

        # a host trace event every poll: a profiler trace over gRPC sees the server alive even with no request
        # in its window (a trace with no event at all is "No trace event was collected" to the client)
        with tf.profiler.experimental.Trace("PollModels"):
            if watcher is not None:
                watcher.check()
            models.poll()
        freeze_loaded_models()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await run_in_threadpool(models.poll)
        freeze_loaded_models()
        stop = threading.Event()
        poller = threading.Thread(target=_poll_until, args=(tick, stop, poll_seconds), daemon=True)
        poller.start()
        for callback in on_ready:
            callback()
        try:
            yield
        finally:
            stop.set()
            poller.join()
            for callback in on_stop:
                callback()

    async def endpoint(request: Request) -> Response:
        path = request.scope["path"]  # the decoded path; request.url would build a whole URL object per request
        if core.metrics is not None and path == metrics_path and request.method == "GET":
            return Response(core.metrics.exposition(), media_type="text/plain; version=0.0.4")
        start, code, route = time.perf_counter(), "OK", None
        try:
            body = await _read_body(request, max_request_bytes)  # always: keeps the connection usable
            route = _route(request.method, path, request.headers)
            answer = _json(200, await _handle(core, route, body, timeout_seconds) if route else {})
        except types.ServingError as err:
            code, answer = err.code, _json(err.http_status, rest.error_body(err.message))
        except ClientDisconnect:  # no one is left to answer: one line in the log, not a traceback
            client = f"{request.client.host}:{request.client.port}" if request.client else "a client"
            log.warning("%s %s: %s closed the connection before sending the whole request body",
                        request.method, path, client)
            return Response(status_code=499)  # never sent (nginx's 499: client closed request)
        except Exception as err:  # noqa: BLE001  (a bug must still answer in JSON and keep the connection)
            log.exception("%s %s failed", request.method, path)
            code, answer = "INTERNAL", _json(500, rest.error_body(f"Internal: {type(err).__name__}: {err}"))
        if core.metrics is not None and route is not None:
            core.metrics.observe(route.model, route.kind, "REST", code, time.perf_counter() - start)
        return answer

    return Starlette(routes=[Route("/{path:path}", endpoint, methods=METHODS)], lifespan=lifespan)


class ModelFreezer:
    """Moves the loaded models' objects out of the cyclic garbage collector's reach (``gc.freeze``).

    A loaded TensorFlow model is some 355k tracked objects: every full
    collection walked them all, a ~250 ms stall of every request in flight,
    1-2 times every 6 s under load (issue #26). Called after every poll; when
    a version was loaded or unloaded since the last call (``Models.version_changes``),
    it unfreezes, collects (an unloaded version's cycles are freed then) and
    freezes again.
    """

    def __init__(self, models: Models):
        self.models = models
        self.frozen_at = -1  # models.version_changes when the collector was last frozen

    def __call__(self) -> None:
        changes = self.models.version_changes
        if changes == self.frozen_at:
            return
        self.frozen_at = changes
        gc.unfreeze()
        gc.collect()
        gc.freeze()


def _route(method: str, path: str, headers: Mapping[str, str]) -> rest.Route | None:
    """The API a request addresses, in TF Serving's order of checks; None for a CORS preflight."""
    if not path.lower().startswith("/v1/"):
        raise types.ServingError("NOT_FOUND", f"Not found: {path} (TensorFlow Serving's API is under /v1/)")
    if method == "OPTIONS":  # CORS preflight, as TF Serving answers it
        if not headers.get("origin", "").startswith(("http://", "https://")):
            raise types.ServingError("FAILED_PRECONDITION", "Origin header is missing in CORS preflight")
        return None
    return rest.parse_path(method, path)


async def _handle(core: ServingCore, route: rest.Route, body: bytes, timeout: float | None) -> dict:
    """One request's response document (or a ``types.ServingError``)."""
    if route.kind == "status":
        return core.status(route.model, route.version)  # the label is ignored, as TF Serving ignores it
    if route.kind == "metadata":
        servable = core.servable(route.model, route.version, route.label)
        return rest.metadata_response(route.model, servable.version, servable.signature_defs)
    if route.kind in (classify_regress.CLASSIFY, classify_regress.REGRESS):
        servable, signature, inputs, count = await _parsed(body, functools.partial(_parse_examples, core, route, body))
        outputs = await _within(core.submit_async(servable, signature, inputs), timeout)
        if route.kind == classify_regress.CLASSIFY:
            return rest.classify_response(classify_regress.classifications(outputs, count))
        return rest.regress_response(classify_regress.regressions(outputs, count))
    servable, signature, arrays, row = await _parsed(body, functools.partial(_parse_predict, core, route, body))
    outputs = await _within(core.submit_async(servable, signature, arrays), timeout)
    return rest.predict_response(outputs, row)


async def _parsed(body: bytes, parse: Callable[[], tuple]) -> tuple:
    """``parse()``: on the event loop for a body up to ``INLINE_BYTES``, else in a worker thread (the loop
    keeps serving other requests while a large body is decoded)."""
    if len(body) <= INLINE_BYTES:
        return parse()
    parsed = await run_in_threadpool(_error_returned, parse)
    if isinstance(parsed, types.ServingError):
        raise parsed.detached()  # the worker's own error is held by this frame's local: a cycle if raised
    return parsed


async def _within(future: asyncio.Future, timeout: float | None) -> Any:
    """The future's result; DEADLINE_EXCEEDED after ``timeout`` seconds (the model call itself still finishes)."""
    if timeout is None:
        return await future
    try:
        return await asyncio.wait_for(future, timeout)
    except asyncio.TimeoutError:
        raise types.ServingError(
            "DEADLINE_EXCEEDED", f"Deadline Exceeded: no answer within {timeout * 1000:g} ms (--rest_api_timeout_in_ms)"
        ) from None


def _parse_predict(core: ServingCore, route: rest.Route, body: bytes) -> tuple:
    """(servable, signature, input arrays, row format?) of a ``:predict`` request."""
    servable = None

    def inputs_of(signature: str) -> dict[str, types.InputSpec]:
        nonlocal servable  # resolved once the JSON has parsed, as TF Serving does
        servable = core.servable(route.model, route.version, route.label)
        return servable.inputs_of(signature)

    signature, arrays, row = rest.parse_predict_body(body, inputs_of)
    return servable, signature, arrays, row


def _parse_examples(core: ServingCore, route: rest.Route, body: bytes) -> tuple:
    """(servable, signature, input arrays, example count) of a ``:classify``/``:regress`` request."""
    signature, items, context = rest.parse_examples_body(body)  # the body is checked before the model, as there
    serialized = classify_regress.from_json(items, context)
    servable = core.servable(route.model, route.version, route.label)
    return servable, signature, core.examples_inputs(route.kind, servable, signature, serialized), len(serialized)


def _error_returned(call: Callable[[], tuple]) -> tuple | types.ServingError:
    """``call()``, or the ``ServingError`` it raised as the value.

    An exception raised in a worker thread and re-raised by the awaiting
    coroutine sits in a reference cycle with that coroutine's frames (which
    hold the request body) until the cyclic garbage collector runs; the
    caller raises its ``detached`` copy instead.
    """
    try:
        return call()
    except types.ServingError as err:
        return err


def default_grpc_port(port: int) -> int:
    """The gRPC port when none is given: TF Serving's, or any free one when the REST port is 0 (so a server
    started for tests never clashes on 8500)."""
    return 0 if port == 0 else GRPC_PORT


def serve(
    base_path: str | os.PathLike[str] | None = None,
    *,
    name: str | None = None,
    model_config_file: str | os.PathLike[str] | None = None,
    config_poll_seconds: float = 0,
    host: str = HOST,
    port: int = REST_PORT,
    grpc_port: int | None = None,
    grpc_socket_path: str | None = None,
    grpc_options: Sequence[tuple[str, int | str]] = (),
    rest_timeout_ms: int | None = None,
    metrics_path: str | None = None,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    poll_seconds: float = 1.0,
    num_versions: int = 1,
    batching: BatchingParameters | None = BatchingParameters(),
    intra_op_threads: int | None = None,
    inter_op_threads: int = 0,
    reuse_port: bool = False,
    announce: Callable[[str], object] | None = None,
) -> None:
    """Serve the model in ``base_path`` (or those of ``model_config_file``) over REST and gRPC until interrupted.

    Port 0: any free port; ``grpc_port`` None: 8500, or any free port when
    ``port`` is 0 (so a server started for tests never clashes on 8500).
    Prints one line with both addresses once the models' first scan is
    done; the sockets are bound first, so it carries the real ports.
    ``config_poll_seconds`` > 0 re-reads the model config file that often.
    ``metrics_path``: Prometheus metrics there on the REST port.
    ``batching=None`` runs every request on its own. The thread counts are
    TF Serving's ``--tensorflow_intra_op_parallelism`` and
    ``--tensorflow_inter_op_parallelism`` (0: TensorFlow picks; intra-op
    defaults to ``core.tensorflow_threads``).

    Args:
        base_path: The model's base path (one folder per version); give it or ``model_config_file``.
        name: The model's name in URLs; None for the base path's folder name.
        model_config_file: TF Serving's model config file (text format), for several models.
        config_poll_seconds: Re-read ``model_config_file`` this often; 0 never.
        host: The address to listen on.
        port: The REST port (TF Serving's 8501 by default); 0 for any free port.
        grpc_port: The gRPC port; None for 8500, or any free port when ``port`` is 0.
        grpc_socket_path: Also serve gRPC on this Unix socket; None for none.
        grpc_options: Extra gRPC server options, as ``(name, value)`` pairs.
        rest_timeout_ms: REST model calls taking longer answer DEADLINE_EXCEEDED; None for no limit.
        metrics_path: Serve Prometheus metrics there on the REST port; None for none.
        max_request_bytes: Larger REST request bodies are refused (HTTP 413).
        poll_seconds: How often the base paths are scanned for new versions.
        num_versions: How many of the newest versions of ``base_path`` to serve.
        batching: TF Serving's batching parameters; None runs every request on its own.
        intra_op_threads: TensorFlow's intra-op threads; None for ``core.tensorflow_threads``' choice,
            0 for TensorFlow's.
        inter_op_threads: TensorFlow's inter-op threads; 0 for TensorFlow's choice.
        reuse_port: Listen with ``SO_REUSEPORT``, beside the other workers of ``workers.serve``.
        announce: Where the ready line goes; None for standard output.

    Raises:
        ValueError: Both or neither of ``base_path`` and ``model_config_file`` given, or a gRPC port that
            cannot be bound.
        FileNotFoundError: ``base_path`` is not a directory.

    Example:
        ```python
        from hvdk8s import serving

        serving.serve("models/digits", port=8501)  # blocks; Ctrl-C stops it
        ```
    """
    import tensorflow as tf
    import uvicorn

    from hvdk8s.serving.server import grpc_server, registry

    if (base_path is None) == (model_config_file is None):
        raise ValueError("give either a model base path or a model config file (--model_config_file), not both")
    watcher = None
    if model_config_file is not None:
        configs = registry.read_model_config(model_config_file)
        where = f"--model_config_file {model_config_file}"
    elif base_path is not None:
        root = Path(base_path)
        if not root.is_dir():
            raise FileNotFoundError(f"model base path {root}: no such directory")
        configs = [ModelConfig(name or root.resolve().name, root, VersionPolicy("latest", num_versions))]
        where = str(root)
    grpc_port = default_grpc_port(port) if grpc_port is None else grpc_port
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # before the first model loads: TensorFlow fixes its thread pools when its runtime starts
    tf.config.threading.set_intra_op_parallelism_threads(tensorflow_threads(batching, intra_op_threads))
    tf.config.threading.set_inter_op_parallelism_threads(inter_op_threads)
    log.info("TensorFlow threads (0: TensorFlow picks): intra-op %d, inter-op %d",
             tf.config.threading.get_intra_op_parallelism_threads(),
             tf.config.threading.get_inter_op_parallelism_threads())
    image_check()  # while no other thread writes to stderr: it holds stderr back for a moment

    sock = listen(host, port, reuse_port)
    models = Models(configs)
    if model_config_file is not None:
        watcher = ConfigWatcher(model_config_file, models, config_poll_seconds)
    core = ServingCore(models, batching, Metrics() if metrics_path else None)
    try:
        # gRPC sets SO_REUSEPORT by default: a taken port would then be shared with its owner without a word
        rpc, bound_grpc = grpc_server.create_server(core, host, grpc_port, socket_path=grpc_socket_path,
                                                    options=[("grpc.so_reuseport", int(reuse_port)), *grpc_options])
    except ValueError:
        sock.close()
        raise
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{sock.getsockname()[1]}"
    names = [c.name for c in configs]
    grpc_at = f"{shown}:{bound_grpc}" + (f" and unix:{grpc_socket_path}" if grpc_socket_path else "")
    ready = (f"serving model {names[0]!r} from {where} at {url}/v1/models/{names[0]} and grpc {grpc_at}"
             if len(names) == 1 else
             f"serving models {', '.join(map(repr, names))} from {where} at {url}/v1/models/ and grpc {grpc_at}")
    app = create_app(
        core,
        max_request_bytes=max_request_bytes,
        poll_seconds=poll_seconds,
        on_ready=[rpc.start, lambda: (announce or _print)(ready)],
        on_stop=[lambda: rpc.stop(grace=5).wait(), core.close],  # before uvicorn re-raises the signal
        watcher=watcher,
        timeout_seconds=rest_timeout_ms / 1000 if rest_timeout_ms else None,
        metrics_path=metrics_path,
    )
    config = uvicorn.Config(
        app, loop="uvloop", http="httptools", log_level="warning", access_log=False, lifespan="on",
        timeout_keep_alive=75,  # longer than the usual load balancer idle timeout (60 s)
    )
    uvicorn.Server(config).run(sockets=[sock])


def listen(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """A listening TCP socket with TCP_NODELAY (accepted connections inherit it), SO_REUSEPORT if asked."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise ValueError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None
    sock.listen(2048)  # clients that connect once the URL is printed wait in the backlog
    return sock


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, or 413 when it exceeds ``limit``.

    An oversized body is still read to its end (and dropped, so memory stays
    bounded): answering before the client has finished sending would reset
    its connection instead of giving it the error.
    """
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size <= limit:
            chunks.append(chunk)
    if size > limit:
        raise _TooLarge(limit)
    return b"".join(chunks)


def _poll_until(tick: Callable[[], None], stop: threading.Event, seconds: float) -> None:
    while not stop.wait(seconds):
        try:
            tick()
        except Exception:  # noqa: BLE001  (a scan error must not stop future scans)
            log.exception("polling the models failed")


def _print(line: str) -> None:
    print(line, flush=True)


def _json(status: int, doc: dict) -> Response:
    return Response(rest.dumps(doc), status_code=status, media_type="application/json")
