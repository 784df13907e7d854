"""End to end: a tiny ``--quick`` benchmark run with real processes, then its report checked.

One run (module fixture, 18 jobs, about three minutes on 2 quiet cores): every
strategy kind that needs its own launcher (single process, mpirun ranks, a
TF_CONFIG parameter-server cluster) and one whose Open MPI settings must reach
its ranks (hvdk8s_eager64k's differ only in value, passed by the same code; the
parameters each value gives mpirun: tests/test_mpijob.py), hvdk8s with the raw loop's windows
alternating in the same ranks, Horovod's synthetic benchmarks as the suite's own
raw loop (at N=2 also at hvdk8s's thread split) and hvdk8s fit at N=1 and N=2,
the per-phase profile with a Horovod timeline, the allreduce microbenchmark
with fusion on and off, and, where network namespaces can be made, the
emulated 1 Gbit/s cluster. The checks: the report has its sections
and readable plots, every summary in results.json recomputes from the raw
timings, every number in a Markdown table is a value of results.json, and
nothing is left behind.
"""
from __future__ import annotations

import json
import math
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hvdk8s.benchmarks.emulation import netns
from hvdk8s.benchmarks.reporting import analysis, report

from conftest import job_env

REPO = Path(__file__).resolve().parents[1]
SYNTHETIC = "horovod-synthetic:MobileNetV3Small"
TINY = [
    "--quick", "--strategies", "single,hvdk8s,tf_ps,hvdk8s_rd", "--workloads", f"cnn,mlp,{SYNTHETIC}",
    "--ranks", "1,2", "--rounds", "1",
    "--mlp-width", "64", "--warmup", "1", "--steps", "3", "--windows", "1", "--models", "2", "--tta-max-epochs", "1",
    "--synthetic-rounds", "1", "--synthetic-batches", "2", "--synthetic-iters", "1",
    # the suite's own workloads only: profiling the synthetic model too would add a launch's worth of work
    "--profile", "--profile-steps", "2", "--profile-workloads", "cnn,mlp",
    "--sizes", "4K,64K", "--repeats", "2", "--allreduce-min-seconds", "0.02", "--fusion-tensors", "4", "--fusion-bytes", "4K",
    "--memcopy-bytes", "4M", "--emulated-rates", "1gbit", "--emulated-workers", "2", "--emulated-sizes", "4K,256K",
    "--comm-steps", "2", "--emulated-train-strategies", "none", "--timeout", "300",
]
TOKEN = re.compile(r"(?<![\w.\-])[-+]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?(?:%|KiB|MiB|GiB|B|GB/s|Gbit/s|ms|µs|s)?(?![\w])")


def bench(tmp_path_factory: pytest.TempPathFactory, name: str, args: list[str], timeout: float) -> dict[str, Any]:
    """One real ``python -m benchmarks`` run into a fresh folder: its process, folder and results.json."""
    out = tmp_path_factory.mktemp(name)
    # env: os.environ as Python holds it. An in-process hvd.init() earlier in this pytest process leaves Open MPI's
    # singleton variables in the C environment; a child inheriting that passes them to mpirun, which then exits 1
    # without a word (seen under pytest-xdist, where this module can run after such tests).
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", *args, "--out", str(out)], cwd=REPO, capture_output=True, text=True,
        timeout=timeout, env=job_env(),
    )  # fmt: skip
    return {"out": out, "proc": done, "results": json.loads((out / "results.json").read_text())}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return bench(tmp_path_factory, "bench", TINY, 1800)  # a hang guard: 18 launches take minutes, many more under load


def _json_values(obj: Any, numbers: list[float], strings: set[str]) -> None:
    if isinstance(obj, dict):
        for k, v in obj.items():
            strings.add(str(k))
            _json_values(v, numbers, strings)
    elif isinstance(obj, list):
        for v in obj:
            _json_values(v, numbers, strings)
    elif isinstance(obj, bool):
        return
    elif isinstance(obj, (int, float)):
        numbers.append(obj)
    elif isinstance(obj, str):
        strings.add(obj)


def same_figures(got: Any, want: Any, path: str = "derived") -> list[str]:
    """Where two JSON-like trees differ; floats equal to 1e-12 relative (least-squares fits differ in the
    last bits between numpy releases, e.g. 2.0 on TensorFlow 2.18 and 2.4 on 2.21)."""
    if isinstance(want, dict) and isinstance(got, dict) and got.keys() == want.keys():
        return [d for k in want for d in same_figures(got[k], want[k], f"{path}.{k}")]
    if isinstance(want, list) and isinstance(got, list) and len(got) == len(want):
        return [d for i, (g, w) in enumerate(zip(got, want)) for d in same_figures(g, w, f"{path}[{i}]")]
    if isinstance(want, float) and isinstance(got, float):
        return [] if math.isclose(got, want, rel_tol=1e-12) else [f"{path}: {got!r} != {want!r}"]
    return [] if got == want else [f"{path}: {got!r} != {want!r}"]


def untraced_cells(markdown: str, results: dict[str, Any]) -> list[str]:
    """Table cells with a number that is not a value of ``results`` through the report's formatters."""
    numbers: list[float] = []
    strings: set[str] = set()
    _json_values(results, numbers, strings)
    allowed = {fmt(v) for v in numbers for fmt in report.FORMATTERS}
    bad = []
    for line in markdown.splitlines():
        if not line.startswith("| ") or set(line) <= set("|-"):
            continue
        for cell in (c.strip() for c in line.strip("|").split("|")):
            if cell in strings:
                continue  # a label taken from the results (strategy, model, network, source)
            bad += [f"{cell!r}: {tok}" for tok in TOKEN.findall(cell) if tok not in allowed]
    return bad


def table_headers(markdown: str) -> set[str]:
    lines = markdown.splitlines()
    return {lines[i] for i in range(len(lines) - 1) if lines[i].startswith("| ") and lines[i + 1].startswith("|---")}


@pytest.mark.e2e
def test_run_succeeds_and_shows_progress(run: dict[str, Any]) -> None:
    proc = run["proc"]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert run["results"]["errors"] == []
    progress = [line for line in proc.stderr.splitlines() if line.startswith("[bench ")]
    total = int(re.match(r"\[bench \d+/(\d+)", progress[0]).group(1))
    assert any(line.startswith(f"[bench {total}/{total} ") for line in progress)


@pytest.mark.e2e
def test_report_structure_and_plots(run: dict[str, Any]) -> None:
    out = run["out"]
    md = (out / "report.md").read_text()
    for heading in ("## Summary: throughput relative to the raw Horovod loop", "## 1. Training throughput",
                    "## 2. Time to accuracy", "## 3. Allreduce microbenchmark", "## 4. Bandwidth-limited cluster",
                    "## 5. Cost model", "## 6. Where a step's time goes", "## Environment"):
        assert heading in md
    headers = table_headers(md)
    assert "| strategy | N | examples/s median [min–max] | E(N) vs single | E(N) vs own N=1 | windows |" in headers
    assert "| message | N | time median [min–max] | algbw | busbw | time at 0.1 ms cycle |" in headers
    assert any(h.startswith("| model | N | network | system | published E |") for h in headers)
    for png in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md):
        data = (out / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and 5_000 < len(data) < 200_000, png
    env = run["results"]["environment"]
    assert env["packages"]["horovod"] and env["cpu_count"] and env["git"]["commit"] is not None
    assert env["command"][:3] == ["python", "-m", "benchmarks"]


@pytest.mark.e2e
def test_every_summary_recomputes_from_the_raw_timings(run: dict[str, Any]) -> None:
    results = run["results"]
    assert analysis.derive(results["raw"]) == results["derived"]
    training = results["raw"]["training"]
    # one row worked out by hand from its launch's windows: the CNN's examples/s over every window, E(2) against single
    rates = {(r["strategy"], r["workers"]): [w["examples_per_window"] / s for w in r["result"]["throughput"]
                                             if w["workload"] == "cnn" for s in w["window_seconds"]] for r in training}
    row = next(r for r in results["derived"]["training"]["throughput"]
               if (r["workload"], r["strategy"], r["workers"]) == ("cnn", "hvdk8s", 2))
    assert row["examples_per_s"]["median"] == pytest.approx(statistics.median(rates[("hvdk8s", 2)]))
    assert row["efficiency_vs_single"] == pytest.approx(
        statistics.median(rates[("hvdk8s", 2)]) / 2 / statistics.median(rates[("single", 1)]))
    assert {(r["strategy"], r["workers"]) for r in training} == {("single", 1), ("hvdk8s", 1), ("hvdk8s", 2), ("tf_ps", 1), ("tf_ps", 2),
                                                                    ("hvdk8s_rd", 2)}
    # the recursive-doubling strategy's algorithm reached its ranks' Open MPI parameters, and no other's
    # (and hvdk8s's 16 MiB TCP eager limit reached all of them)
    assert {(r["strategy"], r["result"].get("allreduce_algorithm"), r["result"].get("tcp_eager_limit"))
            for r in training} == {
        ("single", None, None), ("tf_ps", None, None), ("hvdk8s", "auto", 16 << 20),
        ("hvdk8s_rd", "recursive_doubling", 16 << 20),
    }
    for r in training:  # the timings came from processes that really ran that long
        timed = sum(sum(w["window_seconds"]) for w in r["result"]["throughput"])
        assert 0 < timed < r["job"]["wall_seconds"]
        # one window from each of two models built one after the other
        assert all(w["models"] == 2 and len(w["window_seconds"]) == 2 and min(w["window_seconds"]) > 0
                   for w in r["result"]["throughput"])
        assert (run["out"] / r["job"]["log"]).is_file()
    hv2 = next(r for r in training if r["strategy"] == "hvdk8s" and r["workers"] == 2)
    assert {w["workload"]: w["examples_per_window"] for w in hv2["result"]["throughput"]} == {"cnn": 3 * 32 * 2, "mlp": 3 * 8 * 2}
    # the raw loop's windows alternated with hvdk8s's in the same launch, one per hvdk8s window, from a raw loop per model
    assert all(len(w["paired_raw_window_seconds"]) == 2 for w in hv2["result"]["throughput"])
    ratios = results["derived"]["ratios"]
    assert {(p["strategy"], p["workload"], p["workers"]) for p in ratios["paired"]} == {
        ("hvdk8s", "cnn", 1), ("hvdk8s", "cnn", 2), ("hvdk8s", "mlp", 1), ("hvdk8s", "mlp", 2)}
    assert ratios["rounds"] == [] and ratios["time_to_accuracy"] == []  # no separate raw-loop launch in this run
    assert all(0 < p["ratio"]["median"] < 20 and p["ratio"]["n"] == 1 for p in ratios["paired"])
    sweep = results["derived"]["allreduce"]["sweep"]
    assert [(p["fusion"], p["bytes"]) for p in sweep] == [("default", 4096), ("default", 65536), ("cycle_0.1ms", 4096), ("cycle_0.1ms", 65536)]
    assert all(p["busbw_bytes_per_s"] == p["algbw_bytes_per_s"] for p in sweep)  # 2(N-1)/N = 1 at N=2


@pytest.mark.e2e
def test_profile_phases_and_timeline(run: dict[str, Any]) -> None:
    prof = run["results"]["derived"]["profile"]["workloads"]
    assert [w["workload"] for w in prof] == ["cnn", "mlp"]
    for w in prof:
        assert all(v > 0 for v in w["phases"].values()), w["phases"]
        assert w["hvdk8s"]["total"] == w["phases"]["hvdk8s_fit"] and w["raw"]["total"] == w["phases"]["raw_step"]
        # each harness's own update: Keras's SGD for the raw loop, the DistributedOptimizer's fused one for hvdk8s
        ph = w["phases"]
        assert (w["raw"]["optimizer"], w["hvdk8s"]["optimizer"]) == (ph["optimizer"], ph["hvdk8s_optimizer"])
        assert w["hvdk8s"]["allreduce_wait"] == pytest.approx(
            ph["hvdk8s_train_step"] - (ph["input"] + ph["forward_backward"] + ph["hvdk8s_optimizer"]))
        # fit's step call: the train_function over the same model's train_step compiled alone
        assert w["hvdk8s"]["step_call"] == w["phases"]["hvdk8s_step"] - w["phases"]["hvdk8s_train_step"]
        # every hvdk8s step of the timeline: its gradients were submitted, then reduced
        assert len(w["overlap"]) >= 2 and all(o["tensors"] >= 1 and o["last_reduce_end_s"] > 0 for o in w["overlap"])
    assert (run["out"] / "timeline.png").is_file()


@pytest.mark.e2e
def test_every_table_number_traces_to_results(run: dict[str, Any]) -> None:
    md = (run["out"] / "report.md").read_text()
    assert untraced_cells(md, run["results"]) == []
    # and the check can fail: a number that no run produced is caught
    forged = md.replace("| E(N) vs own N=1 | windows |\n|---|---|---|---|---|---|\n",
                        "| E(N) vs own N=1 | windows |\n|---|---|---|---|---|---|\n| x | 3 | 123,457 | 99% | 99% | 2 |\n", 1)
    assert any("123,457" in cell for cell in untraced_cells(forged, run["results"]))


@pytest.mark.e2e
def test_emulated_cluster_measured_and_removed(run: dict[str, Any]) -> None:
    emu = run["results"]["derived"]["emulated"]
    assert netns.existing_namespaces() == []
    if netns.available() is not None:
        assert emu["skipped"]
        pytest.skip(f"network namespaces unavailable: {emu['skipped']}")
    (rate,) = emu["rates"]
    assert rate["rate"] == "1gbit"
    # TCP cannot beat the shaper; the floor is loose: two Python processes send 64 MiB each way while the other
    # test worker can hold both cores, and a shaper that did not apply its rate would fail the upper bound
    assert 0.1 < rate["link"]["fraction_of_rate"] < 1.05
    assert [(p["workers"], p["bytes"]) for p in rate["ring"]] == [(2, 4096), (2, 262144)]
    assert [(p["workers"], p["servers"]) for p in rate["ps"]] == [(2, 1), (2, 1)]
    assert rate["ring_fit"]["bandwidth_bytes_per_s"] > 0 and rate["ps_fit"]["points"]


# every committed run of the suite (a folder whose results.json is the suite's: example, knobs, and studies added
# later, e.g. stacks; not other tools' results, such as hvdk8s bench --chaos's)
COMMITTED = sorted(p.parent.name for p in (REPO / "benchmarks" / "reports").glob("*/results.json")
                   if json.loads(p.read_text()).get("schema", "").startswith("hvdk8s-bench/"))


def test_the_committed_runs_are_found() -> None:
    assert {"example", "knobs", "threads", "synthetic"} <= set(COMMITTED) and "chaos" not in COMMITTED


@pytest.mark.parametrize("name", COMMITTED)
def test_committed_example_report_traces_to_its_results(name: str) -> None:
    example = REPO / "benchmarks" / "reports" / name
    results = json.loads((example / "results.json").read_text())
    md = (example / "report.md").read_text()
    assert same_figures(json.loads(json.dumps(analysis.derive(results["raw"]), default=float)), results["derived"]) == []
    assert untraced_cells(md, results) == []
    assert md == report.render(results)  # re-rendering reproduces the committed report
    for png in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md):
        assert (example / png).stat().st_size < 200_000


# --- Horovod's synthetic benchmarks (issues 30, 37): the suite's two modules launched as users run them ----------
@pytest.mark.e2e
def test_horovods_synthetic_scripts_run_alternately_and_are_reported(run: dict[str, Any]) -> None:
    proc, results, out = run["proc"], run["results"], run["out"]
    assert proc.returncode == 0 and results["errors"] == [], proc.stderr[-3000:]
    raw = results["raw"]
    assert [(r["script"], r["workers"]) for r in raw["synthetic"]] == [("raw", 1), ("hvdk8s", 1), ("raw", 2), ("raw_split", 2),
                                                                       ("hvdk8s", 2)]
    for r in raw["synthetic"]:
        assert r["model"] == "MobileNetV3Small" and r["batch_per_rank"] == 8 and len(r["iter_img_per_s_per_rank"]) == 1
        assert r["iter_img_per_s_per_rank"][0] > 0 and r["knob"] == "baseline"
        log = (out / r["job"]["log"]).read_text(errors="replace")
        assert f"Model: MobileNetV3Small, batch size 8 per rank, {r['workers']} CPU rank(s)" in log
        # each launch ran its own script: only hvdk8s's fit prints where its ranks run
        placed = f"hvdk8s: {r['workers']} rank{'s' if r['workers'] > 1 else ''} on 1 host"
        assert (placed in log) == (r["script"] == "hvdk8s")
    rows = results["derived"]["synthetic"]
    assert [(r["workers"], r["hvdk8s_over_raw"]["n"]) for r in rows] == [(1, 1), (2, 1)]
    assert "hvdk8s_over_raw_split" not in rows[0] and rows[1]["hvdk8s_over_raw_split"]["n"] == rows[1]["raw_split_over_raw"]["n"] == 1
    assert analysis.derive(raw) == results["derived"]
    md = (out / "report.md").read_text()
    assert "## Horovod's synthetic benchmarks" in md and "`python -m hvdk8s.benchmarks.workers.synthetic_loop`" in md
    assert any(line.startswith("| horovod-synthetic:MobileNetV3Small | Horovod's scripts, separate launches, equal threads | ") for line in md.splitlines())
    assert untraced_cells(md, results) == []


# --- hvdk8s.init's CPU thread policy (issue 30), in real processes --------------------------------------------------
POOLS = ("import hvdk8s, tensorflow as tf; hvdk8s.init(quiet=True); "
         "print(tf.config.threading.get_intra_op_parallelism_threads(), tf.config.threading.get_inter_op_parallelism_threads())")


@pytest.mark.parametrize(("env", "pools"), [
    ({}, "CORES 0"),  # the default, split-intra: the rank's share of the cores (1 rank here), TF's inter-op pool
    ({"HVDK8S_THREAD_POLICY": "tf"}, "0 0"),  # TensorFlow's own pools (0 = its default), as a raw Horovod script runs
    ({"HVDK8S_THREAD_POLICY": "tf", "HVDK8S_THREADS_PER_RANK": "3"}, "3 2"),  # the override wins over the policy
])
def test_init_applies_the_cpu_thread_policy(env: dict[str, str], pools: str) -> None:
    import os

    environ = {k: v for k, v in os.environ.items() if not k.startswith("HVDK8S_THREAD")}
    environ.update({"CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "3", **env})
    done = subprocess.run([sys.executable, "-c", POOLS], env=environ, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[-2] == pools.replace("CORES", str(os.cpu_count()))
