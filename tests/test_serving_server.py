"""The server's own choices, in-process: what a refused request leaves in memory, TensorFlow's thread counts."""
from __future__ import annotations

import asyncio
import gc
import os
import types

import pytest

from hvdk8s.serving import server
from hvdk8s.serving.batching import BatchingParameters
from hvdk8s.serving.core import ServingCore, tensorflow_threads
from hvdk8s.serving.process import running
from hvdk8s.serving.repository import ModelRepository
from serving_models import export_untrained


async def _post(app, path: str, body: bytes) -> int:
    """Send one POST through the ASGI interface; its response status."""
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        "server": ("test", 80), "client": ("test", 1),
    }
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict] = []

    async def receive() -> dict:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent[0]["status"]


def test_a_large_refused_body_is_freed_at_once_not_left_in_a_reference_cycle(tmp_path):
    """Bodies over INLINE_BYTES are parsed on a worker thread; its error must not keep the body alive.

    With the cyclic collector off, any frame still holding the body after
    the response is part of a cycle that only the collector would free
    (under load, the server's memory grew by the bodies waiting for it).
    """
    core = ServingCore(ModelRepository(tmp_path, "digits"), batching=None)
    app = server.create_app(core)
    body = b"[" + b" " * (server.INLINE_BYTES + 10)  # not JSON: refused on the worker thread
    gc.collect()
    gc.disable()
    try:
        statuses = asyncio.run(_gather(app, body))
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        held = [o for o in gc.garbage if isinstance(o, types.FrameType)
                and any(isinstance(v, bytes) and len(v) == len(body) for v in o.f_locals.values())]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
        core.close()
    assert statuses == [400] * 4
    assert held == []


async def _gather(app, body: bytes) -> list[int]:
    return list(await asyncio.gather(*(_post(app, "/v1/models/digits:predict", body) for _ in range(4))))


@pytest.mark.parametrize(
    "batching, given, cores, expected",
    [
        (BatchingParameters(num_batch_threads=2), None, 2, 1),  # the default: one core per batch thread
        (BatchingParameters(num_batch_threads=2), None, 16, 8),
        (BatchingParameters(num_batch_threads=8), None, 2, 1),  # never fewer than one
        (None, None, 16, 0),  # no batching: TensorFlow's own choice
        (BatchingParameters(num_batch_threads=2), 0, 16, 0),  # given: used as is
        (BatchingParameters(num_batch_threads=2), 3, 16, 3),
    ],
)
def test_intra_op_threads_share_the_cores_among_batch_threads(monkeypatch, batching, given, cores, expected):
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    assert tensorflow_threads(batching, given) == expected


def test_serve_refuses_negative_thread_counts(tmp_path, capsys):
    import hvdk8s.cli

    with pytest.raises(SystemExit):
        hvdk8s.cli.main(["serve", str(tmp_path), "--tensorflow_intra_op_parallelism", "-1"])
    assert "argument --tensorflow_intra_op_parallelism: -1: must be 0 or more" in capsys.readouterr().err


def test_serve_runs_tensorflow_with_the_thread_counts_given(tmp_path):
    base = tmp_path / "digits"
    export_untrained(base)
    log = tmp_path / "serve.log"
    with running(base, log, "--tensorflow_intra_op_parallelism", "3", "--tensorflow_inter_op_parallelism", "2"):
        pass
    assert "TensorFlow threads (0: TensorFlow picks): intra-op 3, inter-op 2" in log.read_text()
