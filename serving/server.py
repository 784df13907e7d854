"""``hvdk8s serve``: TensorFlow Serving's REST API for one model, on Starlette and uvicorn.

The HTTP layer is Starlette (routing, requests, responses) served by uvicorn;
the contract itself (paths, JSON formats, error codes) lives in ``rest`` and
the versions in ``repository``. A background thread polls the base path, so
a version exported while the server runs is picked up without a restart.
Model calls run in worker threads, keeping the event loop free for status
checks while a batch is predicted.
"""
from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from collections.abc import AsyncIterator
from pathlib import Path

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from hvdk8s.serving import rest
from hvdk8s.serving.repository import ModelRepository

DEFAULT_MAX_REQUEST_BYTES = 16 * 1024 * 1024
log = logging.getLogger("hvdk8s.serving")


class _TooLarge(rest.ServingError):
    def __init__(self, limit: int):
        super().__init__(
            "INVALID_ARGUMENT",
            f"Request body exceeds the limit of {limit} bytes (hvdk8s serve --max-request-bytes)",
            http_status=413,
        )


def create_app(
    repository: ModelRepository,
    *,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    poll_seconds: float = 1.0,
    ready_message: str | None = None,
) -> Starlette:
    """The ASGI app; its lifespan loads the model before serving and polls until shutdown."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await run_in_threadpool(repository.poll)
        stop = threading.Event()
        poller = threading.Thread(target=_poll_until, args=(repository, stop, poll_seconds), daemon=True)
        poller.start()
        if ready_message:
            print(ready_message, flush=True)
        try:
            yield
        finally:
            stop.set()
            poller.join()

    async def v1(request: Request) -> Response:
        try:
            route = rest.parse_path(request.method, request.url.path)
            if route.kind == "status":
                doc = rest.status_response(repository.status(route.model, route.version))
            elif route.kind == "metadata":
                servable = repository.get(route.model, route.version)
                doc = rest.metadata_response(route.model, servable.version, servable.signature_defs)
            else:
                body = await _read_body(request, max_request_bytes)
                doc = await run_in_threadpool(_predict, repository, route, body)
            return _json(200, doc)
        except rest.ServingError as err:
            return _json(err.http_status, rest.error_body(err.message))

    return Starlette(routes=[Route("/v1/{path:path}", v1, methods=["GET", "POST"])], lifespan=lifespan)


def serve(
    base_path: str | os.PathLike[str],
    *,
    name: str | None = None,
    host: str = "127.0.0.1",
    port: int = 8501,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    poll_seconds: float = 1.0,
    num_versions: int = 1,
) -> None:
    """Serve the model in ``base_path`` until interrupted (port 0: any free port).

    Prints one line with the URL once the newest version is loaded; the
    socket is bound first, so that URL carries the real port.
    """
    import uvicorn

    root = Path(base_path)
    if not root.is_dir():
        raise FileNotFoundError(f"model base path {root}: no such directory")
    name = name or root.resolve().name
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    repository = ModelRepository(root, name, num_versions=num_versions)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise ValueError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None
    sock.listen(2048)  # clients that connect once the URL is printed wait in the backlog
    bound = sock.getsockname()[1]
    url = f"http://{f'[{host}]' if ':' in host else host}:{bound}"
    app = create_app(
        repository,
        max_request_bytes=max_request_bytes,
        poll_seconds=poll_seconds,
        ready_message=f"serving model {name!r} from {root} at {url}/v1/models/{name}",
    )
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
    uvicorn.Server(config).run(sockets=[sock])


def _predict(repository: ModelRepository, route: rest.Route, body: bytes) -> dict:
    servable = repository.get(route.model, route.version)
    signature, arrays, row = rest.parse_predict_body(body, servable.inputs_of)
    return rest.predict_response(servable.run(signature, arrays), row)


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
