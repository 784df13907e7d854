"""``hvdk8s serve --workers N``: several real server processes behind the same REST and gRPC ports."""
from __future__ import annotations

import http.client
import json
import signal
import time
from urllib.parse import urlsplit

import numpy as np
import psutil
import pytest

from hvdk8s.serving.clients import grpc_client, loadtest, rest_client
from hvdk8s.serving.server.process import running

from conftest import hvdk8s_cli
from serving_models import export_untrained

CONNECTIONS = 16  # spread over 2 workers by the kernel's SO_REUSEPORT hash: all on one has odds 2 * 2**-16


def _workers(pid: int) -> list[psutil.Process]:
    return [p for p in psutil.Process(pid).children() if "spawn_main" in " ".join(p.cmdline())]


def _status(conn: http.client.HTTPConnection) -> list[dict]:
    conn.request("GET", "/v1/models/digits")
    response = conn.getresponse()
    assert response.status == 200
    return json.loads(response.read())["model_version_status"]


def test_two_workers_serve_share_new_versions_and_stop_gracefully(tmp_path):
    base = tmp_path / "digits"
    export_untrained(base)
    with running(base, tmp_path / "serve.log", "--workers", "2", "--poll-seconds", "0.5") as served:
        workers = _workers(served.pid)
        assert len(workers) == 2
        address = urlsplit(served.url)
        conns = [http.client.HTTPConnection(address.hostname, address.port, timeout=30) for _ in range(CONNECTIONS)]
        for conn in conns:
            assert _status(conn)[0]["version"] == "1"
        # both workers answer: each holds some of the keep-alive connections on the REST port
        for worker in workers:
            held = [c for c in worker.net_connections("tcp")
                    if c.laddr.port == address.port and c.status == psutil.CONN_ESTABLISHED]
            assert held, f"worker {worker.pid} holds none of the {CONNECTIONS} connections"
        # gRPC answers as REST does for the same images (classes exactly; probabilities, from float32 on both
        # paths, to float32 precision: the two requests may run on different workers)
        images = loadtest.digits_png(2)
        by_grpc = grpc_client.predict(served.grpc, images, model="digits")
        by_rest = rest_client.predict(served.url, images, model="digits")
        assert [sorted(p) for p in by_grpc] == [sorted(p) for p in by_rest] == [
            ["class_names", "classes", "probabilities"]] * 2
        assert [(p["classes"], p["class_names"]) for p in by_grpc] == [(p["classes"], p["class_names"]) for p in by_rest]
        np.testing.assert_allclose([p["probabilities"] for p in by_grpc], [p["probabilities"] for p in by_rest],
                                   rtol=1e-6, atol=0)

        export_untrained(base)  # version 2, which every worker's own poll must load
        pending = set(range(CONNECTIONS))
        deadline = time.monotonic() + 120
        while pending and time.monotonic() < deadline:
            pending = {i for i in pending if _status(conns[i])[0] != {
                "version": "2", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}}
            time.sleep(0.2)
        assert not pending, f"connections {sorted(pending)} still see version 1"

        served.process.send_signal(signal.SIGTERM)
        assert served.process.wait(timeout=60) == 0
        assert not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers)
        for conn in conns:
            conn.close()


def test_a_worker_that_cannot_start_fails_the_command_naming_why(tmp_path):
    result = hvdk8s_cli("serve", str(tmp_path / "missing"), "--port", "0", "--workers", "2", check=False)
    assert result.returncode == 2
    assert f"model base path {tmp_path / 'missing'}: no such directory" in result.stderr
    assert "hvdk8s serve --workers: hvdk8s-serve-" in result.stderr and "exited with code 2" in result.stderr


def test_grpc_socket_path_needs_one_worker(tmp_path):
    result = hvdk8s_cli("serve", str(tmp_path), "--workers", "2", "--grpc_socket_path", str(tmp_path / "s"),
                        check=False)
    assert result.returncode == 2
    assert "--grpc_socket_path is one Unix socket, which one process serves: use it with --workers 1" in result.stderr


@pytest.mark.parametrize("value", ["0", "-1"])
def test_workers_must_be_positive(tmp_path, value):
    result = hvdk8s_cli("serve", str(tmp_path), "--workers", value, check=False)
    assert result.returncode == 2 and f"argument --workers: {value}: must be positive" in result.stderr
