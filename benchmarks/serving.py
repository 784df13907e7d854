"""``hvdk8s bench --serving``: the serving path under load, next to the model's in-process rate, in one run.

Two models are exported to a temporary folder: the digits CNN (the product's
example; signature well under 1 ms) and a compute-heavy ImageNet-shaped
``keras.applications.MobileNetV2`` with random weights (``weights=None``,
nothing is downloaded), where batching matters. For each, ``hvdk8s serve``
runs as a child process with batching on (the default) and off, and
``hvdk8s loadtest`` drives it over REST and gRPC at each concurrency with
single-image requests, after an untimed warm-up load. In the same run: the SavedModel's ``serving_default``
called in this process at batch 1 and 32 (the ceiling), and the model
status endpoint (``GET /v1/models/NAME``) on the same server under the same
load generator (the server stack without the model: the HTTP/JSON cost).

The load generator runs on the same machine as the server, so on a small
machine both compete for the cores: the ratios, measured side by side, are
what to compare, not the absolute rates.
"""
from __future__ import annotations

import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from . import envinfo, report
from .util import write_json_atomic, write_text_atomic


@dataclass(frozen=True)
class Settings:
    duration_s: float = 5.0  # per load run
    concurrencies: tuple[int, ...] = (1, 8, 32)
    inprocess_s: float = 3.0  # timed seconds per in-process rate
    heavy_size: int = 128  # MobileNetV2 input side
    heavy_alpha: float = 0.5


QUICK = Settings(duration_s=2.0, inprocess_s=1.5)
TARGETS = {
    "p50_ms_c1": 3.0,  # digits, REST, concurrency 1, keep-alive, one image
    "predict_vs_trivial_c32": 0.7,
    "batching_vs_inprocess_b32": 0.6,
    "batching_on_vs_off": 2.0,
}


def run(settings: Settings, command: list[str]) -> dict[str, Any]:
    """Measure everything; ``write`` turns the result into ``serving.json``, ``serving.md`` and ``serving.png``."""
    from tqdm import tqdm

    from hvdk8s.serving.process import running

    results: dict[str, Any] = {"env": envinfo.collect(command), "settings": asdict(settings), "models": {}}
    with tempfile.TemporaryDirectory(prefix="hvdk8s-bench-serving-") as tmp:
        models = _export_models(Path(tmp), settings)
        bar = tqdm(total=len(settings.concurrencies) * (4 * len(models) + 1), unit="load", desc="serving")
        for name, (base, description) in models.items():
            entry = results["models"][name] = {"description": description, "inprocess": _inprocess(base, settings),
                                               "loads": []}
            for batching in (True, False):
                args = [] if batching else ["--enable_batching=false"]
                with running(base, Path(tmp) / f"{name}-{batching}.log", *args) as served:
                    targets = [("rest", served.url), ("grpc", served.grpc)]
                    if name == "digits" and batching:
                        targets.append(("trivial", served.url))
                    for api, target in targets:
                        _warm_up(target, name, api, max(settings.concurrencies))
                        for c in settings.concurrencies:
                            entry["loads"].append(_load(target, name, api, c, batching, settings))
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
    }


def _inprocess(base: Path, settings: Settings) -> dict[str, float]:
    """Images/s of ``serving_default`` called directly at batch 1 and 32 (warm, best of the timed window)."""
    import tensorflow as tf

    from hvdk8s.serving import loadtest

    signature = tf.saved_model.load(str(base / "1")).signatures["serving_default"]
    images = loadtest.digits_png(32)
    rates = {}
    for batch in (1, 32):
        x = tf.constant(images[:batch])
        signature(image_bytes=x)  # trace and warm up
        calls, start = 0, time.perf_counter()
        while time.perf_counter() - start < settings.inprocess_s:
            signature(image_bytes=x)
            calls += 1
        rates[f"batch{batch}_images_per_s"] = calls * batch / (time.perf_counter() - start)
    return rates


def _warm_up(target: str, model: str, api: str, concurrency: int) -> None:
    """Untimed requests first: TensorFlow builds its kernels for each new batch size on first use."""
    from hvdk8s.serving import loadtest

    if api != "trivial":
        loadtest.run(target, model, grpc=api == "grpc", concurrency=concurrency, requests=8 * concurrency)


def _load(target: str, model: str, api: str, concurrency: int, batching: bool, settings: Settings) -> dict:
    from hvdk8s.serving import loadtest

    result = loadtest.run(
        target, model, grpc=api == "grpc", concurrency=concurrency, duration=settings.duration_s,
        get_path=f"/v1/models/{model}" if api == "trivial" else None,
    )
    return {**result.to_dict(), "api": api, "batching": batching}


def _find(loads: list[dict], api: str, concurrency: int, batching: bool) -> dict | None:
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
        c1 and c1["latency_ms"]["p50"], TARGETS["p50_ms_c1"], higher=False)
    predict, trivial = _find(digits["loads"], "rest", c_max, True), _find(digits["loads"], "trivial", c_max, True)
    add("predict_vs_trivial_c32", f"digits, REST, c={c_max}: :predict requests/s / status endpoint requests/s",
        predict and trivial and predict["rps"] / trivial["rps"], TARGETS["predict_vs_trivial_c32"])
    for api in ("rest", "grpc"):
        on, off = _find(heavy["loads"], api, c_max, True), _find(heavy["loads"], api, c_max, False)
        add(f"batching_vs_inprocess_b32_{api}",
            f"MobileNetV2, {api}, c={c_max}, batching on: images/s / in-process batch-32 images/s",
            on and on["images_per_second"] / heavy["inprocess"]["batch32_images_per_s"],
            TARGETS["batching_vs_inprocess_b32"])
        add(f"batching_on_vs_off_{api}", f"MobileNetV2, {api}, c={c_max}: batching on / off images/s",
            on and off and on["images_per_second"] / off["images_per_second"], TARGETS["batching_on_vs_off"])
    return out


def write(results: dict[str, Any], out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "serving.json", "markdown": out / "serving.md", "plot": out / "serving.png"}
    write_json_atomic(paths["json"], results)
    plot(results, paths["plot"])
    write_text_atomic(paths["markdown"], markdown(results, paths["plot"].name))
    return paths


def markdown(results: dict[str, Any], plot_name: str) -> str:
    env = results["env"]
    lines = [
        "# hvdk8s serving benchmark",
        "",
        f"`{' '.join(env['command'])}` · {env['cpu_count']} CPUs ({env['cpu_model']}) · load average at start "
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
            f"images/s, batch 32 {report.num(inproc['batch32_images_per_s'])} images/s.",
            "",
            report.table(
                ["API", "batching", "concurrency", "requests/s", "p50 ms", "p99 ms", "errors"],
                [[r["api"] if r["api"] != "trivial" else "REST status (no model)", "on" if r["batching"] else "off",
                  str(r["concurrency"]), report.num(r["rps"]), f"{r['latency_ms']['p50']:.2f}",
                  f"{r['latency_ms']['p99']:.2f}", str(r["errors"])] for r in model["loads"]],
            ),
        ]
    lines += ["", f"![requests/s by concurrency]({plot_name})", ""]
    return "\n".join(lines)


def plot(results: dict[str, Any], path: Path) -> None:
    """Images/s by concurrency per model, API and batching, with the in-process rates as lines."""
    plt = report._plt()
    models = results["models"]
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.2))
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
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
