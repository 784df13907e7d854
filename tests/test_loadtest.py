"""``hvdk8s loadtest`` against a real ``hvdk8s serve`` process: counts, percentiles, JSON, plot, SLO exit codes."""
from __future__ import annotations

import base64
import json
import subprocess

import pytest

from hvdk8s.serving.clients import loadtest
from hvdk8s.serving.server.process import running

from serving_models import CLI, export_untrained

CONTRACT_KEYS = {
    "requests", "ok", "errors", "errors_by_status", "duration_s", "rps", "latency_ms", "concurrency",
    "connections", "images_per_request", "slo",
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    base = tmp_path_factory.mktemp("models") / "digits"
    export_untrained(base)
    with running(base, base.parent / "stderr.log") as srv:
        yield srv


def loadtest_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "loadtest", *args], capture_output=True, text=True, timeout=120)


def test_cli_counts_every_request_and_writes_json_and_plot(server, tmp_path):
    run = loadtest_cli(server.url, "--model", "digits", "--concurrency", "4", "--requests", "40", "--images", "3",
                       "--json", str(tmp_path / "r.json"), "--plot", str(tmp_path / "r.png"),
                       "--max-p99-ms", "10000", "--max-error-rate", "0")
    assert run.returncode == 0, run.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    assert CONTRACT_KEYS <= set(doc)
    assert (doc["requests"], doc["ok"], doc["errors"], doc["errors_by_status"]) == (40, 40, 0, {})
    assert (doc["concurrency"], doc["connections"], doc["images_per_request"]) == (4, 4, 3)
    lat = doc["latency_ms"]
    assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"]
    assert doc["rps"] == pytest.approx(40 / doc["duration_s"])
    assert doc["slo"] == {"max_p99_ms": 10000, "max_error_rate": 0, "passed": True}
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "requests     40 in" in run.stdout and "errors       none" in run.stdout
    assert "connections  4 opened" in run.stdout


def test_missed_thresholds_exit_1_and_say_which(server):
    run = loadtest_cli(server.url, "--requests", "10", "--max-p99-ms", "0.001")
    assert run.returncode == 1 and "SLO missed: p99 latency" in run.stderr and "--max-p99-ms 0.001" in run.stderr
    run = loadtest_cli(server.url, "--model", "mnist", "--requests", "10", "--max-error-rate", "0.5")
    assert run.returncode == 1 and "error rate 1.0000 exceeds --max-error-rate 0.5" in run.stderr
    assert "errors       404: 10" in run.stdout


def test_a_run_whose_every_request_failed_exits_1_without_thresholds(server):
    run = loadtest_cli(server.url, "--model", "mnist", "--requests", "4")
    assert run.returncode == 1 and "errors       404: 4" in run.stdout
    assert "every request failed (404: 4); check --model 'mnist'" in run.stderr
    assert f"(GET {server.url}/v1/models/mnist)" in run.stderr


def test_python_api_duration_bound_and_errors_by_status(server, tmp_path):
    result = loadtest.run(server.url, "digits", concurrency=2, duration=0.5)
    doc = result.to_dict()
    assert doc["requests"] == doc["ok"] > 0 and 0.5 <= doc["duration_s"] < 5
    (image := tmp_path / "x.png").write_bytes(b"not an image")
    bad = loadtest.run(server.url, "digits", concurrency=2, requests=6, images=[image.read_bytes()])
    assert bad.to_dict()["errors_by_status"] == {"400": 6}
    assert bad.connections == 2  # keep-alive held after every 400
    refused = loadtest.run("http://127.0.0.1:1", "digits", concurrency=2, requests=4)
    assert refused.to_dict()["errors_by_status"] == {loadtest.CONNECTION_ERROR: 4}
    assert refused.connections == 0


def test_raw_bodies_cycle_in_order_and_each_gets_its_status(server):
    good = json.dumps({"instances": [{"b64": base64.b64encode(loadtest.digits_png(1)[0]).decode()}]}).encode()
    bodies = [good, b"{", b'{"instances": [1e400]}', good]
    result = loadtest.run(server.url, "digits", concurrency=3, requests=10, bodies=bodies)
    # request i sends bodies[i % 4]: 0,3,4,7,8 good (5); 1,2,5,6,9 malformed (5)
    assert (result.ok, result.errors_by_status, result.connections) == (5, {"400": 5}, 3)
    with pytest.raises(ValueError, match="for REST"):
        loadtest.run(server.grpc, "digits", grpc=True, requests=1, bodies=bodies)
    with pytest.raises(ValueError, match="expected http://host:port"):
        loadtest.run("127.0.0.1:8501", "digits", requests=1)
