"""End to end: the knob study with a stack knob, whose ranks run another interpreter (about a minute on 2 cores).

No second virtual environment is needed: the knob's interpreter is a shell script
that logs how it was called and execs this one, so the test sees that the knob's
launch (and only it) started its ranks through it, that the suite probed it
before starting anything, and that each launch's stack and hvdk8s/raw-loop
ratio reach results.json and the report. Comparing real stacks is
``hvdk8s bench --knobs tf2.18`` (docs/benchmarks.md, Method).
"""
from __future__ import annotations

import statistics
import sys
from typing import Any

import pytest

from hvdk8s.benchmarks.config import knobs
from hvdk8s.benchmarks.config.settings import preset
from hvdk8s.benchmarks.harness.suite import Suite
from hvdk8s.benchmarks.reporting import analysis, report

from test_benchmarks import untraced_cells


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("stacks")
    calls = tmp / "calls.log"
    python = tmp / "venv-same" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\necho "$*" >> "{calls}"\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(knobs.KNOBS, "same_stack", knobs.Knob(python=str(python), build="(the test writes it)",
                                                         what="this test's stack: the ranks run a wrapper of this interpreter"))
        mp.setenv("HVDK8S_METRICS_PORT", "0")  # ephemeral Prometheus ports: never collides with another run
        settings = preset("quick", strategies=(), workloads=("mlp",), mlp_width=64, warmup_steps=1, steps=3, windows=2, models=1,
                          tta=False, emulated_rates=(), knobs=("same_stack",), knob_rounds=1, launch_timeout_s=240)
        suite = Suite(settings, tmp / "out", ["test"])
        probed = calls.read_text().splitlines()  # before any launch
        suite.knob_study()
        what = {k: v.what for k, v in knobs.KNOBS.items()}
    results = suite.results
    results["labels"]["knobs"] = what
    results["derived"] = analysis.derive(results["raw"])
    return {"results": results, "probed": probed, "calls": calls.read_text().splitlines(), "python": str(python)}


@pytest.mark.e2e
def test_the_stack_is_probed_before_anything_runs_and_only_its_launch_runs_it(study: dict[str, Any]) -> None:
    assert study["results"]["errors"] == []
    (probe,) = study["probed"]
    assert probe.startswith("-c import json") and "stack_versions" in probe
    ranks = study["calls"][1:]
    # two ranks of the knob's launch, none of the baseline's
    assert len(ranks) == 2 and all(".worker --strategy hvdk8s" in c and "knob-same_stack-r0" in c for c in ranks), ranks
    stacks = study["results"]["environment"]["stacks"]
    assert stacks["same_stack"]["interpreter"] == study["python"]
    assert stacks["same_stack"]["executable"] == sys.executable  # the wrapper exec'd this interpreter


@pytest.mark.e2e
def test_each_launch_records_its_stack_and_ratio_beside_the_baselines(study: dict[str, Any]) -> None:
    results = study["results"]
    launches = {r["knob"]: r for r in results["raw"]["knobs"]}
    assert set(launches) == {"baseline", "same_stack"}
    assert (launches["baseline"]["python"], launches["same_stack"]["python"]) == ("", study["python"])
    import keras
    import tensorflow as tf

    for run in launches.values():
        stack = run["result"]["stack"]
        assert (stack["executable"], stack["tensorflow"], stack["keras"]) == (sys.executable, tf.__version__, keras.__version__)
        assert stack == {k: v for k, v in results["environment"]["stacks"]["same_stack"].items() if k != "interpreter"}
    rows = {r["knob"]: r for r in results["derived"]["knobs"]}
    label = f"TensorFlow {tf.__version__}, Keras {keras.__version__}"
    assert rows["same_stack"]["stack"] == rows["baseline"]["stack"] == label
    assert rows["same_stack"]["baseline_hvdk8s_over_raw"] == rows["baseline"]["hvdk8s_over_raw"]
    assert all(0 < r["hvdk8s_over_raw"]["median"] < 20 and r["hvdk8s_over_raw"]["n"] == 1 for r in rows.values())
    # the knob's ratio from its launch's own windows: the raw loop's window time over hvdk8s's (the same examples)
    (windows,) = launches["same_stack"]["result"]["throughput"]
    by_hand = statistics.median(windows["paired_raw_window_seconds"]) / statistics.median(windows["window_seconds"])
    assert rows["same_stack"]["hvdk8s_over_raw"]["median"] == pytest.approx(by_hand)


@pytest.mark.e2e
def test_report_shows_the_stack_of_every_row_and_traces_to_results(study: dict[str, Any]) -> None:
    results = study["results"]
    md = report.render(results)
    assert "## 7. Horovod, Open MPI and software-stack knobs, N=2" in md
    row = next(line for line in md.splitlines() if line.startswith("| same_stack |"))
    assert results["derived"]["knobs"][0]["stack"] in row
    assert f"knob same_stack {study['python']}: python " in md  # the Environment block names what it ran
    assert untraced_cells(md, results) == []
