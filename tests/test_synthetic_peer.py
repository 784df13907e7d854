"""The suite's synthetic benchmarks beside Horovod's own scripts (``synthetic_peer``): the same speed.

``hvdk8s.benchmarks.synthetic_loop`` and ``synthetic_fit`` are Horovod's two synthetic benchmarks written in this
package. Here the suite launches them and Horovod's scripts from ../shared/peer/horovod/examples (the raw one with
the two fixes Keras 3 forces, the Keras one as ``hvdk8s migrate`` ports it, from a temporary copy) on a small
keras.applications model at N=1, each of the suite's scripts right beside Horovod's, and each must agree with
Horovod's in images per second (``analysis.agrees``: medians of the timed iterations within 25%, or their ranges
overlapping). A different model, image size or step would be off by far more. One round (four launches, each mostly
TensorFlow's start-up and tracing: about 20 s of CPU apiece) keeps it near a minute on 2 idle cores; a bench run
takes more rounds. Skipped, naming it, without ../shared.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from hvdk8s.benchmarks import analysis, report, synthetic
from hvdk8s.benchmarks.settings import preset
from hvdk8s.benchmarks.suite import Suite

from conftest import needs_shared, shared

pytestmark = needs_shared("peer/horovod/examples")
MODEL = "MobileNetV3Small"  # the smallest keras.applications model: a step of 8 images takes about 0.1 s here


def test_the_suites_synthetic_scripts_agree_with_horovods_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HVDK8S_METRICS_PORT", "0")  # hvdk8s ranks of parallel tests must not share a metrics port
    settings = preset("quick", workloads=(f"{synthetic.PREFIX}{MODEL}",), ranks=(1,), synthetic_rounds=1,
                      synthetic_batches_per_iter=3, synthetic_iters=4, synthetic_peer=str(shared("peer/horovod/examples")))
    suite = Suite(settings, tmp_path, ["pytest"])
    suite.synthetic()
    results = suite.results
    assert results["errors"] == [], results["errors"]
    runs = results["raw"]["synthetic"]
    assert [r["script"] for r in runs] == ["raw", "horovod_raw", "hvdk8s", "horovod_keras"]
    for r in runs:  # each launch ran what it says: Horovod's scripts print their own header lines
        log = (tmp_path / r["job"]["log"]).read_text(errors="replace")
        assert (f"Batch size: {synthetic.batch(MODEL)}" in log) == r["script"].startswith("horovod_"), r["script"]
        assert ("Running benchmark..." in log) == (r["script"] == "horovod_raw")
        assert ("hvdk8s: 1 rank on 1 host" in log) == (r["script"] in synthetic.FIT_SCRIPTS)  # the migrated one is on hvdk8s
    [row] = analysis.synthetic(runs)
    iterations = {r["script"]: [] for r in runs}
    for r in runs:
        iterations[r["script"]] += r["iter_img_per_s_per_rank"]
    assert row["raw_agrees_with_peer"] and row["hvdk8s_agrees_with_peer"], iterations
    md = report._synthetic_section([row], results["settings"], {})
    assert f"| {MODEL} | 1 | {report.over_launches(row['raw_over_peer'])} | yes | " in md
