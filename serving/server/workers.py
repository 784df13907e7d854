"""``hvdk8s serve --workers N``: N server processes sharing the REST and gRPC ports, to use more than one core.

One server process is held to one core by its event loop and the GIL
(issue #26: REST parsing, the answers and the model call's Python all take
turns on it). Each worker here is a whole ``app.serve`` in its own
process (``spawn``: TensorFlow must not be forked), with its own copy of
the models, its own poll of the base paths (so a new version or a changed
model config file reaches every worker) and its own batching. The workers
listen on the same ports with ``SO_REUSEPORT``: the kernel spreads the
incoming connections over them; gRPC's own listener sets that option by
default on Linux (``grpc.so_reuseport``). The parent holds both ports bound
(not listening) from before the first worker starts until the last one
ends, so port 0 names one free port all workers share, and no other
program takes it between two workers' starts.

The parent prints the ready line once every worker has loaded its models;
on SIGTERM or SIGINT it sends SIGTERM to the workers (each drains as a
single server does) and ends when they have; if one worker dies, the others are stopped
and the command fails, for the supervisor (Kubernetes) to restart it whole.
Each worker keeps its own Prometheus counters, so one scrape sees one
worker's share.
"""
from __future__ import annotations

import contextlib
import multiprocessing
import signal
import socket
import sys
from collections.abc import Iterator, Sequence
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

from hvdk8s.serving.api.address import HOST, REST_PORT
from hvdk8s.serving.server import app

STOP_GRACE_S = 30.0
"""How long a stopping worker may take to drain before it is killed."""


def serve(workers: int, **options: Any) -> None:
    """``app.serve(**options)`` in ``workers`` processes sharing its ports; returns when they have stopped.

    Raises ``ValueError`` for options one process cannot share
    (``grpc_socket_path``), a port already taken, or a worker that fails.
    """
    if workers < 1:
        raise ValueError(f"--workers {workers}: must be at least 1")
    if options.get("grpc_socket_path"):
        raise ValueError("--grpc_socket_path is one Unix socket, which one process serves: use it with --workers 1")
    host, port = options.get("host", HOST), options.get("port", REST_PORT)
    grpc_port = options.get("grpc_port")
    grpc_port = app.default_grpc_port(port) if grpc_port is None else grpc_port
    with reserved(host, port) as rest_port, reserved(host, grpc_port) as rpc_port:
        options = {**options, "port": rest_port, "grpc_port": rpc_port, "reuse_port": True}
        context = multiprocessing.get_context("spawn")
        pipes, procs = [], []
        for i in range(workers):
            ours, theirs = context.Pipe(duplex=False)
            proc = context.Process(target=_worker, args=(options, theirs), name=f"hvdk8s-serve-{i}")
            proc.start()
            theirs.close()
            pipes.append(ours)
            procs.append(proc)
        stopping: list[int] = []
        previous = {sig: signal.signal(sig, lambda sig, _frame: stopping.append(sig))
                    for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            line = _await_ready(pipes, procs, stopping)
            if line is not None:
                print(f"{line} ({workers} worker processes)", flush=True)
                _await_end(procs, stopping)
        finally:
            _stop(procs)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    if stopping:
        return
    ended = ", ".join(f"{p.name} exited with code {p.exitcode}" for p in procs if p.exitcode != -signal.SIGTERM)
    raise ValueError(f"hvdk8s serve --workers: {ended or 'a worker ended'}; the other workers were stopped "
                     "(the worker's error is in the log above)")


@contextlib.contextmanager
def reserved(host: str, port: int) -> Iterator[int]:
    """``port`` (0: a free one) held bound with ``SO_REUSEPORT`` and not listening, for the workers to share."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            sock.bind((host, port))
        except OSError as err:
            raise ValueError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None
        yield sock.getsockname()[1]
    finally:
        sock.close()


def _worker(options: dict[str, Any], ready: Connection) -> None:
    """(In a worker process.) One server; its ready line goes to the parent, which prints one for all."""
    try:
        app.serve(**options, announce=ready.send)
    except (ValueError, FileNotFoundError) as err:  # as the CLI words a single server's: no traceback
        print(f"hvdk8s serve: error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)
    finally:
        ready.close()


def _await_ready(pipes: list[Connection], procs: Sequence[BaseProcess], stopping: list[int]) -> str | None:
    """The first worker's ready line once all have sent theirs; None if stopped or a worker ended first."""
    lines: dict[Connection, str] = {}
    while len(lines) < len(pipes) and not stopping:
        waiting = [p for p in pipes if p not in lines]
        for item in wait([*waiting, *(proc.sentinel for proc in procs)], timeout=0.5):
            if isinstance(item, Connection):
                try:
                    lines[item] = item.recv()
                except EOFError:  # the worker is ending without serving: its exit code tells why
                    procs[pipes.index(item)].join(STOP_GRACE_S)
                    return None
            else:
                return None
    return lines[pipes[0]] if not stopping else None


def _await_end(procs: Sequence[BaseProcess], stopping: list[int]) -> None:
    """Until a stop signal arrives or any worker ends."""
    while not stopping and all(p.is_alive() for p in procs):
        wait([p.sentinel for p in procs], timeout=0.5)


def _stop(procs: Sequence[BaseProcess]) -> None:
    """SIGTERM to every live worker (each drains its requests), then wait; kill any still running after the grace."""
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    for proc in procs:
        proc.join(STOP_GRACE_S)
        if proc.is_alive():
            proc.kill()
            proc.join()
