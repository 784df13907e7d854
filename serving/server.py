"""``hvdk8s serve``: TensorFlow Serving's REST (Starlette on uvicorn) and gRPC APIs for one model.

The HTTP layer is Starlette (routing, requests, responses) served by uvicorn
with uvloop and httptools; the contract itself (paths, JSON formats, error
codes) lives in ``rest``, the gRPC services in ``grpc_server``, and both
share one ``ServingCore`` (versions and batching). A background thread
polls the base path, so a version exported while the server runs is picked
up without a restart.

Every request body is read to its end before answering, and every failure
is a JSON ``{"error": ...}``, so a client's keep-alive connection survives
any request it sends. The listening socket is TCP (``IPPROTO_TCP``) with
``TCP_NODELAY``: asyncio sets no-delay only on sockets of protocol TCP, and
without it small responses wait for Nagle's algorithm against the client's
delayed ACK (~40 ms each).
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import socket
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from hvdk8s.serving import rest
from hvdk8s.serving.batching import BatchingParameters
from hvdk8s.serving.core import ServingCore, tensorflow_threads
from hvdk8s.serving.repository import ModelRepository

DEFAULT_MAX_REQUEST_BYTES = 16 * 1024 * 1024
INLINE_BYTES = 64 * 1024
"""Bodies up to this size are decoded on the event loop; larger ones in a worker thread."""
METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]
log = logging.getLogger("hvdk8s.serving")


class _TooLarge(rest.ServingError):
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
) -> Starlette:
    """The ASGI app; its lifespan loads the model, runs ``on_ready``, polls until shutdown, then runs ``on_stop``."""
    repository = core.repository

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await run_in_threadpool(repository.poll)
        stop = threading.Event()
        poller = threading.Thread(target=_poll_until, args=(repository, stop, poll_seconds), daemon=True)
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
        try:
            body = await _read_body(request, max_request_bytes)  # always: keeps the connection usable
            return _json(200, await _handle(core, request, body))
        except rest.ServingError as err:
            return _json(err.http_status, rest.error_body(err.message))
        except Exception as err:  # noqa: BLE001  (a bug must still answer in JSON and keep the connection)
            log.exception("%s %s failed", request.method, request.url.path)
            return _json(500, rest.error_body(f"Internal: {type(err).__name__}: {err}"))

    return Starlette(routes=[Route("/{path:path}", endpoint, methods=METHODS)], lifespan=lifespan)


async def _handle(core: ServingCore, request: Request, body: bytes) -> dict:
    """One request's response document (or a ``rest.ServingError``), in TF Serving's order of checks."""
    path = request.scope["path"]  # the decoded path; request.url would build a whole URL object per request
    if not path.lower().startswith("/v1/"):
        raise rest.ServingError("NOT_FOUND", f"Not found: {path} (TensorFlow Serving's API is under /v1/)")
    if request.method == "OPTIONS":  # CORS preflight, as TF Serving answers it
        if not request.headers.get("origin", "").startswith(("http://", "https://")):
            raise rest.ServingError("FAILED_PRECONDITION", "Origin header is missing in CORS preflight")
        return {}
    route = rest.parse_path(request.method, path)
    if route.kind == "status":
        return core.status(route.model, route.version, route.label)
    if route.kind == "metadata":
        servable = core.servable(route.model, route.version, route.label)
        return rest.metadata_response(route.model, servable.version, servable.signature_defs)
    if route.kind in ("classify", "regress"):
        signature = rest.parse_examples_body(body)  # the body is checked before the model, as there
        servable = core.servable(route.model, route.version, route.label)
        raise rest.classify_regress_error(route.kind, signature, servable.signature_defs)
    parse = functools.partial(_parse_predict, core, route, body)
    if len(body) <= INLINE_BYTES:
        servable, signature, arrays, row = parse()
    else:
        parsed = await run_in_threadpool(_error_returned, parse)
        if isinstance(parsed, rest.ServingError):
            raise parsed.detached()  # the worker's own error is held by this frame's local: a cycle if raised
        servable, signature, arrays, row = parsed
    outputs = await core.submit_async(servable, signature, arrays)
    return rest.predict_response(outputs, row)


def _parse_predict(core: ServingCore, route: rest.Route, body: bytes) -> tuple:
    """(servable, signature, input arrays, row format?) of a ``:predict`` request."""
    servable = None

    def inputs_of(signature: str) -> dict[str, rest.InputSpec]:
        nonlocal servable  # resolved once the JSON has parsed, as TF Serving does
        servable = core.servable(route.model, route.version, route.label)
        return servable.inputs_of(signature)

    signature, arrays, row = rest.parse_predict_body(body, inputs_of)
    return servable, signature, arrays, row


def _error_returned(call: Callable[[], tuple]) -> tuple | rest.ServingError:
    """``call()``, or the ``ServingError`` it raised as the value.

    An exception raised in a worker thread and re-raised by the awaiting
    coroutine sits in a reference cycle with that coroutine's frames (which
    hold the request body) until the cyclic garbage collector runs; the
    caller raises its ``detached`` copy instead.
    """
    try:
        return call()
    except rest.ServingError as err:
        return err


def serve(
    base_path: str | os.PathLike[str],
    *,
    name: str | None = None,
    host: str = "127.0.0.1",
    port: int = 8501,
    grpc_port: int = 8500,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    poll_seconds: float = 1.0,
    num_versions: int = 1,
    batching: BatchingParameters | None = BatchingParameters(),
    intra_op_threads: int | None = None,
    inter_op_threads: int = 0,
) -> None:
    """Serve the model in ``base_path`` over REST and gRPC until interrupted (port 0: any free port).

    Prints one line with both addresses once the newest version is loaded;
    the sockets are bound first, so it carries the real ports.
    ``batching=None`` runs every request on its own. The thread counts are
    TF Serving's ``--tensorflow_intra_op_parallelism`` and
    ``--tensorflow_inter_op_parallelism`` (0: TensorFlow picks; intra-op
    defaults to ``core.tensorflow_threads``).
    """
    import tensorflow as tf
    import uvicorn

    from hvdk8s.serving import grpc_server

    root = Path(base_path)
    if not root.is_dir():
        raise FileNotFoundError(f"model base path {root}: no such directory")
    name = name or root.resolve().name
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # before the first model loads: TensorFlow fixes its thread pools when its runtime starts
    tf.config.threading.set_intra_op_parallelism_threads(tensorflow_threads(batching, intra_op_threads))
    tf.config.threading.set_inter_op_parallelism_threads(inter_op_threads)
    log.info("TensorFlow threads (0: TensorFlow picks): intra-op %d, inter-op %d",
             tf.config.threading.get_intra_op_parallelism_threads(),
             tf.config.threading.get_inter_op_parallelism_threads())

    sock = listen(host, port)
    core = ServingCore(ModelRepository(root, name, num_versions=num_versions), batching)
    try:
        rpc, bound_grpc = grpc_server.create_server(core, host, grpc_port)
    except ValueError:
        sock.close()
        raise
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{sock.getsockname()[1]}"
    ready = f"serving model {name!r} from {root} at {url}/v1/models/{name} and grpc {shown}:{bound_grpc}"
    app = create_app(
        core,
        max_request_bytes=max_request_bytes,
        poll_seconds=poll_seconds,
        on_ready=[rpc.start, lambda: print(ready, flush=True)],
        on_stop=[lambda: rpc.stop(grace=5).wait(), core.close],  # before uvicorn re-raises the signal
    )
    config = uvicorn.Config(
        app, loop="uvloop", http="httptools", log_level="warning", access_log=False, lifespan="on",
        timeout_keep_alive=75,  # longer than the usual load balancer idle timeout (60 s)
    )
    uvicorn.Server(config).run(sockets=[sock])


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket with TCP_NODELAY (accepted connections inherit it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
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


def _poll_until(repository: ModelRepository, stop: threading.Event, seconds: float) -> None:
    while not stop.wait(seconds):
        try:
            repository.poll()
        except Exception:  # noqa: BLE001  (a scan error must not stop future scans)
            log.exception("model %s: polling %s failed", repository.name, repository.base_path)


def _json(status: int, doc: dict) -> Response:
    return Response(rest.dumps(doc), status_code=status, media_type="application/json")
