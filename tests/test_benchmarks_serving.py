"""``hvdk8s bench --serving`` report logic (benchmarks/harness/serving_bench.py) on a synthetic result: ratios, Markdown,
plot."""
from __future__ import annotations

import subprocess
import sys

import pytest

from hvdk8s.benchmarks.harness import serving_bench

# wrk 4.1's output (Debian's wrk) for a load whose every answer was a 404
WRK_OUTPUT = """Running 1s test @ http://127.0.0.1:18999/nonexistent
  1 threads and 2 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     1.50ms    1.78ms  13.22ms   85.50%
    Req/Sec     1.81k   200.41     2.23k    70.00%
  Latency Distribution
     50%  625.00us
     75%    2.17ms
     90%    3.89ms
     99%    8.35ms
  1806 requests in 1.00s, 0.90MB read
  Non-2xx or 3xx responses: 1806
Requests/sec:   1804.02
Transfer/sec:      0.89MB
"""


def load(api: str, c: int, batching: bool, rps: float, p50: float = 1.0) -> dict:
    return {"api": api, "concurrency": c, "batching": batching, "rps": rps, "images_per_second": rps, "errors": 0,
            "latency_ms": {"p50": p50, "p90": p50, "p99": 2 * p50, "max": 3 * p50}}


def cost_run(workers: int, rps: float, predict_us: float, status_rps: float, p50: float, p99: float) -> dict:
    """One worker count's wrk rounds: status at 40 µs per request, :predict at ``predict_us`` (two rounds)."""
    status = {"rps": status_rps, "server_cpu_us": 40.0, "p50_ms": 1.0, "p99_ms": 2.0, "cores_used": 0.9,
              "cpu_us_by_thread": {"event loop": 40.0, "batching and other": 0.0, "TensorFlow": 0.0}}
    predict = {"rps": rps, "server_cpu_us": predict_us, "p50_ms": p50, "p99_ms": p99, "cores_used": 0.95 * workers,
               "cpu_us_by_thread": {"event loop": predict_us / 2, "batching and other": predict_us / 4,
                                    "TensorFlow": predict_us / 4}}
    rounds = [{"status": status, "predict": predict}] * 2
    return {"workers": workers, "rounds": rounds, "summary": serving_bench._cost_summary(rounds),
            "loadtest_predict": {"rps": rps / 2, "latency_ms": {"p50": 2 * p50, "p99": 4 * p50}, "errors": 0}}


def results() -> dict:
    digits = [load("rest", 1, True, 500, p50=1.5), load("rest", 32, True, 800), load("trivial", 32, True, 1000),
              load("grpc", 32, True, 900)]
    heavy = [load(api, 32, on, rps) for api in ("rest", "grpc") for on, rps in ((True, 150), (False, 60))]
    return {
        "env": {"command": ["hvdk8s", "bench", "--serving"], "cpu_count": 2, "cpu_model": "test",
                "load_average_start": [1.0, 1.0, 1.0], "git": {"commit": "0123456789abcdef", "dirty": False}},
        "started": "2026-11-26 05:30 UTC",
        "load_average_end": [2.0, 2.0, 2.0],
        "settings": {"concurrencies": [1, 32], "soak_s": 100.0, "soak_sample_s": 10.0},
        "models": {
            "digits": {"description": "digits", "inprocess": {"batch1_images_per_s": 900, "batch32_images_per_s": 9000},
                       "loads": digits},
            "mobilenet": {"description": "mobilenet", "inprocess": {"batch1_images_per_s": 40,
                                                                    "batch32_images_per_s": 200}, "loads": heavy},
            "null": {"description": "null", "inprocess": {"batch1_images_per_s": 2000, "batch32_images_per_s": 20000},
                     "loads": [load("rest", 32, True, 950)]},
        },
        "server_cost": {"concurrency": 32, "seconds": 5.0, "load_average": [[3.5, 2.0, 1.0], [4.0, 2.25, 1.0]], "runs": [cost_run(1, 4000, 100.0, 1000.0, 3.0, 21.0),
                                                                     cost_run(2, 7000, 110.0, 1000.0, 2.5, 10.0)]},
        # 1,000 requests, one malformed one answered 500 instead of 400; 9 clients' worth of connections for 8
        "soak": {"duration_s": 100.0, "requests": 1000, "ok": 500, "errors_by_status": {"400": 499, "500": 1},
                 "expected": {"ok": 500, "400": 500}, "concurrency": 8, "connections": 9, "rps": 10.0,
                 "latency_ms": {"p50": 1.0, "p99": 2.0}, "malformed_kinds": ["not JSON"],
                 # 100 MiB through the second fifth (20-40 s), 103 MiB through the last (80-100 s)
                 "rss_mb": [[t, 90.0 if t < 20 else 100.0 if t < 60 else 103.0] for t in range(0, 100, 10)]},
    }


def test_checks_are_the_issue_targets_as_ratios_of_one_run(tmp_path):
    data = results()
    checks = {c["name"]: (round(c["measured"], 3), c["met"]) for c in serving_bench.checks(data)}
    assert checks == {
        "p50_ms_c1": (1.5, True),
        "predict_vs_trivial_c32_null": (0.95, True),
        "predict_vs_trivial_c32_digits": (0.8, True),
        "batching_vs_inprocess_b32_rest": (0.75, True),
        "batching_on_vs_off_rest": (2.5, True),
        "batching_vs_inprocess_b32_grpc": (0.75, True),
        "batching_on_vs_off_grpc": (2.5, True),
        "soak_unexpected": (1.0, False),
        "soak_reconnects": (1, False),
        "soak_rss_growth_pct": (3.0, True),
        "server_cpu_predict_vs_status_c32": (2.5, False),  # the one-worker run: 100 / 40 µs
        "p99_over_p50_c32": (7.0, False),
    }
    data["checks"] = serving_bench.checks(data)
    paths = serving_bench.write(data, tmp_path)
    text = paths["markdown"].read_text()
    assert ("| digits (with the model's own compute), REST, c=32: :predict requests/s / status endpoint requests/s "
            "| 0.8 | 0.7 | yes |") in text
    assert "| REST status (no model) | on | 32 | 1,000 |" in text
    assert "| 500 | 0 | 1 |" in text and "first 90 MB, min 90, max 103, last 103 MB" in text
    assert "`hvdk8s bench --serving` · 2026-11-26 05:30 UTC · commit 0123456 · 2 CPUs" in text
    assert "load average 3.5/2/1 at the start, 4/2.25/1 at the end." in text
    assert "| 1 | wrk: POST :predict | 4,000 | 100 | 0.95 | 3.00 | 21.00 | 7.0 |" in text
    assert "| 2 | hvdk8s loadtest: :predict | 3,500 |  |  | 5.00 | 10.00 | 2.0 |" in text
    assert ("1 worker(s): 4,000 :predict/s on 0.95 cores (4,211 per core); 2 worker(s): 7,000 :predict/s on 1.90 "
            "cores (3,684 per core)") in text
    assert "| 1 | GET status | 40 | 0 | 0 | 40 |" in text
    assert "| 2 | POST :predict | 55 | 28 | 28 | 110 |" in text  # 27.5 rounds to even
    assert ("One worker: the model call alone (batch threads and TensorFlow's threads, 50 µs) costs 1.25× a whole "
            "status request (40 µs); the event loop spends 10 µs more") in text
    assert "would leave the event loop about 0 µs for that." in text
    assert paths["plot"].read_bytes()[:4] == b"\x89PNG"


def test_server_cpu_is_split_into_event_loop_other_python_threads_and_tensorflows_threads(tmp_path):
    """A real process tree: a main thread, a Python thread, and a thread named as TensorFlow names its own."""
    script = tmp_path / "spin.py"
    script.write_text(
        "import sys, threading, time\n"
        "spun, alive = threading.Semaphore(0), threading.Event()\n"
        "def spin(seconds, name=None):\n"
        "    if name:  # what TensorFlow's threads are called (tsl's thread names)\n"
        "        open(f'/proc/self/task/{threading.get_native_id()}/comm', 'w').write(name)\n"
        "    end = time.thread_time() + seconds\n"
        "    while time.thread_time() < end: pass\n"
        "    spun.release()\n"
        "    alive.wait()  # still running when the CPU is read, as a server's threads are\n"
        "threads = [threading.Thread(target=spin, args=(0.2,)), threading.Thread(target=spin, args=(0.4, 'tf_Compute'))]\n"
        "for t in threads: t.start()\n"
        "end = time.thread_time() + 0.6\n"
        "while time.thread_time() < end: pass\n"
        "for t in threads: spun.acquire()\n"
        "print('done', flush=True)\n"
        "sys.stdin.read()\n"
        "alive.set()\n")
    proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "done\n"
        cpu = serving_bench._tree_cpu_s(proc.pid)
    finally:
        proc.communicate("")
    assert cpu["event loop"] == pytest.approx(0.6, abs=0.1)
    assert cpu["TensorFlow"] == pytest.approx(0.4, abs=0.1)
    assert cpu["batching and other"] == pytest.approx(0.2 + (cpu["total"] - 1.2), abs=0.1)  # and the start-up's
    assert cpu["total"] == pytest.approx(sum(v for k, v in cpu.items() if k != "total"))


def test_without_wrk_the_report_says_so_and_has_no_wrk_checks(tmp_path):
    data = results()
    data["server_cost"] = {"skipped": "wrk is not on PATH (Debian: apt-get install wrk): no wrk figures in this run"}
    data["checks"] = serving_bench.checks(data)
    assert not {"server_cpu_predict_vs_status_c32", "p99_over_p50_c32"} & {c["name"] for c in data["checks"]}
    text = serving_bench.write(data, tmp_path)["markdown"].read_text()
    assert "Not measured: wrk is not on PATH (Debian: apt-get install wrk): no wrk figures in this run." in text


def test_wrk_output_is_read_as_requests_latencies_and_bad_answers():
    assert serving_bench.parse_wrk(WRK_OUTPUT) == {"requests": 1806, "p50_ms": 0.625, "p99_ms": 8.35, "non_2xx": 1806}
    # latencies of a second and more are printed in seconds, padded to the width of "ms"
    assert serving_bench.parse_wrk(WRK_OUTPUT.replace("99%    8.35ms", "99%    1.19s "))["p99_ms"] == 1190.0
    with pytest.raises(ValueError, match="unexpected wrk output"):
        serving_bench.parse_wrk(WRK_OUTPUT.replace("Latency Distribution", "").replace("     99%    8.35ms\n", ""))
