"""The suite's synthetic benchmarks beside Horovod's own scripts (``synthetic_peer``): the same speed.

``hvdk8s.benchmarks.workers.synthetic_loop`` and ``synthetic_fit`` are Horovod's two synthetic benchmarks written in
this package. Here the suite launches them and Horovod's scripts from ../shared/peer/horovod/examples (the raw one with
the two fixes Keras 3 forces, the Keras one as ``hvdk8s migrate`` ports it, from a temporary copy) on a small
keras.applications model at N=1, each of the suite's scripts right beside Horovod's, and each must agree with
Horovod's in images per second (``analysis.agrees``: the medians of all timed iterations within 25%, or their ranges
overlapping). A different model, image size or step would be off by far more.

A second round runs only where the first does not agree: a round is four launches, each mostly TensorFlow's
start-up and tracing, so one round keeps the test near two minutes on 2 idle cores; on a machine shared with other
jobs, a load change between two adjacent launches can make one launch several times slower than its neighbour with
steady iterations, and the second round's launches fill in the range. Skipped, naming it, without ../shared.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from hvdk8s.benchmarks.config import synthetic
from hvdk8s.benchmarks.config.settings import preset
from hvdk8s.benchmarks.harness.suite import Suite
from hvdk8s.benchmarks.reporting import analysis, report

from conftest import needs_shared, shared

pytestmark = [pytest.mark.e2e, needs_shared("peer/horovod/examples")]
MODEL = "MobileNetV3Small"  # the smallest keras.applications model: a step of 8 images took 0.3-0.5 s here
MAX_ROUNDS = 2


def test_the_suites_synthetic_scripts_agree_with_horovods_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HVDK8S_METRICS_PORT", "0")  # hvdk8s ranks of parallel tests must not share a metrics port
    settings = preset("quick", workloads=(f"{synthetic.PREFIX}{MODEL}",), ranks=(1,), synthetic_rounds=1,
                      synthetic_batches_per_iter=3, synthetic_iters=4, synthetic_peer=str(shared("peer/horovod/examples")))
    runs: list[dict] = []
    for r in range(MAX_ROUNDS):
        suite = Suite(settings, tmp_path / f"round{r}", ["pytest"])
        suite.synthetic()
        assert suite.results["errors"] == [], suite.results["errors"]
        launched = suite.results["raw"]["synthetic"]
        assert [run["script"] for run in launched] == ["raw", "horovod_raw", "hvdk8s", "horovod_keras"]
        for run in launched:  # each launch ran what it says: Horovod's scripts print their own header lines
            which, log = run["script"], (suite.out / run["job"]["log"]).read_text(errors="replace")
            assert (f"Batch size: {synthetic.batch(MODEL)}" in log) == which.startswith("horovod_"), which
            assert ("Running benchmark..." in log) == (which == "horovod_raw")
            assert ("hvdk8s: 1 rank on 1 host" in log) == (which in synthetic.FIT_SCRIPTS)  # the migrated one is on hvdk8s
        runs += [{**run, "round": r} for run in launched]
        [row] = analysis.synthetic(runs)
        if row["raw_agrees_with_peer"] and row["hvdk8s_agrees_with_peer"]:
            break
    iterations: dict[str, list[float]] = {}
    for run in runs:
        iterations.setdefault(run["script"], []).extend(run["iter_img_per_s_per_rank"])
    assert row["raw_agrees_with_peer"] and row["hvdk8s_agrees_with_peer"], iterations
    md = report._synthetic_section([row], suite.results["settings"], {})
    assert f"| {MODEL} | 1 | {report.over_launches(row['raw_over_peer'])} | yes | " in md
