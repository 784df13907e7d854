"""``hvdk8s loadtest``: a bounded closed-loop load generator for TF Serving's REST and gRPC APIs.

``concurrency`` workers each keep one request in flight on a shared
keep-alive connection pool (aiohttp for REST, one grpc.aio channel for
gRPC), until ``requests`` are sent or ``duration`` seconds have passed. Every
request's latency and outcome is kept, so the summary (requests/s,
p50/p90/p99/max, errors by status) is exact rather than sampled. The
request bodies are built once before the clock starts: what is timed is the
server, the network and the client library, not the encoding.
"""
from __future__ import annotations

import asyncio
import io
import json
import math
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hvdk8s.common import atomic, figures
from hvdk8s.serving.clients.rest_client import predict_url, request_body
from hvdk8s.serving.model.savedmodel import IMAGE_INPUT

DEFAULT_REQUESTS = 500
CONNECTION_ERROR = "connection"
TIMEOUT = "timeout"


@dataclass(frozen=True)
class Slo:
    """Pass/fail thresholds; ``None`` leaves that one unchecked."""

    max_p99_ms: float | None = None
    max_error_rate: float | None = None


@dataclass
class LoadResult:
    """What one load run measured; ``to_dict()`` is the JSON the CLI writes."""

    url: str
    api: str  # "rest" or "grpc"
    concurrency: int
    images_per_request: int
    duration_s: float
    latencies_ms: np.ndarray = field(repr=False)  # one per request sent, errors included
    statuses: Counter  # "ok" or the error's status (HTTP code, gRPC code name, connection, timeout)
    connections: int | None = None  # TCP connections the REST client opened (concurrency: keep-alive held)
    slo: Slo = Slo()

    @property
    def requests(self) -> int:
        return int(sum(self.statuses.values()))

    @property
    def ok(self) -> int:
        return int(self.statuses.get("ok", 0))

    @property
    def errors_by_status(self) -> dict[str, int]:
        return {k: int(v) for k, v in sorted(self.statuses.items()) if k != "ok"}

    @property
    def error_rate(self) -> float:
        return (self.requests - self.ok) / self.requests if self.requests else 0.0

    @property
    def rps(self) -> float:
        return self.requests / self.duration_s if self.duration_s > 0 else 0.0

    def latency_ms(self) -> dict[str, float]:
        if not len(self.latencies_ms):
            return {"p50": math.nan, "p90": math.nan, "p99": math.nan, "max": math.nan}
        p50, p90, p99 = np.percentile(self.latencies_ms, [50, 90, 99])
        return {"p50": float(p50), "p90": float(p90), "p99": float(p99), "max": float(self.latencies_ms.max())}

    def slo_misses(self) -> list[str]:
        """One sentence per threshold missed (empty: all given thresholds met)."""
        misses = []
        p99 = self.latency_ms()["p99"]
        if self.slo.max_p99_ms is not None and not p99 <= self.slo.max_p99_ms:
            misses.append(f"p99 latency {p99:.2f} ms exceeds --max-p99-ms {self.slo.max_p99_ms:g}")
        if self.slo.max_error_rate is not None and not self.error_rate <= self.slo.max_error_rate:
            misses.append(f"error rate {self.error_rate:.4f} exceeds --max-error-rate {self.slo.max_error_rate:g}")
        return misses

    def to_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "api": self.api,
            "requests": self.requests,
            "ok": self.ok,
            "errors": self.requests - self.ok,
            "errors_by_status": self.errors_by_status,
            "error_rate": self.error_rate,
            "duration_s": self.duration_s,
            "rps": self.rps,
            "images_per_second": self.rps * self.images_per_request,
            "latency_ms": self.latency_ms(),
            "concurrency": self.concurrency,
            "connections": self.connections,
            "images_per_request": self.images_per_request,
            "slo": {
                "max_p99_ms": self.slo.max_p99_ms,
                "max_error_rate": self.slo.max_error_rate,
                "passed": not self.slo_misses(),
            },
        }

    def table(self) -> str:
        """The summary as aligned text, like ``hey``'s."""
        lat = self.latency_ms()
        errors = ", ".join(f"{k}: {v}" for k, v in self.errors_by_status.items()) or "none"
        lines = [
            f"target       {self.url} ({self.api}), concurrency {self.concurrency}, "
            f"{self.images_per_request} image(s) per request",
            f"requests     {self.requests} in {self.duration_s:.2f} s ({self.ok} ok)",
            f"requests/s   {self.rps:.1f}",
            "latency ms   " + "  ".join(f"{k} {v:.2f}" for k, v in lat.items()),
            f"errors       {errors}",
        ]
        if self.connections is not None:
            lines.append(f"connections  {self.connections} opened")
        if self.slo.max_p99_ms is not None or self.slo.max_error_rate is not None:
            lines.append("SLO          " + ("; ".join(self.slo_misses()) or "passed"))
        return "\n".join(lines)


def digits_png(count: int = 16) -> list[bytes]:
    """PNGs of scikit-learn's bundled 8×8 digits, upscaled to 28×28 (what the digits model takes)."""
    from PIL import Image
    from sklearn.datasets import load_digits

    images = load_digits().images[:count]
    out = []
    for pixels in images:
        image = Image.fromarray(np.round(pixels * 255 / 16).astype(np.uint8)).resize((28, 28), Image.Resampling.BILINEAR)
        buf = io.BytesIO()
        image.save(buf, "PNG")
        out.append(buf.getvalue())
    return out


def run(
    url: str,
    model: str = "digits",
    *,
    grpc: bool = False,
    concurrency: int = 8,
    requests: int | None = None,
    duration: float | None = None,
    images_per_request: int = 1,
    images: Sequence[bytes] | None = None,
    version: int | None = None,
    signature: str | None = None,
    input_name: str = IMAGE_INPUT,
    timeout: float = 30.0,
    slo: Slo = Slo(),
    progress: bool = False,
    get_path: str | None = None,
    bodies: Sequence[bytes] | None = None,
) -> LoadResult:
    """Load ``url`` (``http://host:8501`` for REST, ``host:8500`` with ``grpc``) and summarise.

    Bounded by ``requests`` (default 500) or by ``duration`` seconds, never
    unbounded. Requests cycle through ``images`` (default: digits PNGs),
    ``images_per_request`` at a time. ``get_path`` (REST only) sends
    ``GET url+get_path`` instead, e.g. the model status: the same server
    stack and client without the model, for comparison. ``bodies`` (REST
    only) POSTs these raw request bodies in turn instead, request ``i`` body
    ``i % len(bodies)``: e.g. good and malformed requests mixed, to check
    that each gets its answer and no connection is dropped.

    Args:
        url: ``http://host:8501`` for REST, ``host:8500`` for gRPC.
        model: The model's name.
        grpc: Use TF Serving's gRPC ``Predict`` instead of REST.
        concurrency: Requests in flight at once.
        requests: How many requests to send; None for 500 unless ``duration`` is given.
        duration: Send for this many seconds instead.
        images_per_request: Images in each request.
        images: Encoded images to send; None for digits PNGs.
        version: A model version; None for the server's choice.
        signature: A signature name; None for ``serving_default``.
        input_name: The signature's input (gRPC).
        timeout: Seconds each request may take; a slower one counts as an error (``timeout``).
        slo: Thresholds the result is checked against (``LoadResult.slo_misses``).
        progress: Show a progress bar.
        get_path: REST only: send ``GET url+get_path`` instead of predictions.
        bodies: REST only: POST these raw bodies in turn instead.

    Returns:
        The measurements: latencies, statuses, requests per second; ``to_dict()`` for JSON, ``table()``
        for text.

    Raises:
        ValueError: ``concurrency`` or ``images_per_request`` below 1, both or a non-positive ``requests``
            and ``duration``, or ``get_path`` or ``bodies`` with ``grpc``.

    Example:
        ```python
        from hvdk8s.serving.clients import loadtest

        result = loadtest.run("http://127.0.0.1:8501", "digits", concurrency=8, requests=1000)
        print(result.table())
        ```
    """
    if concurrency < 1 or images_per_request < 1:
        raise ValueError("concurrency and images_per_request must be at least 1")
    if requests is not None and duration is not None:
        raise ValueError("give requests or duration, not both")
    if duration is None and requests is None:
        requests = DEFAULT_REQUESTS
    if (requests is not None and requests < 1) or (duration is not None and not duration > 0):
        raise ValueError("requests and duration must be positive")
    pool = list(images) if images else digits_png()
    batches = [[pool[(i + j) % len(pool)] for j in range(images_per_request)] for i in range(len(pool))]
    if grpc and (get_path or bodies):
        raise ValueError("get_path and bodies are for REST")
    statuses: Counter = Counter()
    latencies: list[float] = []
    sender = (_grpc_sender(url, model, batches, version, signature, input_name, timeout) if grpc else
              _rest_sender(url, model, batches, version, signature, timeout, get_path, bodies))
    elapsed = asyncio.run(_drive(sender, concurrency, requests, duration, statuses, latencies, progress))
    return LoadResult(
        url, "grpc" if grpc else "rest", concurrency, images_per_request, elapsed,
        np.asarray(latencies, dtype="float64"), statuses, sender.connections, slo,
    )


Send = Callable[[int], Awaitable[str]]
"""Sends request number i; returns "ok" or the error's status."""


async def _drive(
    sender: _rest_sender | _grpc_sender,
    concurrency: int,
    requests: int | None,
    duration: float | None,
    statuses: Counter,
    latencies: list[float],
    progress: bool,
) -> float:
    from tqdm import tqdm

    async with sender as send:
        issued = 0
        bar = tqdm(total=requests, unit="req", disable=not progress, leave=False)
        start = time.perf_counter()
        stop_at = start + duration if duration is not None else math.inf

        async def worker() -> None:
            nonlocal issued
            while (requests is None or issued < requests) and time.perf_counter() < stop_at:
                i = issued
                issued += 1
                t0 = time.perf_counter()
                status = await send(i)
                latencies.append((time.perf_counter() - t0) * 1000.0)
                statuses[status] += 1
                bar.update()

        try:
            await asyncio.gather(*(worker() for _ in range(concurrency)))
        finally:
            bar.close()
        return time.perf_counter() - start


class _rest_sender:
    """POSTs pre-encoded ``:predict`` bodies (or GETs ``get_path``) over one aiohttp keep-alive pool.

    Counts the connections the pool opens: a server that closes a keep-alive
    connection (after an error, say) makes the pool open another.
    """

    def __init__(self, url, model, batches, version, signature, timeout, get_path, bodies):
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"REST URL {url!r}: expected http://host:port (use --grpc for host:port)")
        self.target = url.rstrip("/") + get_path if get_path else predict_url(url, model, version)
        self.bodies = (None if get_path else list(bodies) if bodies else
                       [json.dumps(request_body(b, signature)).encode() for b in batches])
        self.timeout = timeout
        self.connections = 0

    async def __aenter__(self) -> Send:
        import aiohttp

        async def opened(*_: Any) -> None:
            self.connections += 1

        trace = aiohttp.TraceConfig()
        trace.on_connection_create_end.append(opened)
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=False),
            timeout=aiohttp.ClientTimeout(total=self.timeout),
            headers={"Content-Type": "application/json"},
            trace_configs=[trace],
        )

        async def send(i: int) -> str:
            try:
                request = (self.session.get(self.target) if self.bodies is None else
                           self.session.post(self.target, data=self.bodies[i % len(self.bodies)]))
                async with request as response:
                    await response.read()
                    return "ok" if response.status == 200 else str(response.status)
            except asyncio.TimeoutError:
                return TIMEOUT
            except aiohttp.ClientError:
                return CONNECTION_ERROR

        return send

    async def __aexit__(self, *exc: Any) -> None:
        await self.session.close()


class _grpc_sender:
    """Calls ``PredictionService.Predict`` with pre-built requests over one grpc.aio channel."""

    def __init__(self, url, model, batches, version, signature, input_name, timeout):
        from hvdk8s.serving.clients import grpc_client

        self.target = grpc_client.target(url)
        self.requests = [grpc_client.predict_request(b, model, version, signature, input_name) for b in batches]
        self.timeout = timeout
        self.connections = None  # grpc.aio reconnects inside its channel, out of sight

    async def __aenter__(self) -> Send:
        import grpc
        from tensorflow_serving.apis import prediction_service_pb2_grpc

        self.channel = grpc.aio.insecure_channel(self.target)
        stub = prediction_service_pb2_grpc.PredictionServiceStub(self.channel)

        async def send(i: int) -> str:
            try:
                await stub.Predict(self.requests[i % len(self.requests)], timeout=self.timeout)
                return "ok"
            except grpc.aio.AioRpcError as err:
                return TIMEOUT if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED else err.code().name

        return send

    async def __aexit__(self, *exc: Any) -> None:
        await self.channel.close()


def write_json(result: LoadResult, path: str | os.PathLike[str]) -> None:
    """The result as JSON, written atomically (a reader never sees half a file)."""
    atomic.write_json(path, result.to_dict())


def plot(result: LoadResult, path: str | os.PathLike[str]) -> None:
    """Latency histogram (log-spaced bins) with p50/p90/p99 marked, as a PNG."""
    plt = figures.pyplot()

    lat = result.latency_ms()
    fig, ax = plt.subplots(figsize=(7, 4))
    values = result.latencies_ms
    if len(values):
        low, high = max(values.min(), 1e-3), max(values.max(), values.min() * 1.01, 1e-3 * 1.01)
        ax.hist(values, bins=np.geomspace(low, high, 50).tolist(), color="tab:blue", alpha=0.8)
        ax.set_xscale("log")
        for name, style in (("p50", "-"), ("p90", "--"), ("p99", ":")):
            ax.axvline(lat[name], color="black", linestyle=style, label=f"{name} {lat[name]:.2f} ms")
        ax.legend()
    ax.set_xlabel("latency (ms)")
    ax.set_ylabel("requests")
    ax.set_title(f"{result.api} {result.url}: {result.requests} requests, c={result.concurrency}, "
                 f"{result.rps:.0f} req/s")
    fig.tight_layout()
    figures.save_figure(fig, path)
