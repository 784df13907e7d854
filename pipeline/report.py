"""The local run's summary: a table of steps, candidates and the load test, and one plot."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from hvdk8s.common import figures
from hvdk8s.pipeline import dag as d
from hvdk8s.pipeline.local import SUCCEEDED, RunResult


def candidate_rows(dag: d.Dag, result: RunResult) -> list[dict[str, Any]]:
    """Per candidate: how training ended and, when select ran, its held-out metrics and whether it won."""
    from hvdk8s.serving.model.savedmodel import read_metadata, versions

    scored: dict[str, dict[str, Any]] = {}
    promoted = None
    if result.steps.get(d.SELECT) and result.steps[d.SELECT].status == SUCCEEDED:
        newest = max(versions(result.layout.models))
        selection = read_metadata(Path(result.layout.models) / str(newest))["selection"]
        scored = {Path(c["path"]).stem: c for c in selection["candidates"]}
        promoted = (Path(selection["source"]).stem, newest)
    rows = []
    for step in dag.steps:
        if step.candidate is None:
            continue
        name = step.candidate.name
        metrics = scored.get(name, {})
        rows.append({"candidate": name, "training": result.steps[step.name].status,
                     "seconds": result.steps[step.name].seconds, "accuracy": metrics.get("accuracy"),
                     "loss": metrics.get("loss"),
                     "served": f"version {promoted[1]}" if promoted and promoted[0] == name else ""})
    return rows


def load_result(result: RunResult) -> dict[str, Any] | None:
    path = result.loadtest_json
    return json.loads(path.read_text()) if path.is_file() else None


def table(dag: d.Dag, result: RunResult) -> str:
    lines = ["step                 status       seconds"]
    lines += [f"{s.name:<20} {result.steps[s.name].status:<12} {result.steps[s.name].seconds:7.1f}"
              for s in dag.steps]
    lines += ["", "candidate            training     accuracy    loss    served"]
    for row in candidate_rows(dag, result):
        acc = f"{row['accuracy']:.4f}" if row["accuracy"] is not None else "-"
        loss = f"{row['loss']:.4f}" if row["loss"] is not None else "-"
        lines.append(f"{row['candidate']:<20} {row['training']:<12} {acc:>8}  {loss:>6}    {row['served']}")
    load = load_result(result)
    if load:
        lat = load["latency_ms"]
        slo = "passed" if load["slo"]["passed"] else "MISSED"
        lines += ["", f"load test            {load['requests']} requests, {load['errors']} errors, "
                  f"{load['rps']:.1f} requests/s, latency ms p50 {lat['p50']:.1f} p90 {lat['p90']:.1f} "
                  f"p99 {lat['p99']:.1f} max {lat['max']:.1f}; objectives {slo}"]
    return "\n".join(lines)


def plot(dag: d.Dag, result: RunResult, path: str | os.PathLike[str]) -> None:
    """Left: held-out accuracy per candidate (failed ones marked); right: the load test's latency percentiles."""
    plt = figures.pyplot()

    rows = candidate_rows(dag, result)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    names = [r["candidate"] for r in rows]
    accuracy = [r["accuracy"] or 0.0 for r in rows]
    bars = left.bar(names, accuracy, color=["tab:green" if r["served"] else "tab:blue" for r in rows])
    for bar, row in zip(bars, rows, strict=True):
        label = "failed" if row["accuracy"] is None else f"{row['accuracy']:.3f}"
        left.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom")
    left.set_ylim(0, 1.1)
    left.set_ylabel("held-out accuracy")
    left.set_title("candidates (green: served)")
    load = load_result(result)
    if load:
        lat = load["latency_ms"]
        right.bar(list(lat), list(lat.values()), color="tab:orange")
        if load["slo"]["max_p99_ms"] is not None:
            right.axhline(load["slo"]["max_p99_ms"], color="tab:red", linestyle="--", label="p99 objective")
            right.legend(loc="upper left")
        right.set_title(f"load test: {load['requests']} requests, concurrency {load['concurrency']}")
    else:
        right.set_title("load test: did not run")
    right.set_ylabel("latency (ms)")
    fig.tight_layout()
    figures.save_figure(fig, path)
