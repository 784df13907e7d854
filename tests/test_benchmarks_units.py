"""Pure parts of the benchmark suite: cost model, statistics, settings, command lines, formatting.

Fast (no TensorFlow, no processes); the end-to-end run is tests/test_benchmarks.py.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hvdk8s.benchmarks import cli
from hvdk8s.benchmarks.config import knobs
from hvdk8s.benchmarks.config.settings import NO_TTA, PRESETS, STRATEGIES, SettingsError, preset, validate
from hvdk8s.benchmarks.emulation import netns
from hvdk8s.benchmarks.harness import chaos, cluster_jobs, suite
from hvdk8s.benchmarks.machine import launch
from hvdk8s.benchmarks.reporting import analysis, costmodel, report, stats
from hvdk8s.common.errors import UserError

REPO = Path(__file__).resolve().parents[1]


def test_ring_and_ps_formulas() -> None:
    # N=2: each rank sends M once; N=4: 1.5 M, plus 2(N-1) latency steps.
    assert costmodel.ring_time(2, 1e6, 0.0, 1e6) == pytest.approx(1.0)
    assert costmodel.ring_time(4, 1e6, 1e-3, 1e6, 0.5) == pytest.approx(1.5 + 6e-3 + 0.5)
    # One PS, 4 workers: its link carries 4 M each way; alone, a worker pulls then pushes (2 M).
    assert costmodel.ps_time(4, 1, 1e6, 1e-3, 1e6) == pytest.approx(4.0 + 2e-3)
    assert costmodel.ps_time(1, 1, 1e6, 0.0, 1e6) == pytest.approx(2.0)
    assert analysis.busbw_factor(2) == 1.0 and analysis.busbw_factor(4) == 1.5


def test_fit_ring_recovers_parameters_and_separates_overhead_only_with_two_sizes_of_n() -> None:
    truth = {"alpha": 20e-6, "bandwidth": 1.1e8, "overhead": 1e-3}
    points = [
        {"workers": n, "bytes": m, "seconds": costmodel.ring_time(n, m, truth["alpha"], truth["bandwidth"], truth["overhead"])}
        for n in (2, 4) for m in (4096, 1 << 20, 8 << 20)
    ]
    fit = costmodel.fit_ring(points)
    assert fit["fitted"] == ["B", "alpha", "c"]
    assert fit["alpha_s"] == pytest.approx(truth["alpha"], rel=1e-6)
    assert fit["bandwidth_bytes_per_s"] == pytest.approx(truth["bandwidth"], rel=1e-6)
    assert fit["overhead_s"] == pytest.approx(truth["overhead"], rel=1e-6)
    assert fit["median_abs_error"] < 1e-9
    single_n = costmodel.fit_ring([p for p in points if p["workers"] == 2])
    assert "c" not in single_n["fitted"] and single_n["overhead_s"] == 0.0


def test_fit_drops_a_term_that_would_be_negative() -> None:
    # Pure bandwidth: the best alpha would be ~0 or negative, so it is fixed at 0.
    points = [{"workers": 2, "bytes": m, "seconds": m / 1e8 * (1.02 if m == 4096 else 1.0)} for m in (4096, 1 << 20, 1 << 24)]
    points[0]["seconds"] = 4096 / 1e8 * 0.5  # small message faster than the line: negative intercept
    fit = costmodel.fit_ring(points)
    assert fit["alpha_s"] == 0.0 and fit["fitted"] == ["B"]


def test_fit_ps_recovers_parameters() -> None:
    points = [
        {"workers": n, "servers": 1, "bytes": m, "seconds": costmodel.ps_time(n, 1, m, 3e-4, 1.2e8)}
        for n in (2, 4) for m in (65536, 8 << 20)
    ]
    fit = costmodel.fit_ps(points)
    assert fit["alpha_s"] == pytest.approx(3e-4, rel=1e-6)
    assert fit["bandwidth_bytes_per_s"] == pytest.approx(1.2e8, rel=1e-6)


def test_predictions_follow_the_formulas_and_keep_published_apart() -> None:
    rows = costmodel.predict("H100", costmodel.gpus()["H100"]["rates"], workers=(512,))
    r101 = next(r for r in rows if r["model"] == "ResNet-101" and r["network"] == "25 GbE")
    nbytes = 44.5e6 * 4
    t_c = 256 / 2642  # the measured H100 rate, not a FLOP-scaled guess
    t_ring = 2 * 511 / 512 * nbytes / (25e9 / 8) + 2 * 511 * 5e-6
    assert r101["compute_s"] == pytest.approx(t_c)
    assert r101["ring_efficiency"] == pytest.approx(t_c / (t_c + t_ring))
    assert r101["ring_efficiency"] < r101["ring_overlapped_efficiency"] <= 1  # overlap hides part of the ring
    assert {r["network"] for r in rows} == set(costmodel.NETWORKS)
    assert all(0 < r["ring_efficiency"] <= 1 and 0 < r["ps_efficiency"] <= 1 for r in rows)
    assert all(p["source"] and p["system"] for p in costmodel.PUBLISHED)


def test_h100_rates_are_the_packages_own_data_with_their_source(tmp_path: Path) -> None:
    assert costmodel.H100_RATES_PATH == REPO / "benchmarks" / "h100_training_rates.json"  # package data, at the package root
    measured = json.loads(costmodel.H100_RATES_PATH.read_text())
    assert all(measured[key] for key in ("what", "device", "framework", "measured", "unit"))  # what, on what, when
    bf16 = {"ResNet-50": [3970.0, 256], "ResNet-101": [2642.0, 256], "VGG-16": [3233.0, 128]}
    h100 = costmodel.gpus()["H100"]
    assert h100["rates"] == bf16 and "NVIDIA H100" in h100["source"] and "2026-11-22" in h100["source"]
    changed = {**measured, "rates": [{**r, "images_per_second": 2 * r["images_per_second"]} for r in measured["rates"]]}
    (tmp_path / "rates.json").write_text(json.dumps(changed))
    assert costmodel.gpus(tmp_path / "rates.json")["H100"]["rates"]["ResNet-50"] == [2 * bf16["ResNet-50"][0], 256]
    with pytest.raises(ValueError, match=r"cannot read the measured H100 rates from .*missing.json"):
        costmodel.gpus(tmp_path / "missing.json")
    (tmp_path / "short.json").write_text(json.dumps({**measured, "rates": measured["rates"][:1]}))
    with pytest.raises(ValueError, match=r"short.json has no bf16 rate for \['ResNet-101', 'VGG-16'\]"):
        costmodel.gpus(tmp_path / "short.json")


def test_h100_rates_carry_the_measurement_record_unchanged() -> None:
    from conftest import shared

    record = json.loads(shared("measurements/h100_training_rates.json").read_text())
    names = {"resnet50": "ResNet-50", "resnet101": "ResNet-101", "vgg16": "VGG-16"}
    ours = json.loads(costmodel.H100_RATES_PATH.read_text())
    assert ours["measured"] == record["measured"]
    assert [(r["model"], r["precision"], r["batch"], r["images_per_second"]) for r in ours["rates"]] == [
        (names[r["model"]], r["precision"], r["batch"], r["images_per_second"]) for r in record["rates"]]


def test_the_extrapolation_is_the_ideal_transport_only() -> None:
    model = analysis.model({"sweep": []})
    assert {p["variant"] for p in model["predictions"]} == {"ideal transport"} and "basis" not in model
    for n in (128, 512):  # brackets the published 88% and 90% (ResNet-101, 25 GbE), unlike the CPU-fitted latencies did
        r101 = next(p for p in model["predictions"] if p["model"] == "ResNet-101" and p["gpu"] == "P100" and p["network"] == "25 GbE"
                    and p["workers"] == n)
        assert r101["ring_efficiency"] < 0.88 and 0.90 < r101["ring_overlapped_efficiency"] <= 1


def test_layer_tables_match_the_parameter_counts_and_buckets_follow_backprop() -> None:
    for model, spec in costmodel.MODELS.items():
        assert sum(p for p, _ in costmodel.LAYERS[model]) == pytest.approx(spec["params"], rel=0.01)
        assert sum(m for _, m in costmodel.LAYERS[model]) == pytest.approx(spec["gflops"] * 1e9, rel=0.03)
        parts = costmodel.buckets(model)
        assert sum(b for b, _ in parts) == sum(p for p, _ in costmodel.LAYERS[model]) * 4
        assert [d for _, d in parts] == sorted(d for _, d in parts) and parts[-1][1] == pytest.approx(1.0)
        assert all(b >= costmodel.BUCKET_BYTES for b, _ in parts[:-1])
    # a free network: the step is the compute; an infinitely slow one: overlap cannot hide it
    assert costmodel.overlapped_step(0.1, "ResNet-50", lambda b: 0.0) == 0.1
    slow = costmodel.overlapped_step(0.1, "ResNet-50", lambda b: b * 1e-6)
    assert slow > 0.1 and slow < 0.1 + 25.6e6 * 4 * 1e-6


def test_summary_is_median_quartiles_min_max_spread() -> None:
    assert stats.summary([3.0, 1.0, 2.0, 10.0]) == {
        "n": 4, "median": 2.5, "q1": 1.75, "q3": 4.75, "min": 1.0, "max": 10.0, "spread": 9.0 / 2.5
    }
    assert stats.summary([7.0]) == {"n": 1, "median": 7.0, "q1": 7.0, "q3": 7.0, "min": 7.0, "max": 7.0, "spread": 0.0}
    with pytest.raises(ValueError):
        stats.summary([])


def _run(strategy: str, n: int, seconds: list[float], examples: int, round_: int = 0, paired: list[float] | None = None) -> dict:
    window = {"workload": "cnn", "description": "d", "params": 10, "gradient_bytes": 40, "batch_per_rank": 4,
              "steps_per_window": 1, "examples_per_window": examples, "window_seconds": seconds}
    if paired:
        window["paired_raw_window_seconds"] = paired
    return {"strategy": strategy, "workers": n, "round": round_, "result": {"throughput": [window]}}


def test_ratios_to_the_raw_loop_per_launch_then_median_and_iqr() -> None:
    raw = [
        _run("horovod", 2, [1.0, 1.0], 100, 0), _run("hvdk8s", 2, [2.0, 2.0], 100, 0, paired=[1.0, 1.0]),
        _run("horovod", 2, [1.0, 1.0], 100, 1), _run("hvdk8s", 2, [1.0, 1.0], 100, 1, paired=[1.0, 3.0]),
        _run("tf_mwms", 2, [4.0], 100, 1), _run("hvdk8s_spe", 2, [1.0, 1.0], 100, 0, paired=[1.1, 1.1]),
    ]
    r = analysis.ratios(raw)
    paired, spe = r["paired"]  # one row per strategy that paired with the raw loop
    assert paired["strategy"] == "hvdk8s" and spe["strategy"] == "hvdk8s_spe"
    assert paired["ratio"]["n"] == 2 and paired["ratio"]["min"] == 0.5 and paired["ratio"]["max"] == 2.0  # 1/2, then 2/1
    assert spe["ratio"]["n"] == 1 and spe["ratio"]["median"] == pytest.approx(1.1)
    rounds = {(x["strategy"], x["ratio"]["n"]): x["ratio"]["median"] for x in r["rounds"]}
    # mwms only where its round has a raw launch
    assert rounds == {("hvdk8s", 2): pytest.approx(0.75), ("tf_mwms", 1): 0.25, ("hvdk8s_spe", 1): 1.0}


def test_emulated_training_ratio_to_hvdk8s_per_round_then_median_and_iqr() -> None:
    raw = [
        _run("hvdk8s", 2, [1.0, 1.0], 100, 0), _run("tf_mwms", 2, [2.0, 2.0], 100, 0),
        _run("hvdk8s", 2, [2.0, 2.0], 100, 1), _run("tf_mwms", 2, [1.0, 1.0], 100, 1),
        _run("tf_ps", 2, [1.0], 100, 2),  # its round has no hvdk8s launch
    ]
    rows = {r["strategy"]: r for r in analysis.with_ratio_to_hvdk8s(raw)}
    assert rows["hvdk8s"]["over_hvdk8s"] is None and rows["tf_ps"]["over_hvdk8s"] is None
    mwms = rows["tf_mwms"]["over_hvdk8s"]  # 0.5 in round 0, 2 in round 1: not the ratio of pooled medians (1)
    assert mwms["n"] == 2 and mwms["min"] == 0.5 and mwms["max"] == 2.0
    assert rows["tf_mwms"]["examples_per_s"]["n"] == 4  # throughput still pools every window of every round
    assert report._launches(list(rows.values())) == "2 launches each, one of every strategy per round"
    assert report._launches([rows["hvdk8s"]]) == "one launch each"


def test_time_to_accuracy_paired_ratio_is_the_raw_loops_epoch_seconds_over_hvdk8s() -> None:
    def with_tta(run: dict, train_seconds: float, paired: list[float] | None) -> dict:
        tta = {"curve": [{"epoch": 1, "train_seconds": train_seconds / 2}, {"epoch": 2, "train_seconds": train_seconds}],
               "steps_per_epoch_per_worker": 1, "batch_per_rank": 4, "workers": 2}
        run["result"]["time_to_accuracy"] = {**tta, **({"paired_raw_epoch_seconds": paired} if paired else {})}
        return run

    raw = [with_tta(_run("horovod", 2, [1.0], 100, r), 2.0, None) for r in (0, 1)]
    raw += [with_tta(_run("hvdk8s", 2, [1.0], 100, 0), 2.0, [0.5, 1.3]),  # raw loop 1.8 s for hvdk8s's 2.0 s
            with_tta(_run("hvdk8s", 2, [1.0], 100, 1), 1.0, [0.6, 0.6])]
    (paired,) = analysis.ratios(raw)["time_to_accuracy_paired"]
    assert paired["workers"] == 2 and paired["ratio"]["min"] == pytest.approx(0.9) and paired["ratio"]["max"] == 1.2
    assert "time_to_accuracy_paired" not in analysis.ratios(raw[:2])  # older results derive as before


def test_training_efficiency_against_single_and_own_baseline() -> None:
    raw = [_run("single", 1, [1.0, 1.0, 1.0], 100), _run("hvdk8s", 1, [1.25, 1.25], 100), _run("hvdk8s", 2, [1.0, 2.0, 1.0], 200)]
    rows = {(r["strategy"], r["workers"]): r for r in analysis.training(raw)["throughput"]}
    assert rows[("single", 1)]["efficiency_vs_single"] == 1.0
    assert rows[("hvdk8s", 1)]["efficiency_vs_single"] == pytest.approx(0.8)
    two = rows[("hvdk8s", 2)]
    assert two["examples_per_s"]["median"] == 200 and two["examples_per_s"]["min"] == 100
    assert two["efficiency_vs_single"] == pytest.approx(1.0)
    assert two["efficiency_vs_own_n1"] == pytest.approx(200 / (2 * 80))


def test_fusion_pairs_side_by_side() -> None:
    rows = [{"fusion": f, "mode": "grouped", "tensors": 8, "tensor_bytes": 4096, "seconds": {"median": t}}
            for f, t in (("default", 0.001), ("off", 0.004))]
    assert analysis.fusion_pairs(rows) == [{"mode": "grouped", "tensors": 8, "tensor_bytes": 4096, "seconds_fusion_on": 0.001,
                                            "seconds_fusion_off": 0.004, "off_over_on": 4.0}]


def test_emulated_cluster_commands_touch_only_its_own_namespaces() -> None:
    cluster = netns.Cluster("1gbit", netns.hosts(2))
    cmds = netns.setup_commands(cluster)
    assert cmds[0] == ["ip", "netns", "add", "hvbench-sw"]
    for cmd in cmds:  # nothing is configured in the machine's own namespace
        assert cmd[:3] == ["ip", "netns", "add"] or cmd[:3] == ["ip", "netns", "exec"], cmd
        assert cmd[2] != "exec" or cmd[3].startswith("hvbench-")
    addrs = [c for c in cmds if "addr" in c]
    assert [c[-3] for c in addrs] == ["10.213.0.10/24", "10.213.0.11/24"]
    shaped = [c for c in cmds if "tbf" in c]
    assert len(shaped) == 4  # both directions of both links
    assert all(c[c.index("rate") + 1] == "1gbit" for c in shaped)
    assert netns.tbf_args("10gbit")[netns.tbf_args("10gbit").index("burst") + 1] == str(int(10e9 / 8 / 1000))


def test_parse_rate_and_size() -> None:
    assert netns.parse_rate("1gbit") == 1e9 and netns.parse_rate("500mbit") == 5e8
    with pytest.raises(ValueError, match="tc rate"):
        netns.parse_rate("1GB/s")
    assert [cli.parse_size(x) for x in ("4096", "4K", "64MiB", "1g")] == [4096, 4096, 64 << 20, 1 << 30]
    with pytest.raises(ValueError):
        cli.parse_size("lots")


def test_mpi_command_in_emulated_cluster_runs_mpirun_on_host0_and_ranks_on_workers() -> None:
    cluster = netns.Cluster("1gbit", netns.hosts(4))
    argv = launch.mpi_command(2, ["python", "w.py"], ["PATH"], cluster, as_root=True)
    assert argv[:5] == ["ip", "netns", "exec", "hvbench-h0", "unshare"]
    inner = argv[argv.index("--") + 1:]
    assert inner[:3] == ["mpirun", "-np", "2"] and inner[-2:] == ["python", "w.py"]
    assert inner[inner.index("-H") + 1] == "hvbench-h1:1,hvbench-h2:1"
    mca = {inner[i + 1]: inner[i + 2] for i, x in enumerate(inner) if x == "-mca"}
    assert mca["btl_tcp_if_include"] == "hvb0" and mca["mpi_yield_when_idle"] == "1"
    assert mca["plm_rsh_agent"].endswith("netns_agent.py")
    local = launch.mpi_command(2, ["python", "w.py"], [], None, as_root=False)
    assert local[0] == "mpirun" and "-H" not in local and "--allow-run-as-root" not in local
    with pytest.raises(ValueError, match="worker hosts"):
        launch.mpi_command(4, ["x"], [], cluster, as_root=True)


def test_tf_cluster_plan_places_roles_on_hosts() -> None:
    spec, place = launch.tf_cluster_plan({"chief": 1, "worker": 2, "ps": 1}, netns.Cluster("1gbit", netns.hosts(4)))
    assert spec == {"chief": ["10.213.0.10:2222"], "worker": ["10.213.0.11:2222", "10.213.0.12:2222"], "ps": ["10.213.0.13:2222"]}
    assert place[("ps", 0)].name == "hvbench-h3"
    spec, place = launch.tf_cluster_plan({"worker": 2}, None)
    assert set(place.values()) == {None} and len(set(spec["worker"])) == 2
    assert all(a.startswith("127.0.0.1:") for a in spec["worker"])


def test_training_configs_interleave_rounds_single_only_at_one_fp16_only_above() -> None:
    s = preset("quick", strategies=("single", "hvdk8s", "hvdk8s_fp16"), ranks=(1, 2), rounds=2)
    assert suite.training_configs(s) == [
        (0, "single", 1), (0, "hvdk8s", 1), (0, "hvdk8s", 2), (0, "hvdk8s_fp16", 2),
        (1, "single", 1), (1, "hvdk8s", 1), (1, "hvdk8s", 2), (1, "hvdk8s_fp16", 2),
    ]


def test_the_raw_loop_at_both_thread_pools_runs_only_where_they_differ_and_without_time_to_accuracy() -> None:
    s = preset("quick", strategies=("horovod", "horovod_tfdefault", "horovod_split"), ranks=(1, 2), rounds=1)
    # at one rank hvdk8s's split is TensorFlow's default pool
    assert suite.training_configs(s) == [(0, "horovod", 1), (0, "horovod", 2), (0, "horovod_tfdefault", 2), (0, "horovod_split", 2)]
    assert {"horovod_tfdefault", "horovod_split"} <= set(NO_TTA)
    with pytest.raises(ValueError, match="emulated_train_strategies: unsupported"):
        preset("quick", emulated_train_strategies=("horovod_split",))


def test_the_thread_policys_gain_is_the_split_raw_loop_over_the_default_one_of_the_same_round() -> None:
    raw = [_run("horovod_tfdefault", 2, [2.0], 100, 0), _run("horovod_split", 2, [1.0], 100, 0),
           _run("horovod_tfdefault", 2, [1.0], 100, 1), _run("horovod_split", 2, [1.25], 100, 1),
           _run("horovod_split", 2, [1.0], 100, 2),  # no default-pool launch in its round: no ratio
           _run("horovod", 2, [1.0], 100, 0), _run("hvdk8s", 2, [1.0], 100, 0, paired=[1.0])]
    [row] = analysis.ratios(raw)["thread_policy"]
    assert row["workload"] == "cnn" and row["workers"] == 2
    assert row["ratio"]["n"] == 2 and row["ratio"]["min"] == pytest.approx(0.8) and row["ratio"]["max"] == 2.0
    assert "thread_policy" not in analysis.ratios(raw[5:])  # results without these launches derive as before


def test_the_thread_policy_row_follows_the_equal_thread_headline_and_says_gpu_ranks_do_not_get_it() -> None:
    two = {"n": 3, "median": 1.1, "q1": 1.05, "q3": 1.15, "min": 1.02, "max": 1.2, "spread": 0.1}
    one = {"n": 3, "median": 0.95, "q1": 0.95, "q3": 0.95, "min": 0.94, "max": 0.96, "spread": 0.02}
    d = {"ratios": {"paired": [{"workload": "cnn", "strategy": "hvdk8s", "workers": 2, "ratio": one}], "rounds": [],
                    "time_to_accuracy": [], "thread_policy": [{"workload": "cnn", "workers": 2, "ratio": two}]},
         "emulated": {}, "synthetic": []}
    lines = report._ratio_section(d).splitlines()
    equal = lines.index("| cnn | shared memory, alternating windows, equal threads | 0.95 [0.94–0.96] (3) |")
    policy = lines.index("| cnn | 1.1 [1.02–1.2] (3) |")
    assert equal < policy and "| workload | raw loop, split / TensorFlow's defaults, N=2 |" in lines
    gain = next(line for line in lines if line.startswith("**The thread policy's own gain**"))
    assert "On GPU ranks `hvdk8s.init` pins the rank's GPU and applies no thread policy" in gain
    assert "The thread policy" not in report._ratio_section({**d, "ratios": {**d["ratios"], "thread_policy": []}})


def test_emulated_training_interleaves_rounds() -> None:
    s = preset("quick", emulated_train_strategies=("hvdk8s", "tf_mwms"), rounds=2)
    assert suite.emulated_train_configs(s) == [(0, "hvdk8s"), (0, "tf_mwms"), (1, "hvdk8s"), (1, "tf_mwms")]


def _bench_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    return parser.parse_args(["bench", *argv])


def test_cli_flags_override_the_preset() -> None:
    args = _bench_args("--quick", "--strategies", "single,tf_ps", "--sizes", "4K,1M", "--emulated-rates", "none", "--no-tta")
    s = cli.settings_from_args(args)
    assert s.preset == "quick" and s.strategies == ("single", "tf_ps")
    assert s.allreduce_sizes == (4096, 1 << 20) and s.emulated_rates == () and s.tta is False
    assert cli.settings_from_args(_bench_args()).preset == "full" and PRESETS["full"].rounds == 3
    peer = _bench_args("--quick", "--workloads", "horovod-synthetic:MobileNetV2", "--synthetic-peer", "/horovod/examples")
    assert cli.settings_from_args(peer).synthetic_peer == "/horovod/examples"


def test_the_profile_breaks_down_every_workload_or_the_ones_named() -> None:
    workloads = ("--workloads", "cnn,mlp,horovod-synthetic:MobileNetV2", "--profile")
    assert cli.settings_from_args(_bench_args(*workloads)).profiled_workloads == ("cnn", "mlp", "horovod-synthetic:MobileNetV2")
    named = cli.settings_from_args(_bench_args(*workloads, "--profile-workloads", "mlp,cnn"))
    assert named.profiled_workloads == ("mlp", "cnn") and named.workloads == ("cnn", "mlp", "horovod-synthetic:MobileNetV2")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--strategies", "single,nccl"), "--strategies: unknown"),
        (("--ranks", "2"), "must include 1"),
        (("--emulated-workers", "1"), "at least 2 workers"),
        (("--emulated-rates", "1"), "link rate '1'"),
        (("--emulated-rates", "1gbit", "--emulated-train-rates", "10gbit"), "not among --emulated-rates"),
        (("--knobs", "cycle_5ms,turbo"), "--knobs: unknown"),
        (("--workloads", "cnn", "--profile-workloads", "cnn,mlp"), r"--profile-workloads: \['mlp'\] not among --workloads \['cnn'\]"),
        (("--strategies", "hvdk8s_spe", "--steps", "12"), r"\n  --steps: 12 is not a multiple of 5: hvdk8s_spe runs 5 steps "
         "per compiled call"),
        (("--strategies", "hvdk8s", "--emulated-train-strategies", "hvdk8s_spe", "--emulated-train-steps", "7"),
         r"\n  --emulated-train-steps: 7 is not a multiple of 5: hvdk8s_spe"),
        (("--mlp-width", "-5"), r"\n  --mlp-width: must be >= 1, got -5"),
        (("--sizes", "0"), r"\n  --sizes: \[0\]: each size must be >= 4 bytes \(one float32\)"),
        (("--fusion-bytes", "4K,2"), r"\n  --fusion-bytes: \[2\]: each size must be >= 4 bytes"),
        (("--emulated-sizes", "0"), r"\n  --emulated-sizes: \[0\]: each size must be >= 4 bytes"),
        (("--memcopy-bytes", "4"), r"\n  --memcopy-bytes: must be >= 8, got 4"),
        (("--fusion-tensors", "0"), r"\n  --fusion-tensors: must be >= 1, got 0"),
        (("--comm-steps", "0"), r"\n  --comm-steps: must be >= 1, got 0"),
        (("--timeout", "0"), r"\n  --timeout: must be > 0, got 0.0"),
        (("--allreduce-min-seconds", "-1"), r"\n  --allreduce-min-seconds: must be >= 0, got -1.0"),
        (("--workloads", "horovod-synthetic:NoSuchModel"),
         r"\n  --workloads: workload 'horovod-synthetic:NoSuchModel': keras.applications has no model 'NoSuchModel'; "
         r"expected one of ConvNeXtBase, .*, MobileNetV2, .*, Xception"),
        (("--workloads", "horovod-synthetic:Resnet50"), r"has no model 'Resnet50' \(did you mean ResNet50\?\)"),
    ],
)
def test_cli_rejects_bad_settings_naming_the_flag(argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(UserError, match=message):
        cli.settings_from_args(_bench_args("--quick", *argv))


# Settings wrong in many ways at once, as flags, and every problem each names (in validate's order)
MANY_BAD = ("--quick", "--strategies", "single,nccl,hvdk8s_spe", "--ranks", "2", "--rounds", "0", "--steps", "12",
            "--tta-target", "1.5", "--emulated-rates", "1gbit,fast", "--emulated-train-rates", "10gbit", "--knobs", "turbo")
MANY_BAD_ERRORS = [
    "strategies: unknown ['nccl']; expected some of " + ", ".join(STRATEGIES),
    "ranks: [2] must include 1 (the baseline of E(N)) and be >= 1",
    "rounds: must be >= 1, got 0",
    "tta_target: 1.5 must be in (0, 1]",
    "steps: 12 is not a multiple of 5: hvdk8s_spe runs 5 steps per compiled call",
    "emulated_rates: link rate 'fast': expected a tc rate such as 1gbit, 10gbit or 500mbit",
    "emulated_train_rates: ['10gbit'] not among emulated_rates ['1gbit', 'fast']",
    "knobs: unknown ['turbo']; expected some of " + ", ".join(knobs.names()),
]


def test_every_bad_setting_is_reported_at_once_under_its_field() -> None:
    with pytest.raises(SettingsError) as err:  # MANY_BAD's settings
        preset("quick", strategies=("single", "nccl", "hvdk8s_spe"), ranks=(2,), rounds=0, steps=12, tta_target=1.5,
               emulated_rates=("1gbit", "fast"), emulated_train_rates=("10gbit",), knobs=("turbo",))
    assert err.value.errors == MANY_BAD_ERRORS
    assert str(err.value) == "settings: invalid:\n  " + "\n  ".join(MANY_BAD_ERRORS)
    assert isinstance(err.value, ValueError) and isinstance(err.value, UserError)
    kinds = [e.kind for e in err.value.field_errors]
    assert kinds == ["NotSupported", "Invalid", "Invalid", "Invalid", "Invalid", "Invalid", "Invalid", "NotSupported"]
    # under another spelling of the fields (a caller's flags), fields a problem refers to spelled the same way
    flags = [str(e) for e in validate(err.value.settings, spell=lambda name: "--" + name.replace("_", "-"))]
    assert flags[-2] == "--emulated-train-rates: ['10gbit'] not among --emulated-rates ['1gbit', 'fast']"
    assert validate(PRESETS["full"]) == [] and validate(PRESETS["quick"], "bench") == []


def test_settings_checks_that_overlap_report_each_problem_once() -> None:
    with pytest.raises(SettingsError) as err:
        preset("quick", workloads=("cnn", "horovod-synthetic:resnet-50"), profile_workloads=("mlp",), synthetic_peer="x",
               emulated_train_strategies=("horovod_split", "hvdk8s_fp16"), emulated_train_workers=0, warmup_steps=-5,
               strategies=("hvdk8s_spe",), emulated_workers=(1, 2), synthetic_batches_per_iter=1, allreduce_ranks=1)
    assert err.value.errors == [
        "workloads: workload 'horovod-synthetic:resnet-50': expected horovod-synthetic:<a keras.applications model, "
        "e.g. ResNet50>",
        "profile_workloads: ['mlp'] not among workloads ['cnn', 'horovod-synthetic:resnet-50']",
        "warmup_steps: must be >= 1, got -5 (the first step traces the model and is never timed)",
        "emulated_train_workers: must be >= 1, got 0",
        "synthetic_batches_per_iter: must be >= 2, got 1 (the raw loop's first step and at least one warm-up batch "
        "make its warm-up iteration)",
        "allreduce_ranks: must be >= 2, got 1 (busbw needs at least 2 ranks)",
        "emulated_workers: [1, 2]: the cluster needs at least 2 workers",
        "emulated_train_strategies: unsupported ['horovod_split']; expected some of hvdk8s, horovod, tf_mwms, tf_ps, "
        "hvdk8s_fp16, hvdk8s_rd, hvdk8s_eager64k, hvdk8s_spe",
        "emulated_train_strategies: ['hvdk8s_fp16'] need emulated_train_workers >= 2",
    ]


def test_the_cli_lists_every_bad_setting_without_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    import hvdk8s.cli

    assert hvdk8s.cli.main(["bench", *MANY_BAD]) == 2
    # each under the flag that sets it, with the fields it names
    as_flags = [re.sub(r"^(\w+):", lambda m: "--" + m[1].replace("_", "-") + ":", e) for e in MANY_BAD_ERRORS]
    as_flags[6] = as_flags[6].replace("among emulated_rates", "among --emulated-rates")
    assert capsys.readouterr().err == "hvdk8s bench: error: command line (--quick): invalid:\n  " + "\n  ".join(as_flags) + "\n"


def test_bad_arguments_are_refused_before_any_work(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    done = subprocess.run([sys.executable, "-m", "benchmarks", "--quick", "--emulated-rates", "1", "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "link rate '1': expected a tc rate such as 1gbit" in done.stderr and "Traceback" not in done.stderr
    assert not out.exists()  # nothing was started or written


@pytest.fixture
def nothing_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every way ``hvdk8s bench`` starts work fails the test: the suite, chaos, serving and cluster runs, a launch."""
    from hvdk8s.benchmarks.harness import cluster_collect, cluster_submit, serving_bench

    def started(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("hvdk8s bench started work on arguments it should have refused")

    for module, name in ((suite, "Suite"), (chaos, "main"), (serving_bench, "run"), (cluster_submit, "run_jobs"),
                         (cluster_collect, "results"), (launch.Launcher, "__init__")):
        monkeypatch.setattr(module, name, started)


@pytest.mark.parametrize(("argv", "message"), [
    (("--chaos", "0"), "command line: invalid:\n  --chaos: must be >= 1, got 0"),
    (("--chaos", "-3"), "--chaos: must be >= 1, got -3"),
    (("--mlp-width", "-5"), "command line: invalid:\n  --mlp-width: must be >= 1, got -5"),
    (("--sizes", "0"), "--sizes: [0]: each size must be >= 4 bytes (one float32)"),
    (("--workloads", "horovod-synthetic:NoSuchModel"), "keras.applications has no model 'NoSuchModel'"),
    (("--cluster", "collect", "--logs", "nope"), "command line: invalid:\n  --logs: nope: no such folder"),
    (("--cluster", "collect"), "--logs: --cluster collect needs it: the folder of the jobs' <job>.log files"),
    (("--cluster", "render", "--chaos", "2"), "--chaos: cannot be combined with --cluster"),
    (("--report-only", "results.json", "--serving"), "--serving: cannot be combined with --report-only"),
])
def test_bad_arguments_fail_before_anything_starts_naming_the_flag(argv: tuple[str, ...], message: str, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch, nothing_starts: None,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    import hvdk8s.cli

    monkeypatch.chdir(tmp_path)  # a relative --logs nope, and out/bench, were it written
    for main in (cli.main, lambda argv: hvdk8s.cli.main(["bench", *argv])):  # both entry points
        assert main([*argv, "--out", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_an_existing_logs_folder_is_collected_and_a_file_is_not_one(tmp_path: Path) -> None:
    (logs := tmp_path / "logs").mkdir()
    cli.check_args(_bench_args("--cluster", "collect", "--logs", str(logs)))
    with pytest.raises(UserError, match=r"--logs: .*results\.json: no such folder"):
        cli.check_args(_bench_args("--cluster", "collect", "--logs", str(tmp_path / "results.json")))
    (tmp_path / "results.json").write_text("{}")
    with pytest.raises(UserError, match=r"--logs: .*results\.json: not a folder"):
        cli.check_args(_bench_args("--cluster", "collect", "--logs", str(tmp_path / "results.json")))


@pytest.mark.parametrize("flag", ["--strategies", "--workloads", "--ranks", "--sizes", "--knobs", "--emulated-rates"])
@pytest.mark.parametrize("text", ["", " ", ","])
def test_an_empty_list_is_refused_and_none_is_the_empty_one(flag: str, text: str, nothing_starts: None,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:  # argparse's usage error, before any handler runs
        cli.main([flag, text])
    assert exit_.value.code == 2
    assert f"argument {flag}: {text!r} names nothing: give a comma list, or none for an empty one" in capsys.readouterr().err
    assert cli.settings_from_args(_bench_args("--quick", "--strategies", "none")).strategies == ()
    assert cli.settings_from_args(_bench_args("--quick", "--strategies", "NONE", "--knobs", "none")).knobs == ()


def test_the_synthetic_models_are_the_installed_keras_applications_without_importing_keras() -> None:
    import ast
    import importlib.util

    from hvdk8s.benchmarks.config import synthetic

    spec = importlib.util.find_spec("keras")  # a top-level package: found, not imported
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("keras is not installed")
    root = Path(next(iter(spec.submodule_search_locations)))
    # Keras 3.15: keras/applications/; 3.8: keras/api/applications/ (keras/applications is its src)
    init = next(p for p in (root / "applications" / "__init__.py", root / "api" / "applications" / "__init__.py")
                if p.is_file() and "keras.src.applications" in p.read_text())
    names = {alias.asname or alias.name for node in ast.walk(ast.parse(init.read_text()))
             if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("keras.src.applications.")
             for alias in node.names if alias.name[0].isupper()}
    assert sorted(synthetic.MODELS) == sorted(names) and len(set(synthetic.MODELS)) == len(synthetic.MODELS)
    assert synthetic.model_of("horovod-synthetic:MobileNetV3Small") == "MobileNetV3Small"
    with pytest.raises(ValueError, match="keras.applications has no model 'ResNet18'"):
        synthetic.model_of("horovod-synthetic:ResNet18")


def test_knob_study_runs_the_baseline_first_in_every_round() -> None:
    s = preset("quick", knobs=("cycle_5ms", "ompi_ring"), knob_rounds=2)
    assert suite.knob_configs(s) == [(0, "baseline"), (0, "cycle_5ms"), (0, "ompi_ring"),
                                     (1, "baseline"), (1, "cycle_5ms"), (1, "ompi_ring")]
    assert cli.settings_from_args(_bench_args("--quick", "--knobs", "all")).knobs == knobs.settings_names()
    ring = launch.mpi_command(2, ["x"], [], None, as_root=False, mca=knobs.KNOBS["ompi_ring"].mca)
    assert ring[ring.index("coll_tuned_allreduce_algorithm") + 1] == "ring"
    assert "coll_tuned_allreduce_algorithm" not in launch.mpi_command(2, ["x"], [], None, as_root=False)


def test_overlap_from_timeline_spans() -> None:
    def span(tensor: str, activity: str, start: float, end: float) -> dict:
        return {"tensor": tensor, "activity": activity, "depth": 0, "start_us": start, "end_us": end}

    spans = [  # bucket 1 reduced from t=10 while bucket 2's gradient is submitted at t=30
        span("DistributedSGD.0", "NEGOTIATE_ALLREDUCE", 0, 5), span("DistributedSGD.0", "ALLREDUCE", 10, 40),
        span("DistributedSGD.1", "NEGOTIATE_ALLREDUCE", 30, 35), span("DistributedSGD.1", "ALLREDUCE", 40, 50),
        span("metrics", "ALLREDUCE", 0, 100),
    ]
    (step,) = analysis.overlap(spans)
    assert step == {"tensors": 2, "last_submit_s": 30e-6, "first_reduce_start_s": 10e-6, "last_reduce_end_s": 50e-6,
                    "comm_after_last_submit_s": 20e-6}


def test_formatters() -> None:
    assert [report.num(x) for x in (1234.5, 123.4, 12.34, 1.234, 0.01234, 2, None)] == ["1,234", "123", "12.3", "1.23", "0.0123", "2", "–"]
    assert report.pct(0.876) == "88%" and report.nbytes(4096) == "4KiB" and report.nbytes(64 << 20) == "64MiB"
    assert report.secs(2.5e-5) == "25µs" and report.secs(0.0123) == "12.3ms" and report.secs(2.0) == "2s"
    assert report.gbit(125e6) == "1Gbit/s" and report.gbyte(2.5e9) == "2.5GB/s"
    assert report.spread({"n": 3, "median": 2.0, "min": 1.5, "max": math.pi}) == "2 [1.5–3.14]"


# --- stack knobs: a knob whose ranks run another interpreter (virtual environment) ----------------------------
def _stack_files() -> dict[str, list[str]]:
    """Every supported stack scripts/setup.sh can build (scripts/stacks/tf-<version>.txt), by version: its lines."""
    return {f.stem.removeprefix("tf-"): f.read_text().splitlines() for f in (REPO / "scripts" / "stacks").glob("tf-*.txt")}


def test_every_other_supported_stack_has_a_knob_and_all_needs_no_other_venv() -> None:
    files = _stack_files()
    other = sorted((v for v, lines in files.items() if "default stack" not in lines[0]), key=lambda v: tuple(map(int, v.split("."))))
    assert other, "scripts/stacks should list a stack besides the default one"
    assert knobs.stacks() == tuple(f"tf{v}" for v in other)
    for v in other:
        knob = knobs.KNOBS[f"tf{v}"]
        assert (knob.python, knob.build) == (f".venv-tf{v}/bin/python", f"make test-stack TF={v}")
        keras = next(line.split("==")[1] for line in files[v] if line.startswith("keras=="))
        assert f"TensorFlow {v} / Keras {'.'.join(keras.split('.')[:2])} stack" in knob.what
        assert not knob.env and not knob.mca  # only the stack differs from the baseline
    # 'all' is every Horovod/Open MPI knob and no stack knob; a stack knob is named, alone or beside 'all'
    assert knobs.settings_names() == tuple(k for k in knobs.names() if k not in knobs.stacks())
    assert "cycle_5ms" in knobs.settings_names() and not set(knobs.settings_names()) & set(knobs.stacks())
    assert cli.settings_from_args(_bench_args("--quick", "--knobs", "all,tf2.18")).knobs == (*knobs.settings_names(), "tf2.18")
    assert cli.settings_from_args(_bench_args("--quick", "--knobs", "tf2.18,cycle_5ms,tf2.18")).knobs == ("tf2.18", "cycle_5ms")


def test_a_stack_knobs_ranks_run_its_interpreter_unresolved() -> None:
    venv_python = launch.interpreter(".venv-tf2.18/bin/python")
    assert venv_python == str(REPO / ".venv-tf2.18" / "bin" / "python")  # the venv's own path, not its symlink's target
    assert launch.interpreter("") == sys.executable and launch.interpreter("/opt/py/bin/python") == "/opt/py/bin/python"
    assert launch.module_argv("workers.worker", "--x", python=venv_python)[:2] == [venv_python, "-u"]
    assert launch.module_argv("workers.worker")[0] == sys.executable


def test_what_is_started_by_path_or_module_name_is_there() -> None:
    """Processes start by file path (the netns agent, the chaos worker) or module name (named from the package's root,
    as ``benchmarks`` or ``hvdk8s.benchmarks``); each names a file of its sub-package."""
    from hvdk8s.benchmarks.config import synthetic

    assert launch.PKG == "hvdk8s.benchmarks" and launch.CHECKOUT == REPO
    assert launch.AGENT.is_file() and chaos.WORKER.is_file()
    launched = ["workers.worker", "workers.comm_worker", "emulation.linkprobe",
                *(f"workers.{m}" for m in synthetic.MODULES.values())]
    modules = [cluster_jobs.ENTRY[-1], *(launch.module_argv(m)[3] for m in launched)]
    assert [m for m in modules if importlib.util.find_spec(m) is None] == []


def test_check_stacks_probes_only_stack_knobs_and_names_the_build_command(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []

    def probe(python: str) -> dict[str, str]:
        seen.append(python)
        if "missing" in python:
            raise ValueError(f"{python}: no such interpreter")
        return {"tensorflow": "2.18.1", "keras": "3.8.0"}

    monkeypatch.setitem(knobs.KNOBS, "tf_missing", knobs.Knob(python=".venv-missing/bin/python", build="make test-stack TF=9.9"))
    ok = suite.check_stacks(preset("quick", knobs=("cycle_5ms", "tf2.18")), probe)
    assert ok == {"tf2.18": {"interpreter": ".venv-tf2.18/bin/python", "tensorflow": "2.18.1", "keras": "3.8.0"}}
    assert seen == [str(REPO / ".venv-tf2.18/bin/python")]
    assert suite.check_stacks(preset("quick", knobs=("cycle_5ms",)), probe) == {}
    with pytest.raises(ValueError, match=r"knob tf_missing: its ranks run \.venv-missing/bin/python, which cannot run the "
                                         r"benchmarks \(.*no such interpreter\); build it with `make test-stack TF=9\.9`"):
        suite.check_stacks(preset("quick", knobs=("tf2.18", "tf_missing")), probe)


def test_probe_stack_refuses_a_missing_or_broken_interpreter(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no such interpreter"):
        launch.probe_stack(str(tmp_path / "nope" / "bin" / "python"))
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho 'ModuleNotFoundError: No module named horovod' >&2\nexit 1\n")
    broken.chmod(0o755)
    with pytest.raises(ValueError, match=r"cannot import the benchmark stack \(exit code 1: ModuleNotFoundError: No module named horovod\)"):
        launch.probe_stack(str(broken))
    fine = tmp_path / "fine"
    fine.write_text('#!/bin/sh\necho noise\necho \'{"tensorflow": "2.18.1", "keras": "3.8.0"}\'\n')
    fine.chmod(0o755)
    assert launch.probe_stack(str(fine)) == {"tensorflow": "2.18.1", "keras": "3.8.0"}


def test_a_missing_stack_is_refused_before_anything_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(knobs.KNOBS, "tf_missing", knobs.Knob(python=str(tmp_path / "venv" / "bin" / "python"),
                                                              build="make test-stack TF=9.9"))
    out = tmp_path / "bench"
    args = _bench_args("--quick", "--strategies", "none", "--knobs", "cycle_5ms,tf_missing", "--out", str(out))
    with pytest.raises(UserError, match=r"knob tf_missing: .*no such interpreter.*build it with `make test-stack TF=9\.9`"):
        cli.run(args)
    assert not out.exists()


def _knob_run(knob: str, round_: int, hvdk8s_s: float, raw_s: float, stack: tuple[str, str] | None) -> dict:
    run = _run("hvdk8s", 2, [hvdk8s_s], 100, round_, paired=[raw_s])
    if stack:
        run["result"]["stack"] = {"tensorflow": stack[0], "keras": stack[1]}
    return {**run, "knob": knob}


def test_knob_study_puts_each_knobs_hvdk8s_over_raw_beside_the_baselines_of_the_same_rounds() -> None:
    new, old = ("2.21.0", "3.15.1"), ("2.18.1", "3.8.0")
    raw = [_knob_run("baseline", 0, 1.0, 1.0, new), _knob_run("tf2.18", 0, 2.0, 1.0, old),
           _knob_run("baseline", 1, 1.0, 2.0, new), _knob_run("tf2.18", 1, 1.0, 4.0, old),
           _knob_run("tf2.18", 2, 1.0, 1.0, old)]  # round 2 lost its baseline: left out
    rows = {r["knob"]: r for r in analysis.knob_study(raw)}
    base, stack = rows["baseline"], rows["tf2.18"]
    assert (base["stack"], stack["stack"]) == ("TensorFlow 2.21.0, Keras 3.15.1", "TensorFlow 2.18.1, Keras 3.8.0")
    # hvdk8s / raw loop per launch: the baseline 1 then 2, tf2.18 0.5 then 4; the baseline's beside every row
    assert (stack["hvdk8s_over_raw"]["min"], stack["hvdk8s_over_raw"]["max"], stack["hvdk8s_over_raw"]["n"]) == (0.5, 4.0, 2)
    assert stack["baseline_hvdk8s_over_raw"] == base["hvdk8s_over_raw"] == base["baseline_hvdk8s_over_raw"]
    assert (base["hvdk8s_over_raw"]["min"], base["hvdk8s_over_raw"]["max"]) == (1.0, 2.0)
    assert (stack["hvdk8s"]["min"], stack["hvdk8s"]["max"]) == (0.5, 1.0)  # 2.18's hvdk8s rate over 2.21's, per round
    # results from before stacks were recorded derive as they did: no new keys
    legacy = analysis.knob_study([_knob_run("baseline", 0, 1.0, 1.0, None), _knob_run("cycle_5ms", 0, 2.0, 1.0, None)])
    assert all(set(r) == {"knob", "workload", "hvdk8s", "horovod", "hvdk8s_over_raw"} for r in legacy)
    md = report._knob_section(legacy, {"knob_rounds": 1}, {})
    assert "| knob | what it sets | workload | hvdk8s vs baseline | raw loop vs baseline | hvdk8s / raw loop |" in md


def test_knob_report_shows_each_rows_stack_and_the_baselines_ratio_beside_its_own() -> None:
    new, old = ("2.21.0", "3.15.1"), ("2.18.1", "3.8.0")
    raw = [_knob_run("baseline", r, 1.0, 1.25, new) for r in (0, 1)] + [_knob_run("tf2.18", r, 1.0, 0.5, old) for r in (0, 1)]
    what = {k: v.what for k, v in knobs.KNOBS.items()}
    md = report._knob_section(analysis.knob_study(raw), {"knob_rounds": 2}, what,
                              {"tf2.18": {"interpreter": ".venv-tf2.18/bin/python"}})
    assert "## 7. Horovod, Open MPI and software-stack knobs, N=2" in md and "(tf2.18; the Environment" in md
    assert ("| knob | what it sets | workload | stack | hvdk8s / raw loop | baseline's hvdk8s / raw loop, same rounds | "
            "hvdk8s vs baseline | raw loop vs baseline |") in md
    assert (f"| tf2.18 | {what['tf2.18']} | cnn | TensorFlow 2.18.1, Keras 3.8.0 | 0.5 [0.5–0.5] (2) | 1.25 [1.25–1.25] (2) "
            "| 1 [1–1] (2) | 2.5 [2.5–2.5] (2) |") in md
    assert "| baseline | " in md and "| cnn | TensorFlow 2.21.0, Keras 3.15.1 | 1.25 [1.25–1.25] (2) | 1.25 [1.25–1.25] (2) |" in md
    assert ".venv-tf2.18/bin/python" in what["tf2.18"] and "2.18" in what["tf2.18"]


# --- CPU thread policies and Horovod's synthetic benchmarks (issue 30) -------------------------------------------
def test_thread_policies_give_each_rank_its_pools() -> None:
    from hvdk8s.threads import thread_pools

    # 2 cores, 2 ranks on the host: (intra-op, inter-op), None = TensorFlow's default pool
    assert thread_pools("tf", 2, 2) == (None, None)
    assert thread_pools("split", 2, 2) == (1, 1)
    assert thread_pools("split-intra", 2, 2) == (1, None)
    assert thread_pools("split+1", 2, 2) == (2, 1)
    assert thread_pools("split", 16, 4) == (4, 2) and thread_pools("split", 3, 8) == (1, 1)
    for policy in ("tf", "split", "split-intra", "split+1"):  # HVDK8S_THREADS_PER_RANK / threads_per_rank wins
        assert thread_pools(policy, 2, 2, override=3) == (3, 2)
    with pytest.raises(ValueError, match="HVDK8S_THREAD_POLICY='fast': expected one of tf, split"):
        thread_pools("fast", 2, 2)


def test_thread_knobs_set_the_policy_and_leave_the_thread_count_to_the_ranks() -> None:
    tf_spin, split = knobs.KNOBS["threads_tf_spin"], knobs.KNOBS["threads_split-intra"]
    assert tf_spin.env == {"HVDK8S_THREAD_POLICY": "tf"} and tf_spin.mca == {"mpi_yield_when_idle": "0"} and tf_spin.thread_policy == "tf"
    assert split.mca == {} and "yield when idle" in split.what
    assert {k for k in knobs.KNOBS if k.startswith("threads_")} == {
        f"threads_{p}{s}" for p in ("tf", "split", "split-intra", "split+1") for s in ("", "_spin")}
    env = launch.base_env(None)
    assert "HVDK8S_THREADS_PER_RANK" not in env and "OMP_NUM_THREADS" not in env
    assert launch.base_env(1)["HVDK8S_THREADS_PER_RANK"] == "1"


def test_synthetic_scripts_run_the_same_steps_and_alternate_which_goes_first() -> None:
    from hvdk8s.benchmarks.config import synthetic

    assert synthetic.model_of("horovod-synthetic:ResNet50") == "ResNet50" and synthetic.model_of("cnn") is None
    with pytest.raises(ValueError, match="horovod-synthetic:<a keras.applications model"):
        synthetic.model_of("horovod-synthetic:resnet-50")
    raw = synthetic.script_args("raw", "ResNet50", 5, 3)
    fit = synthetic.script_args("hvdk8s", "ResNet50", 5, 3)
    opt = lambda argv, flag: int(argv[argv.index(flag) + 1])  # noqa: E731
    assert opt(raw, "--batch-size") == opt(fit, "--batch-size") == 4 and "--no-cuda" in raw and "--no-cuda" in fit
    # raw: first_batch step + warm-up batches + timed iterations; Keras: warm-up epoch + timed epochs
    assert 1 + opt(raw, "--num-warmup-batches") + opt(raw, "--num-iters") * 5 == opt(fit, "--num-iters") * 5 == 20
    s = preset("quick", workloads=("cnn", "horovod-synthetic:MobileNetV2"), synthetic_rounds=2, ranks=(1, 2))
    assert s.suite_workloads == ("cnn",) and s.synthetic_models == ("MobileNetV2",)
    # at N=2 also the raw loop at hvdk8s's thread split; at N=1 the split is TensorFlow's own pool
    assert suite.synthetic_configs(s) == [(0, 1, "MobileNetV2", "raw"), (0, 1, "MobileNetV2", "hvdk8s"),
                                          (0, 2, "MobileNetV2", "raw"), (0, 2, "MobileNetV2", "raw_split"),
                                          (0, 2, "MobileNetV2", "hvdk8s"),
                                          (1, 1, "MobileNetV2", "hvdk8s"), (1, 1, "MobileNetV2", "raw"),
                                          (1, 2, "MobileNetV2", "hvdk8s"), (1, 2, "MobileNetV2", "raw_split"),
                                          (1, 2, "MobileNetV2", "raw")]
    only = preset("quick", workloads=("horovod-synthetic:ResNet50",), knobs=("threads_tf",), knob_rounds=1, emulated_rates=())
    assert suite.training_configs(only) == []  # no suite workload: no training launches
    assert suite.job_count(only, emulated=False) == len(suite.synthetic_configs(only)) + 3 + 2 * 2  # + allreduce + 2 knobs x 2 scripts
    # Horovod's own scripts beside the suite's, each next to its counterpart; the knob study runs only the suite's
    peer = dataclasses.replace(only, synthetic_rounds=2, ranks=(1,), synthetic_peer="/horovod/examples/tensorflow2")
    assert [which for _r, _n, _m, which in suite.synthetic_configs(peer)] == [
        "raw", "horovod_raw", "hvdk8s", "horovod_keras", "horovod_keras", "hvdk8s", "horovod_raw", "raw"]
    assert [which for _r, _n, _m, which in suite.synthetic_configs(dataclasses.replace(peer, ranks=(2,)))][:5] == [
        "raw", "horovod_raw", "raw_split", "hvdk8s", "horovod_keras"]  # Horovod's raw script has no split twin
    assert suite.knob_synthetic_configs(peer, 0) == [("ResNet50", "raw"), ("ResNet50", "hvdk8s")]
    with pytest.raises(ValueError, match="synthetic_peer: 'x': no horovod-synthetic:<Model> workload in workloads"):
        preset("quick", workloads=("cnn",), synthetic_peer="x")


def test_synthetic_modules_take_horovods_flags_and_the_loop_a_thread_count() -> None:
    from hvdk8s.benchmarks.config import synthetic
    from hvdk8s.threads import DEFAULT_CPU_THREAD_POLICY, thread_pools

    loop = synthetic.parser(loop=True).parse_args([*synthetic.script_args("raw", "ResNet50", 5, 3), "--intra-op-threads", "1"])
    fit = synthetic.parser(loop=False).parse_args(synthetic.script_args("hvdk8s", "ResNet50", 5, 3))
    assert (loop.model, loop.batch_size, loop.num_warmup_batches, loop.num_iters, loop.no_cuda, loop.intra_op_threads) == (
        "ResNet50", 4, 4, 3, True, 1)
    # raw_split: the loop with hvdk8s's default intra-op share of the host's cores, as hvdk8s.init gives its ranks
    split = lambda cores, n: synthetic.parser(loop=True).parse_args(  # noqa: E731
        synthetic.script_args("raw_split", "ResNet50", 5, 3, cores, n)).intra_op_threads
    assert (split(2, 2), split(16, 4), split(3, 8), split(8, 1)) == (1, 4, 1, 8)
    assert split(16, 4) == thread_pools(DEFAULT_CPU_THREAD_POLICY, 16, 4)[0]
    assert "--intra-op-threads" not in synthetic.script_args("raw", "ResNet50", 5, 3, 16, 4)
    assert (fit.model, fit.num_batches_per_iter, fit.num_iters) == ("ResNet50", 5, 4)
    assert synthetic.parser(loop=True).parse_args([]).intra_op_threads == 0  # TensorFlow's default pool
    assert synthetic.iteration_line(2, 7.0184, "CPU") == "Iter #2: 7.018 img/sec per CPU"
    assert synthetic.summary_lines([1.0, 3.0], 2, "CPU") == ["Img/sec per CPU: 2.000 +-1.960", "Total img/sec on 2 CPU(s): 4.000 +-3.920"]


def test_synthetic_rates_are_rank_zeros_timed_iterations() -> None:
    from hvdk8s.benchmarks.config import synthetic

    # as mpirun tags it, a line's tag sometimes landing after its text when the output arrived in pieces
    log = ("[1,0]<stdout>:Iter #0: 0.334 img/sec per CPU\n[1,1]<stderr>:a warning\n"
           "[1,0]<stdout>:Iter #1: 3.273 img/sec per CPU[1,0]<stdout>:\n[1,0]<stdout>:Iter #2: 2.702 img/sec per CPU\n")
    assert synthetic.iter_rates(log, "hvdk8s", 2) == [3.273, 2.702]  # the Keras version's epoch 0 is its warm-up
    assert synthetic.iter_rates(log, "horovod_keras", 2) == [3.273, 2.702]
    two = "Iter #0: 5.950 img/sec per CPU\nIter #1: 7.0 img/sec per CPU\n"  # Horovod's own scripts print one decimal
    assert synthetic.iter_rates(two, "raw", 2) == synthetic.iter_rates(two, "horovod_raw", 2) == [5.95, 7.0]
    with pytest.raises(ValueError, match="synthetic_loop: expected 3 timed iterations in its output, found 2"):
        synthetic.iter_rates(two, "raw", 3)
    with pytest.raises(ValueError, match="tensorflow2_synthetic_benchmark.py: expected 3 timed iterations"):
        synthetic.iter_rates(two, "horovod_raw", 3)


def test_horovods_scripts_refused_naming_the_file_where_they_cannot_run_as_ported(tmp_path: Path) -> None:
    from hvdk8s.benchmarks.config import synthetic

    with pytest.raises(ValueError, match=r"cannot read Horovod's tensorflow2_synthetic_benchmark.py in .*expected Horovod's examples"):
        synthetic.peer_sources(tmp_path)
    (tmp_path / "tensorflow2_synthetic_benchmark.py").write_text("grads = tape.gradient(loss, model.trainable_variables)\n")
    (tmp_path / "tensorflow2_keras_synthetic_benchmark.py").write_text("import horovod.tensorflow.keras as hvd\n")
    with pytest.raises(ValueError, match=r"tensorflow2_synthetic_benchmark.py: expected `opt.variables\(\)` once .*found it 0 times"):
        synthetic.peer_sources(tmp_path)
    (tmp_path / "tensorflow2_synthetic_benchmark.py").write_text("g = tape.gradient(loss, model.trainable_variables)\nopt.variables()\n")
    sources = synthetic.peer_sources(tmp_path)
    assert sources["horovod_raw"] == "g = tape.gradient(loss, [v.value for v in model.trainable_variables])\nopt.variables\n"
    assert sources["horovod_keras"] == "import hvdk8s as hvd\n"  # as hvdk8s migrate ports it


def _synthetic_run(section: str, knob: str, script: str, n: int, r: int, rates: list[float]) -> dict:
    return {"section": section, "knob": knob, "model": "ResNet50", "script": script, "workers": n, "round": r,
            "batch_per_rank": 4, "iter_img_per_s_per_rank": rates}


def test_synthetic_ratio_per_round_then_min_max_and_knobs_against_the_same_rounds_baseline() -> None:
    raw = [
        _synthetic_run("synthetic", "baseline", "raw", 2, 0, [2.0, 1.0, 2.0]), _synthetic_run("synthetic", "baseline", "hvdk8s", 2, 0, [2.2]),
        _synthetic_run("synthetic", "baseline", "raw", 2, 1, [1.0]), _synthetic_run("synthetic", "baseline", "hvdk8s", 2, 1, [0.9]),
        _synthetic_run("knobs", "baseline", "raw", 2, 0, [2.0]), _synthetic_run("knobs", "baseline", "hvdk8s", 2, 0, [1.0]),
        _synthetic_run("knobs", "threads_tf", "raw", 2, 0, [2.0]), _synthetic_run("knobs", "threads_tf", "hvdk8s", 2, 0, [1.5]),
    ]
    rows = {(r["section"], r["knob"]): r for r in analysis.synthetic(raw)}
    main = rows[("synthetic", "baseline")]
    assert main["raw"]["min"] == 1.0 and main["raw"]["max"] == 2.0 and main["raw"]["n"] == 2  # per launch: median of its iterations
    assert main["hvdk8s_over_raw"]["min"] == pytest.approx(0.9) and main["hvdk8s_over_raw"]["max"] == pytest.approx(1.1)
    tf_knob = rows[("knobs", "threads_tf")]
    assert tf_knob["hvdk8s_vs_baseline"]["median"] == 1.5 and tf_knob["raw_vs_baseline"]["median"] == 1.0
    assert tf_knob["hvdk8s_over_raw"]["median"] == 0.75
    assert report.over_launches(main["hvdk8s_over_raw"]) == "1 [0.9–1.1] (2)"
    assert not any("peer" in key for row in rows.values() for key in row)  # no Horovod scripts, no comparison


def test_synthetic_headline_is_hvdk8s_at_equal_threads_then_the_thread_splits_own_gain() -> None:
    raw = [_synthetic_run("synthetic", "baseline", which, n, r, [rate]) for which, n, r, rate in [
        ("raw", 1, 0, 2.0), ("hvdk8s", 1, 0, 2.1), ("raw", 1, 1, 2.0), ("hvdk8s", 1, 1, 1.9),
        ("raw", 2, 0, 1.0), ("raw_split", 2, 0, 1.2), ("hvdk8s", 2, 0, 1.26),
        ("raw", 2, 1, 1.0), ("raw_split", 2, 1, 1.25), ("hvdk8s", 2, 1, 1.25)]]
    rows = {r["workers"]: r for r in analysis.synthetic(raw)}
    two = rows[2]
    assert two["hvdk8s_over_raw_split"]["min"] == pytest.approx(1.0) and two["hvdk8s_over_raw_split"]["max"] == pytest.approx(1.05)
    assert two["raw_split_over_raw"]["median"] == pytest.approx(1.225) and two["hvdk8s_over_raw"]["max"] == pytest.approx(1.26)
    assert "raw_split_over_raw" not in rows[1]  # no split launch at N=1
    # equal threads: over the split launch at N=2; at N=1 over the loop's one launch (the split is TensorFlow's pool)
    assert report.synthetic_equal_threads(two) is two["hvdk8s_over_raw_split"]
    assert report.synthetic_equal_threads(rows[1]) is rows[1]["hvdk8s_over_raw"]
    old = {**two}
    del old["hvdk8s_over_raw_split"]
    assert report.synthetic_equal_threads(old) is None  # a run without the split launch has no N=2 equal-thread ratio
    section = report._synthetic_section(list(rows.values()), {"synthetic_iters": 1, "synthetic_batches_per_iter": 3,
                                                               "synthetic_peer": ""}, {})
    assert "| ResNet50 | 4 | 2 | 1.02 [1–1.05] (2) | 1.23 [1.2–1.25] (2) | 1.25 [1.25–1.26] (2) |" in section
    assert "| ResNet50 | 4 | 1 | 1 [0.95–1.05] (2) | – | 1 [0.95–1.05] (2) |" in section
    derived = {"ratios": {"paired": [], "rounds": [], "time_to_accuracy": []}, "emulated": {},
               "synthetic": list(rows.values())}
    summary = report._ratio_section(derived)
    headline, gain = summary.index("| horovod-synthetic:ResNet50 | Horovod's scripts, separate launches, equal threads | "
                                   "1 [0.95–1.05] (2) | 1.02 [1–1.05] (2) |"), summary.index("The thread policy's own gain")
    assert headline < gain and "| horovod-synthetic:ResNet50 | 1.23 [1.2–1.25] (2) |" in summary[gain:]


def test_the_suites_synthetic_scripts_are_compared_with_horovods_per_round_and_over_all_iterations() -> None:
    raw = [_synthetic_run("synthetic", "baseline", which, 1, r, rates) for which, r, rates in [
        ("raw", 0, [2.0, 2.2]), ("horovod_raw", 0, [2.0, 2.0]), ("raw", 1, [1.0]), ("horovod_raw", 1, [1.25]),
        ("hvdk8s", 0, [4.0]), ("horovod_keras", 0, [2.0]), ("hvdk8s", 1, [4.2]), ("horovod_keras", 1, [2.1])]]
    [row] = analysis.synthetic(raw)
    assert row["raw_over_peer"]["min"] == pytest.approx(0.8) and row["raw_over_peer"]["max"] == pytest.approx(1.05)
    assert row["raw_agrees_with_peer"] is True and row["hvdk8s_agrees_with_peer"] is False  # twice the rate: not the same work
    lines = report._synthetic_section([row], {"synthetic_iters": 2, "synthetic_batches_per_iter": 3, "synthetic_peer": "x"}, {}).splitlines()
    assert "| ResNet50 | 1 | 0.925 [0.8–1.05] (2) | yes | 2 [2–2] (2) | no |" in lines
    assert any("`python -m hvdk8s.benchmarks.workers.synthetic_loop`" in line for line in lines)


@pytest.mark.parametrize(("ours", "peer", "same"), [
    ([10.0, 11.0, 12.0], [12.4, 13.0, 14.0], True),  # medians 11 and 13: within 25%
    ([5.0, 10.0, 11.0], [14.0, 15.0, 16.0], False),  # medians 10 and 15: 1.5x, ranges apart
    ([5.0, 10.0, 14.5], [14.0, 15.0, 16.0], True),  # 1.5x, but a slow spell in both reaches the other's range
    ([20.0, 21.0, 22.0], [10.0, 10.5, 11.0], False),  # twice as fast, steady: not the same benchmark
])
def test_two_scripts_agree_when_medians_are_close_or_their_ranges_overlap(ours: list[float], peer: list[float], same: bool) -> None:
    assert analysis.agrees(ours, peer) is same and analysis.agrees(peer, ours) is same


def test_presets_state_their_job_counts_and_brief_is_the_headline_only() -> None:
    brief = PRESETS["brief"]
    # N=1,2 x 3 rounds of hvdk8s (raw loop alternating), the raw loop at both thread pools at N=2 x 3 rounds, allreduce
    assert suite.job_count(brief, emulated=False) == 2 * 3 + 2 * 3 + 3
    assert brief.strategies == ("hvdk8s", "horovod_tfdefault", "horovod_split") and not brief.tta and brief.emulated_rates == ()
    quick = PRESETS["quick"]
    # the four strategies at N=1,2 and the thread policy's two at N=2, one launch each, + allreduce; no emulated links
    assert quick.emulated_rates == () and set(quick.strategies) == {"hvdk8s", "horovod", "tf_mwms", "tf_ps",
                                                                    "horovod_tfdefault", "horovod_split"}
    assert suite.job_count(quick, emulated=True) == (4 * 2 + 2) * 1 + 3 == 13
    text = " ".join(cli_help().split())
    assert "13 jobs (+1 with --profile), about 5–11 min" in text and "15 jobs" in text and "91 jobs" in text


def cli_help() -> str:
    return subprocess.run([sys.executable, "-m", "benchmarks", "--help"], cwd=REPO, capture_output=True, text=True, timeout=60).stdout


def test_headline_puts_emulated_links_and_horovods_scripts_beside_shared_memory_with_n1_beside_n2() -> None:
    one = {"n": 1, "median": 1.5, "q1": 1.5, "q3": 1.5, "min": 1.5, "max": 1.5, "spread": 0.0}
    two = {"n": 3, "median": 0.98, "q1": 0.97, "q3": 0.99, "min": 0.96, "max": 1.0, "spread": 0.04}
    d = {"ratios": {"paired": [{"workload": "mlp", "strategy": "hvdk8s", "workers": 1, "ratio": one},
                               {"workload": "mlp", "strategy": "hvdk8s", "workers": 2, "ratio": two}], "rounds": [],
                    "time_to_accuracy": []},
         "emulated": {"rates": [{"rate": "1gbit", "training_paired": [{"workload": "mlp", "strategy": "hvdk8s", "workers": 2, "ratio": two}]}]},
         "synthetic": [{"section": "synthetic", "knob": "baseline", "model": "ResNet50", "workers": 2, "hvdk8s_over_raw": one,
                        "hvdk8s_over_raw_split": two}]}
    lines = report._ratio_section(d).splitlines()
    assert "| workload | measured as | hvdk8s / raw loop, N=1 | hvdk8s / raw loop, N=2 |" in lines
    assert "| mlp | shared memory, alternating windows, equal threads | 1.5 (1) | 0.98 [0.96–1] (3) |" in lines
    assert "| mlp | emulated 1gbit links, alternating windows, equal threads | – | 0.98 [0.96–1] (3) |" in lines
    # over the raw loop at hvdk8s's thread split (equal threads), not over the loop at TensorFlow's defaults
    assert "| horovod-synthetic:ResNet50 | Horovod's scripts, separate launches, equal threads | – | 0.98 [0.96–1] (3) |" in lines


@pytest.mark.parametrize("content, why", [
    (None, "no such file"),
    (b"{\"raw\": [1,", "not JSON: Expecting value: line 1 column 12 (char 11)"),
    (b"\xff\xfe", "not UTF-8 text (byte 0)"),
    (b"{}", "not an hvdk8s bench results file (no 'raw' timings)"),
    (b"{\"raw\": {}}", "not a results file this hvdk8s bench can render (KeyError: "),
    (b"{\"raw\": 5}", "not an hvdk8s bench results file ('raw' is number 5, expected an object of timings by section"),
    (b"{\"raw\": []}", "not an hvdk8s bench results file ('raw' is a list, expected an object of timings by section"),
    (b"{\"raw\": null}", "not an hvdk8s bench results file ('raw' is null, expected an object"),
    (b"{\"raw\": {\"emulated\": 5}}", "not a results file this hvdk8s bench can render (AttributeError: "),
])
def test_report_only_refuses_a_file_that_is_not_a_results_file_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                                         content: bytes | None, why: str) -> None:
    results = tmp_path / "results.json"
    if content is not None:
        results.write_bytes(content)
    assert cli.main(["--report-only", str(results)]) == 2
    assert capsys.readouterr().err.startswith(f"hvdk8s bench: error: --report-only {results}: {why}")


def test_report_only_rewrites_the_report_and_the_results_files_derived_summaries(tmp_path: Path) -> None:
    committed = json.loads((Path(__file__).parents[1] / "benchmarks/reports/example/results.json").read_text())
    stale = {**committed, "derived": {"stale": True}}
    (path := tmp_path / "results.json").write_text(json.dumps(stale))
    assert cli.main(["--report-only", str(path)]) == 0
    assert json.loads(path.read_text())["derived"] == committed["derived"]
    assert (tmp_path / "report.md").read_text() == report.render(committed)


def test_report_only_with_out_writes_there_and_leaves_the_results_file_as_it_is(tmp_path: Path) -> None:
    committed = json.loads((Path(__file__).parents[1] / "benchmarks/reports/example/results.json").read_text())
    (source := tmp_path / "run" / "results.json").parent.mkdir()
    source.write_text(text := json.dumps({**committed, "derived": {"stale": True}}))
    out = tmp_path / "rerendered"
    assert cli.main(["--report-only", str(source), "--out", str(out)]) == 0
    assert source.read_text() == text and sorted(p.name for p in source.parent.iterdir()) == ["results.json"]
    assert json.loads((out / "results.json").read_text())["derived"] == committed["derived"]
    assert (out / "report.md").read_text() == report.render(committed)
