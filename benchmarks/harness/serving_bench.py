"""``hvdk8s bench --serving``: the serving path under load, next to the model's in-process rate, in one run.

Two models are exported to a temporary folder: the digits CNN (the product's
example; signature well under 1 ms) and ``keras.applications.MobileNetV2``
(alpha 0.35 at 96x96, one of its ImageNet input sizes) with random weights
(``weights=None``, nothing is downloaded): about 10 ms per image at batch 1
here, several times cheaper per image at batch 32, so batching matters. For each, ``hvdk8s serve``
runs as a child process with batching on (the default) and off, and
``hvdk8s loadtest`` drives it over REST and gRPC at each concurrency with
single-image requests, after an untimed warm-up load. In the same run: the SavedModel's ``serving_default``
called directly at batch 1 and 32 (the ceiling, see ``_inprocess``), and the model
status endpoint (``GET /v1/models/NAME``) on the same server under the same
load generator (the server stack without the model: the HTTP/JSON cost).
Last, a soak: the digits server under a mixed REST load of good and
malformed requests (every kind of bad input the server must answer with a
400 and keep the connection) for ``soak_s`` seconds, its resident memory
sampled throughout.

The load generator runs on the same machine as the server, so on a small
machine both compete for the cores: the ratios, measured side by side, are
what to compare, not the absolute rates.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hvdk8s.common import atomic, figures

from ..machine import envinfo
from ..reporting import report


@dataclass(frozen=True)
class Settings:
    duration_s: float = 5.0  # per load run
    concurrencies: tuple[int, ...] = (1, 8, 32)
    inprocess_s: float = 3.0  # timed seconds per in-process rate
    heavy_size: int = 96  # MobileNetV2 input side
    heavy_alpha: float = 0.35
    soak_s: float = 300.0
    soak_concurrency: int = 8
    soak_sample_s: float = 2.0  # server RSS sampling period
    wrk_s: float = 5.0  # per wrk load in the server-cost section
    wrk_rounds: int = 3  # status and :predict loads, interleaved
    wrk_concurrency: int = 32
    workers: tuple[int, ...] = (1, 2)  # hvdk8s serve --workers counts measured


QUICK = Settings(duration_s=2.0, inprocess_s=1.5, soak_s=30.0, wrk_s=2.0, wrk_rounds=2)
TARGETS = {
    "p50_ms_c1": 3.0,  # digits, REST, concurrency 1, keep-alive, one image
    "predict_vs_trivial_c32": 0.7,
    "batching_vs_inprocess_b32": 0.6,
    "batching_on_vs_off": 2.0,
    "soak_unexpected": 0,  # answers other than the expected 200 or 400
    "soak_reconnects": 0,  # connections opened beyond one per client
    "soak_rss_growth_pct": 5.0,  # resident memory, last fifth of the soak over its second fifth
    "server_cpu_predict_vs_status": 2.0,  # null model, wrk, one worker: CPU per :predict / per status, at most
    "p99_over_p50": 5.0,  # null model, wrk, one worker, :predict: no collector or scheduling stalls
}
# model -> batching on/off -> the APIs loaded ("trivial": the model status endpoint, no model involved)
PLAN: dict[str, dict[bool, tuple[str, ...]]] = {
    "digits": {True: ("rest", "grpc", "trivial"), False: ("rest", "grpc")},
    "mobilenet": {True: ("rest", "grpc"), False: ("rest", "grpc")},
    "null": {True: ("rest",)},
}
# Bad requests of every kind the server must refuse with a 400 and survive (TF Serving's answers:
# tests/test_serving_http.py checks each one's message).
MALFORMED_BODIES = {
    "not JSON": b"{",
    "bad base64": b'{"instances": [{"b64": "%%%"}]}',
    "not an image": b'{"instances": [{"b64": "bm90IGFuIGltYWdl"}]}',
    "beyond double range": b'{"instances": [1e400]}',
    "400-digit integer": b'{"instances": [' + b"9" * 400 + b"]}",
    "100,000-deep list": b'{"instances": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "no instances": b'{"signature_name": "serving_default"}',
}


def run(settings: Settings, command: list[str]) -> dict[str, Any]:
    """Measure everything; ``write`` turns the result into ``serving.json``, ``serving.md`` and ``serving.png``."""
    from tqdm import tqdm

    from hvdk8s.serving.server.process import running

    results: dict[str, Any] = {"env": envinfo.collect(command), "settings": asdict(settings), "models": {},
                               "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    with tempfile.TemporaryDirectory(prefix="hvdk8s-bench-serving-") as tmp:
        models = _export_models(Path(tmp), settings)
        loads = sum(len(apis) for plan in PLAN.values() for apis in plan.values()) * len(settings.concurrencies)
        bar = tqdm(total=loads + 2, unit="load", desc="serving")
        for name, (base, description) in models.items():
            rows: list[dict[str, Any]] = []
            results["models"][name] = {"description": description, "inprocess": _inprocess(base, settings),
                                       "loads": rows}
            for batching, apis in PLAN[name].items():
                args = [] if batching else ["--enable_batching=false"]
                with running(base, Path(tmp) / f"{name}-{batching}.log", *args) as served:
                    for api in apis:
                        target = served.grpc if api == "grpc" else served.url
                        _warm_up(target, name, api, max(settings.concurrencies))
                        for c in settings.concurrencies:
                            rows.append(_load(target, name, api, c, batching, settings))
                            bar.update()
        results["server_cost"] = server_cost(models["null"][0], Path(tmp), settings)
        bar.update()
        with running(models["digits"][0], Path(tmp) / "soak.log") as served:
            results["soak"] = _soak(served, settings)
            bar.update()
        bar.close()
    results["load_average_end"] = envinfo.load_average()
    results["checks"] = checks(results)
    return results


def _export_models(root: Path, settings: Settings) -> dict[str, tuple[Path, str]]:
    import keras

    from hvdk8s import models, serving

    keras.utils.set_random_seed(0)
    digits = serving.export(models.cnn("cnn", seed=0), root / "digits")
    heavy = keras.applications.MobileNetV2(
        weights=None, input_shape=(settings.heavy_size, settings.heavy_size, 3), alpha=settings.heavy_alpha, classes=10
    )
    size = settings.heavy_size
    return {
        "digits": (digits.parent, "digits CNN (28x28x1), PNG bytes in"),
        "mobilenet": (serving.export(heavy, root / "mobilenet", preprocessing="symmetric").parent,
                      f"MobileNetV2 alpha {settings.heavy_alpha} ({size}x{size}x3), random weights, PNG bytes in"),
        "null": (_export_null(root),
                 "null model: the digits signature (PNG bytes in, decoded and resized to 28x28x1) and one average "
                 "as the model, so :predict costs what the serving path adds (parsing, base64, decoding, dispatch, "
                 "response)"),
    }


def _export_null(root: Path) -> Path:
    """The null model's base path: the digits signature with one average as the model."""
    import keras

    from hvdk8s import serving

    null = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.GlobalAveragePooling2D()], name="null")
    return serving.export(null, root / "null").parent


def server_cost(base: Path, tmp: Path, settings: Settings) -> dict[str, Any]:
    """The server's own cost (issue #26) on the null model, for each ``--workers`` count in ``settings.workers``.

    ``wrk`` (a C load generator, far cheaper per request than the Python
    ``hvdk8s loadtest``) at ``wrk_concurrency`` on keep-alive against GET
    status and POST ``:predict`` (one PNG), interleaved for ``wrk_rounds``
    rounds; for each load the server's CPU per request (its whole process
    tree, from /proc), the cores it used (CPU seconds over wall seconds)
    and wrk's p50/p99; then ``hvdk8s loadtest`` on ``:predict`` beside it.
    Without ``wrk`` on PATH (Debian: ``apt-get install wrk``) the section
    says so and has no figures.
    """
    import base64
    import shutil

    from hvdk8s.serving.clients import loadtest
    from hvdk8s.serving.server.process import running

    if not shutil.which("wrk"):
        return {"skipped": "wrk is not on PATH (Debian: apt-get install wrk): no wrk figures in this run"}
    png = loadtest.digits_png(1)[0]
    body = json.dumps({"instances": [{"b64": base64.b64encode(png).decode()}]})
    script = tmp / "predict.lua"
    script.write_text(f'wrk.method = "POST"\nwrk.body = {json.dumps(body)}\n'
                      'wrk.headers["Content-Type"] = "application/json"\n')
    runs, load_average = [], envinfo.load_average()
    for workers in settings.workers:
        with running(base, tmp / f"null-workers-{workers}.log", "--workers", str(workers)) as served:
            status_url, predict_url = f"{served.url}/v1/models/null", f"{served.url}/v1/models/null:predict"
            for url, lua in ((status_url, None), (predict_url, script)):  # warm-up: kernels, connections
                _wrk(url, served.pid, lua, settings.wrk_concurrency, 2.0)
            rounds = [{"status": _wrk(status_url, served.pid, None, settings.wrk_concurrency, settings.wrk_s),
                       "predict": _wrk(predict_url, served.pid, script, settings.wrk_concurrency, settings.wrk_s)}
                      for _ in range(settings.wrk_rounds)]
            load = loadtest.run(served.url, "null", concurrency=settings.wrk_concurrency, duration=settings.wrk_s,
                                images=[png]).to_dict()
        runs.append({"workers": workers, "rounds": rounds, "summary": _cost_summary(rounds),
                     "loadtest_predict": {"rps": load["rps"], "latency_ms": load["latency_ms"],
                                          "errors": load["errors"]}})
    return {"concurrency": settings.wrk_concurrency, "seconds": settings.wrk_s, "runs": runs,
            "load_average": [load_average, envinfo.load_average()]}


def _wrk(url: str, pid: int, script: Path | None, concurrency: int, seconds: float) -> dict[str, Any]:
    """One wrk load: its requests/s and latencies, and the server process tree's CPU over it (by thread kind)."""
    import subprocess

    before, start = _tree_cpu_s(pid), time.perf_counter()
    out = subprocess.run(["wrk", "-t1", f"-c{concurrency}", f"-d{seconds:g}s", "--latency",
                          *(["-s", str(script)] if script else []), url],
                         capture_output=True, text=True, check=True).stdout
    wall, after = time.perf_counter() - start, _tree_cpu_s(pid)
    parsed = parse_wrk(out)
    if parsed["non_2xx"]:
        raise RuntimeError(f"wrk: {parsed['non_2xx']:.0f} of {parsed['requests']:.0f} answers from {url} were not "
                           "2xx: the server cost would be an error path's")
    done = max(parsed["requests"], 1)
    per_request = {kind: (after[kind] - before[kind]) / done * 1e6 for kind in THREAD_KINDS}
    used = after["total"] - before["total"]
    return {**parsed, "rps": parsed["requests"] / seconds, "server_cpu_us": used / done * 1e6,
            "cores_used": used / wall, "cpu_us_by_thread": per_request}


def parse_wrk(text: str) -> dict[str, float]:
    """Requests, p50/p99 (ms) and non-2xx answers from ``wrk --latency`` output."""
    import re

    done = re.search(r"(\d+) requests in", text)
    ms = {p: float(v) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[u]
          for p, v, u in re.findall(r"^\s+(50|99)%\s+([\d.]+)(us|ms|s)\s*$", text, re.M)}
    if done is None or set(ms) != {"50", "99"}:
        raise ValueError(f"unexpected wrk output (no request count or latency distribution): {text[-2000:]}")
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    return {"requests": int(done.group(1)), "p50_ms": ms["50"], "p99_ms": ms["99"],
            "non_2xx": int(bad.group(1)) if bad else 0}


THREAD_KINDS = ("event loop", "batching and other", "TensorFlow")
"""Where the server's CPU goes: each process's main thread (uvicorn's event loop: HTTP, JSON, dispatch), its
other Python threads (the batch threads calling the model, gRPC, polling) and TensorFlow's own threads (``tf_*``:
the graph's kernels)."""


def _tree_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) of ``pid`` and its live descendants (the worker processes), in total and by
    ``THREAD_KINDS`` (threads that have ended count under "batching and other")."""
    import psutil

    root = psutil.Process(pid)
    total = loop = tf = 0.0
    for proc in (root, *root.children(recursive=True)):
        total += sum(proc.cpu_times()[:2])
        for thread in proc.threads():
            spent = thread.user_time + thread.system_time
            if thread.id == proc.pid:
                loop += spent
            elif _thread_name(proc.pid, thread.id).startswith("tf_"):
                tf += spent
    return {"total": total, "event loop": loop, "TensorFlow": tf, "batching and other": total - loop - tf}


def _thread_name(pid: int, tid: int) -> str:
    try:
        return Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
    except OSError:  # the thread has just ended
        return ""


def _cost_summary(rounds: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """Medians over the rounds (each ratio taken within its round, where status and predict ran side by side)."""
    def median(values: list[float]) -> float:
        return float(np.median(values))

    return {
        "status_rps": median([r["status"]["rps"] for r in rounds]),
        "predict_rps": median([r["predict"]["rps"] for r in rounds]),
        "status_cpu_us": median([r["status"]["server_cpu_us"] for r in rounds]),
        "predict_cpu_us": median([r["predict"]["server_cpu_us"] for r in rounds]),
        "predict_cores_used": median([r["predict"]["cores_used"] for r in rounds]),
        "cpu_predict_over_status": median([r["predict"]["server_cpu_us"] / r["status"]["server_cpu_us"]
                                           for r in rounds]),
        "predict_p50_ms": median([r["predict"]["p50_ms"] for r in rounds]),
        "predict_p99_ms": median([r["predict"]["p99_ms"] for r in rounds]),
        "p99_over_p50_predict": median([r["predict"]["p99_ms"] / r["predict"]["p50_ms"] for r in rounds]),
        **{f"{load}_cpu_us_by_thread": {kind: median([r[load]["cpu_us_by_thread"][kind] for r in rounds])
                                        for kind in THREAD_KINDS} for load in ("status", "predict")},
    }


def _inprocess(base: Path, settings: Settings) -> dict[str, Any]:
    """Images/s of ``serving_default`` called directly at batch 1 and 32: the ceiling the server is held to.

    Measured in a fresh process for each intra-op thread setting, TensorFlow's
    own (0) and the one the server picks (``core.tensorflow_threads``), since
    the setting is fixed when TensorFlow starts; each rate is the faster of
    the two, and both are kept.
    """
    import multiprocessing

    from hvdk8s.serving.server.batching import BatchingParameters
    from hvdk8s.serving.server.core import tensorflow_threads

    by_setting = {}
    for intra in sorted({0, tensorflow_threads(BatchingParameters())}):
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            by_setting[str(intra)] = pool.apply(_inprocess_rates, (str(base), intra, settings.inprocess_s))
    best = {key: max(rates[key] for rates in by_setting.values()) for key in next(iter(by_setting.values()))}
    return {**best, "by_intra_op_threads": by_setting}


def _inprocess_rates(base: str, intra_op_threads: int, seconds: float) -> dict[str, float]:
    """(In a child process.) Warm rates at batch 1 and 32 with this many intra-op threads (0: TensorFlow picks)."""
    import tensorflow as tf

    from hvdk8s.serving.clients import loadtest

    tf.config.threading.set_intra_op_parallelism_threads(intra_op_threads)
    signature = tf.saved_model.load(os.path.join(base, "1")).signatures["serving_default"]
    images = loadtest.digits_png(32)
    rates = {}
    for batch in (1, 32):
        x = tf.constant(images[:batch])
        signature(image_bytes=x)  # trace and warm up
        calls, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            signature(image_bytes=x)
            calls += 1
        rates[f"batch{batch}_images_per_s"] = calls * batch / (time.perf_counter() - start)
    return rates


def _warm_up(target: str, model: str, api: str, concurrency: int) -> None:
    """Untimed requests first: TensorFlow builds its kernels for each new batch size on first use."""
    from hvdk8s.serving.clients import loadtest

    if api != "trivial":
        loadtest.run(target, model, grpc=api == "grpc", concurrency=concurrency, requests=8 * concurrency)


def _load(target: str, model: str, api: str, concurrency: int, batching: bool, settings: Settings) -> dict:
    from hvdk8s.serving.clients import loadtest

    result = loadtest.run(
        target, model, grpc=api == "grpc", concurrency=concurrency, duration=settings.duration_s,
        get_path=f"/v1/models/{model}" if api == "trivial" else None,
    )
    return {**result.to_dict(), "api": api, "batching": batching}


def _soak(served: Any, settings: Settings) -> dict[str, Any]:
    """Good and malformed REST requests alternating for ``soak_s`` seconds; the server's RSS every ``soak_sample_s``."""
    import threading

    import psutil

    from hvdk8s.serving.clients import loadtest
    from hvdk8s.serving.clients.rest_client import request_body

    good = [json.dumps(request_body([png])).encode() for png in loadtest.digits_png(len(MALFORMED_BODIES))]
    bodies = [body for pair in zip(good, MALFORMED_BODIES.values()) for body in pair]  # good, bad, good, bad, ...
    server, samples, done = psutil.Process(served.pid), [], threading.Event()
    start = time.perf_counter()

    def sample() -> None:
        while not done.is_set():
            samples.append((time.perf_counter() - start, server.memory_info().rss / 2**20))
            done.wait(settings.soak_sample_s)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        result = loadtest.run(served.url, "digits", concurrency=settings.soak_concurrency, duration=settings.soak_s,
                              bodies=bodies)
    finally:
        done.set()
        sampler.join()
    bad = result.requests // 2  # request i sends bodies[i % len(bodies)]: the odd ones are malformed
    return {**result.to_dict(), "expected": {"ok": result.requests - bad, "400": bad},
            "malformed_kinds": list(MALFORMED_BODIES), "rss_mb": samples}


def _answers(soak: dict[str, Any]) -> dict[str, int]:
    """The soak's answers by status ("ok" or the HTTP code), to set beside its ``expected``."""
    return {"ok": soak["ok"], **soak["errors_by_status"]}


def rss_growth_pct(samples: list[list[float]], duration_s: float) -> float | None:
    """Median RSS over the soak's last fifth relative to its second fifth (the first is warm-up), in percent."""
    fifth = duration_s / 5

    def median(lo: float, hi: float) -> float | None:
        window = [mb for t, mb in samples if lo <= t < hi]
        return float(np.median(window)) if window else None

    early, late = median(fifth, 2 * fifth), median(4 * fifth, math.inf)
    return None if early is None or late is None else 100.0 * (late - early) / early


def _find(loads: list[dict], api: str, concurrency: int, batching: bool) -> dict[str, Any] | None:
    return next((r for r in loads if (r["api"], r["concurrency"], r["batching"]) == (api, concurrency, batching)),
                None)


def checks(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets as measured ratios: (name, measured, target, met)."""
    digits, heavy = results["models"]["digits"], results["models"]["mobilenet"]
    c_max = max(results["settings"]["concurrencies"])
    out = []

    def add(name: str, what: str, value: float | None, target: float, higher: bool = True) -> None:
        met = value is not None and (value >= target if higher else value <= target)
        out.append({"name": name, "what": what, "measured": value, "target": target, "met": met})

    c1 = _find(digits["loads"], "rest", 1, True)
    add("p50_ms_c1", "digits, REST, concurrency 1: p50 latency (ms), target at most",
        c1["latency_ms"]["p50"] if c1 else None, TARGETS["p50_ms_c1"], higher=False)
    trivial = _find(digits["loads"], "trivial", c_max, True)
    for name, what in (("null", "null model (the serving path without model compute)"),
                       ("digits", "digits (with the model's own compute)")):
        predict = _find(results["models"][name]["loads"], "rest", c_max, True)
        add(f"predict_vs_trivial_c32_{name}", f"{what}, REST, c={c_max}: :predict requests/s / status endpoint "
            "requests/s", predict["rps"] / trivial["rps"] if predict and trivial else None, TARGETS["predict_vs_trivial_c32"])
    for api in ("rest", "grpc"):
        on, off = _find(heavy["loads"], api, c_max, True), _find(heavy["loads"], api, c_max, False)
        add(f"batching_vs_inprocess_b32_{api}",
            f"MobileNetV2, {api}, c={c_max}, batching on: images/s / in-process batch-32 images/s",
            on["images_per_second"] / heavy["inprocess"]["batch32_images_per_s"] if on else None,
            TARGETS["batching_vs_inprocess_b32"])
        add(f"batching_on_vs_off_{api}", f"MobileNetV2, {api}, c={c_max}: batching on / off images/s",
            on["images_per_second"] / off["images_per_second"] if on and off else None, TARGETS["batching_on_vs_off"])
    one = next((r["summary"] for r in results.get("server_cost", {}).get("runs", []) if r["workers"] == 1), None)
    if one is not None:  # no wrk, no figures: the report says so instead
        c = results["server_cost"]["concurrency"]
        add("server_cpu_predict_vs_status_c32", f"null model, wrk, c={c}, one worker: server CPU per :predict / per "
            "status request, at most", one["cpu_predict_over_status"], TARGETS["server_cpu_predict_vs_status"],
            higher=False)
        add("p99_over_p50_c32", f"null model, wrk, c={c}, one worker: :predict p99 / p50 latency, at most",
            one["p99_over_p50_predict"], TARGETS["p99_over_p50"], higher=False)
    soak = results["soak"]
    got = _answers(soak)
    add("soak_unexpected", f"soak, {soak['duration_s']:.0f} s of good and malformed REST requests: answers other "
        "than the expected 200/400, at most", sum(abs(got.get(k, 0) - soak["expected"].get(k, 0))
                                                  for k in {*got, *soak["expected"]}) / 2,
        TARGETS["soak_unexpected"], higher=False)
    add("soak_reconnects", f"soak: connections opened beyond the {soak['concurrency']} clients', at most",
        soak["connections"] - soak["concurrency"], TARGETS["soak_reconnects"], higher=False)
    add("soak_rss_growth_pct", "soak: server RSS growth, last fifth over second fifth (%), at most",
        rss_growth_pct(soak["rss_mb"], results["settings"]["soak_s"]), TARGETS["soak_rss_growth_pct"], higher=False)
    return out


def write(results: dict[str, Any], out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "serving.json", "markdown": out / "serving.md", "plot": out / "serving.png"}
    atomic.write_json(paths["json"], results)
    plot(results, paths["plot"])
    atomic.write_text(paths["markdown"], markdown(results, paths["plot"].name))
    return paths


def markdown(results: dict[str, Any], plot_name: str) -> str:
    env = results["env"]
    lines = [
        "# hvdk8s serving benchmark",
        "",
        f"`{' '.join(env['command'])}` · {results.get('started', 'date not recorded')} · {_commit(env)} · "
        f"{env['cpu_count']} CPUs ({env['cpu_model']}) · load average at start "
        f"{env['load_average_start']}, at the end {results.get('load_average_end')} · single-image requests, keep-alive, load generator on the same machine "
        "(it competes with the server for the cores: compare ratios, not absolute rates).",
        "",
        "## Targets (ratios measured side by side in this run)",
        "",
        report.table(["check", "measured", "target", "met"], [
            [c["what"], report.num(c["measured"]), report.num(c["target"]), "yes" if c["met"] else "**no**"]
            for c in results["checks"]
        ]),
    ]
    for name, model in results["models"].items():
        inproc = model["inprocess"]
        lines += [
            "",
            f"## {name}: {model['description']}",
            "",
            f"In process (`serving_default` called directly): batch 1 {report.num(inproc['batch1_images_per_s'])} "
            f"images/s, batch 32 {report.num(inproc['batch32_images_per_s'])} images/s{_by_threads(inproc)}.",
            "",
            report.table(
                ["API", "batching", "concurrency", "requests/s", "p50 ms", "p99 ms", "errors"],
                [[r["api"] if r["api"] != "trivial" else "REST status (no model)", "on" if r["batching"] else "off",
                  str(r["concurrency"]), report.num(r["rps"]), f"{r['latency_ms']['p50']:.2f}",
                  f"{r['latency_ms']['p99']:.2f}", str(r["errors"])] for r in model["loads"]],
            ),
        ]
    lines += _cost_markdown(results.get("server_cost"))
    soak = results["soak"]
    got = _answers(soak)
    rss = [mb for _, mb in soak["rss_mb"]]
    lines += [
        "",
        f"## Soak: {soak['duration_s']:.0f} s of good and malformed REST requests (digits, "
        f"{soak['concurrency']} keep-alive clients)",
        "",
        f"Every other request is malformed, cycling through: {', '.join(soak['malformed_kinds'])}.",
        "",
        report.table(["answer", "expected", "got"],
                     [[k, str(soak["expected"].get(k, 0)), str(got.get(k, 0))] for k in sorted({*got, *soak["expected"]})]),
        "",
        f"{soak['requests']:,} requests ({report.num(soak['rps'])}/s, p50 {soak['latency_ms']['p50']:.2f} ms, p99 "
        f"{soak['latency_ms']['p99']:.2f} ms); {soak['connections']} connections opened. Server RSS (sampled every "
        f"{results['settings']['soak_sample_s']:g} s): first {rss[0]:.0f} MB, min {min(rss):.0f}, max {max(rss):.0f}, "
        f"last {rss[-1]:.0f} MB.",
        "",
        f"![requests/s by concurrency, and the server's memory during the soak]({plot_name})",
        "",
    ]
    return "\n".join(lines)


def _cost_markdown(cost: dict[str, Any] | None) -> list[str]:
    """The server-cost section: wrk's figures per worker count, hvdk8s loadtest beside them."""
    if cost is None:
        return []
    head = ["", "## Server cost: wrk beside hvdk8s loadtest (null model, keep-alive)", ""]
    if "skipped" in cost:
        return [*head, f"Not measured: {cost['skipped']}."]
    rows = []
    for run in cost["runs"]:
        s, load = run["summary"], run["loadtest_predict"]
        rows += [
            [str(run["workers"]), "wrk: GET status", report.num(s["status_rps"]), f"{s['status_cpu_us']:.0f}", "",
             "", "", ""],
            [str(run["workers"]), "wrk: POST :predict", report.num(s["predict_rps"]), f"{s['predict_cpu_us']:.0f}",
             f"{s['predict_cores_used']:.2f}", f"{s['predict_p50_ms']:.2f}", f"{s['predict_p99_ms']:.2f}",
             f"{s['p99_over_p50_predict']:.1f}"],
            [str(run["workers"]), "hvdk8s loadtest: :predict", report.num(load["rps"]), "", "",
             f"{load['latency_ms']['p50']:.2f}", f"{load['latency_ms']['p99']:.2f}",
             f"{load['latency_ms']['p99'] / load['latency_ms']['p50']:.1f}"],
        ]
    runs = {run["workers"]: run["summary"] for run in cost["runs"]}
    scaling = "; ".join(f"{w} worker(s): {report.num(s['predict_rps'])} :predict/s on {s['predict_cores_used']:.2f} "
                        f"cores ({report.num(s['predict_rps'] / s['predict_cores_used'])} per core)"
                        for w, s in runs.items())
    return [
        *head,
        f"Concurrency {cost['concurrency']}, {cost['seconds']:g} s per load, status and :predict loads interleaved "
        f"({len(cost['runs'][0]['rounds'])} rounds, medians shown; ratios taken within each round); load average "
        f"{_loads(cost.get('load_average'))}. Server CPU is "
        "the `hvdk8s serve` process tree's (all workers) from /proc, per request answered; cores used is that "
        "CPU over the load's wall time. wrk is a C load generator: its own cost per request is a small fraction "
        "of `hvdk8s loadtest`'s, so its rates show the server's limit more nearly.",
        "",
        report.table(["workers", "load", "requests/s", "server CPU µs/request", "cores used", "p50 ms", "p99 ms",
                      "p99/p50"], rows),
        "",
        f"Throughput at concurrency {cost['concurrency']} against cores used: {scaling}.",
        "",
        "Where the server CPU per request goes (µs, medians over the rounds): each process's main thread is "
        "uvicorn's event loop (HTTP, JSON, dispatch); the other Python threads are the batch threads calling the "
        "model (and gRPC and polling, idle here); TensorFlow's own threads run the graph's kernels.",
        "",
        report.table(["workers", "load", *THREAD_KINDS, "total"], [
            [str(run["workers"]), name,
             *(f"{run['summary'][f'{load}_cpu_us_by_thread'][kind]:.0f}" for kind in THREAD_KINDS),
             f"{run['summary'][f'{load}_cpu_us']:.0f}"]
            for run in cost["runs"] for load, name in (("status", "GET status"), ("predict", "POST :predict"))]),
        *_model_call_share(runs.get(1)),
    ]


def _model_call_share(one: dict[str, Any] | None) -> list[str]:
    """What the model call alone costs beside a whole status request: the floor of the CPU ratio target."""
    if one is None:
        return []
    by_thread, status = one["predict_cpu_us_by_thread"], one["status_cpu_us"]
    call = by_thread["batching and other"] + by_thread["TensorFlow"]
    loop = by_thread["event loop"] - one["status_cpu_us_by_thread"]["event loop"]
    return ["", f"One worker: the model call alone (batch threads and TensorFlow's threads, {call:.0f} µs) costs "
                f"{call / status:.2f}× a whole status request ({status:.0f} µs); the event loop spends {loop:.0f} µs "
                "more on a :predict than on a status request (reading the body, JSON and base64, dispatch, the "
                "answer). A :predict at most 2× a status request would leave the event loop about "
                f"{max(status - call, 0):.0f} µs for that."]


def _commit(env: dict[str, Any]) -> str:
    git = env.get("git") or {}
    if not git.get("commit"):
        return "commit unknown"
    return f"commit {git['commit'][:7]}" + (" (the working tree had uncommitted changes)" if git["dirty"] else "")


def _loads(pair: list[list[float]] | None) -> str:
    """The machine's load averages (1, 5, 15 min) at the section's start and end, as the p99 figures need them."""
    if not pair:
        return "not recorded"
    return " at the start, ".join("/".join(f"{x:g}" for x in loads) for loads in pair) + " at the end"


def _by_threads(inproc: dict[str, Any]) -> str:
    """Each rate's source: the faster of TensorFlow's own intra-op threads (0) and the server's setting."""
    settings = inproc.get("by_intra_op_threads")
    if not settings:
        return ""
    shown = "; ".join(f"{'TensorFlow default' if k == '0' else f'{k} intra-op thread(s)'}: "
                      f"{report.num(r['batch1_images_per_s'])} / {report.num(r['batch32_images_per_s'])}"
                      for k, r in settings.items())
    return f" (the faster of each, batch 1 / batch 32, {shown})"


def _plot_cost(ax: Any, runs: list[dict[str, Any]]) -> None:
    """wrk requests/s by worker count (status and :predict), each point labelled with the cores it used."""
    workers = [r["workers"] for r in runs]
    for key, label, style in (("status", "wrk: GET status", "x:"), ("predict", "wrk: POST :predict", "o-")):
        rates = [r["summary"][f"{key}_rps"] for r in runs]
        ax.plot(workers, rates, style, label=label)
    for r in runs:
        ax.annotate(f"{r['summary']['predict_cores_used']:.2f} cores", (r["workers"], r["summary"]["predict_rps"]),
                    fontsize=7, textcoords="offset points", xytext=(4, -10))
    ax.plot(workers, [r["loadtest_predict"]["rps"] for r in runs], "s--", label="hvdk8s loadtest: :predict")
    ax.set_xticks(workers)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("hvdk8s serve --workers")
    ax.set_ylabel("requests/s")
    ax.set_title("server cost: null model, c=32")
    ax.legend(fontsize=7)


def plot(results: dict[str, Any], path: Path) -> None:
    """Images/s by concurrency per model, API and batching, with the in-process rates as lines; the soak's RSS."""
    plt = figures.pyplot()
    models = results["models"]
    cost = results.get("server_cost", {}).get("runs")
    panels = len(models) + 1 + bool(cost)
    fig, axes = plt.subplots(1, panels, figsize=(5.5 * panels, 4.2))
    for ax, (name, model) in zip(axes, models.items()):
        for (api, batching), style in {("rest", True): "o-", ("rest", False): "o--", ("grpc", True): "s-",
                                       ("grpc", False): "s--", ("trivial", True): "x:"}.items():
            rows = sorted((r for r in model["loads"] if (r["api"], r["batching"]) == (api, batching)),
                          key=lambda r: r["concurrency"])
            if rows:
                label = "REST status, no model" if api == "trivial" else f"{api}, batching {'on' if batching else 'off'}"
                ax.plot([r["concurrency"] for r in rows], [r["rps"] for r in rows], style, label=label)
        for batch, color in ((1, "grey"), (32, "black")):
            ax.axhline(model["inprocess"][f"batch{batch}_images_per_s"], color=color, linestyle="-.", linewidth=1,
                       label=f"in process, batch {batch}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("concurrency (single-image requests)")
        ax.set_ylabel("requests/s = images/s")
        ax.set_title(name)
        ax.legend(fontsize=7)
    if cost:
        _plot_cost(axes[len(models)], cost)
    soak, ax = results["soak"], axes[-1]
    ax.plot([t for t, _ in soak["rss_mb"]], [mb for _, mb in soak["rss_mb"]], ".-")
    fifth = results["settings"]["soak_s"] / 5
    for lo, label in ((fifth, "compared"), (4 * fifth, "_nolegend_")):
        ax.axvspan(lo, lo + fifth, color="grey", alpha=0.2, label=label)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("seconds into the soak")
    ax.set_ylabel("server RSS (MiB)")
    ax.set_title("soak: good + malformed REST")
    ax.legend(fontsize=7)
    fig.tight_layout()
    figures.save_figure(fig, path, dpi=80)

