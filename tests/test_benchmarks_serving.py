"""``hvdk8s bench --serving`` report logic (benchmarks/serving.py) on a synthetic result: ratios, Markdown, plot."""
from __future__ import annotations

from hvdk8s.benchmarks import serving


def load(api: str, c: int, batching: bool, rps: float, p50: float = 1.0) -> dict:
    return {"api": api, "concurrency": c, "batching": batching, "rps": rps, "images_per_second": rps, "errors": 0,
            "latency_ms": {"p50": p50, "p90": p50, "p99": 2 * p50, "max": 3 * p50}}


def results() -> dict:
    digits = [load("rest", 1, True, 500, p50=1.5), load("rest", 32, True, 800), load("trivial", 32, True, 1000),
              load("grpc", 32, True, 900)]
    heavy = [load(api, 32, on, rps) for api in ("rest", "grpc") for on, rps in ((True, 150), (False, 60))]
    return {
        "env": {"command": ["hvdk8s", "bench", "--serving"], "cpu_count": 2, "cpu_model": "test",
                "load_average_start": [1.0, 1.0, 1.0]},
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
        # 1,000 requests, one malformed one answered 500 instead of 400; 9 clients' worth of connections for 8
        "soak": {"duration_s": 100.0, "requests": 1000, "ok": 500, "errors_by_status": {"400": 499, "500": 1},
                 "expected": {"ok": 500, "400": 500}, "concurrency": 8, "connections": 9, "rps": 10.0,
                 "latency_ms": {"p50": 1.0, "p99": 2.0}, "malformed_kinds": ["not JSON"],
                 # 100 MiB through the second fifth (20-40 s), 103 MiB through the last (80-100 s)
                 "rss_mb": [[t, 90.0 if t < 20 else 100.0 if t < 60 else 103.0] for t in range(0, 100, 10)]},
    }


def test_checks_are_the_issue_targets_as_ratios_of_one_run(tmp_path):
    data = results()
    checks = {c["name"]: (round(c["measured"], 3), c["met"]) for c in serving.checks(data)}
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
    }
    data["checks"] = serving.checks(data)
    paths = serving.write(data, tmp_path)
    text = paths["markdown"].read_text()
    assert ("| digits (with the model's own compute), REST, c=32: :predict requests/s / status endpoint requests/s "
            "| 0.8 | 0.7 | yes |") in text
    assert "| REST status (no model) | on | 32 | 1,000 |" in text
    assert "| 500 | 0 | 1 |" in text and "first 90 MB, min 90, max 103, last 103 MB" in text
    assert paths["plot"].read_bytes()[:4] == b"\x89PNG"
