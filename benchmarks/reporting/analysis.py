"""Everything the report prints, derived from the raw timings by pure functions.

``derive(raw)`` is deterministic: the suite stores its output beside the raw
data and a test recomputes it, so every summary provably comes from a run.
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from ..config.settings import THREAD_STRATEGIES
from ..config.synthetic import PEER_OF, SPLIT
from . import costmodel
from .stats import summary

REFERENCE = "horovod"  # the raw horovod.tensorflow loop every ratio is taken against
# Synthetic scripts' per-round ratios, as ``<a>_over_<b>``: hvdk8s over the raw loop as a user runs it, hvdk8s over
# the loop at its own thread split (equal threads), and the split's own gain on the loop
SCRIPT_RATIOS = (("hvdk8s", "raw"), ("hvdk8s", SPLIT), (SPLIT, "raw"))
PEER_TOLERANCE = 0.25  # ``agrees``: how far apart two synthetic scripts' median rates may be and still agree


def busbw_factor(n: int) -> float:
    """Bytes each rank moves per byte reduced in a ring allreduce (nccl-tests' busbw convention)."""
    return 2 * (n - 1) / n


def training(raw: list[dict[str, Any]]) -> dict[str, Any]:
    """Throughput, E(N) and time to accuracy per (workload, strategy, N), over every window of every round."""
    windows: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    meta: dict[tuple[str, str, int], dict[str, Any]] = {}
    tta: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for run in raw:
        res = run["result"]
        for w in res["throughput"]:
            key = (w["workload"], run["strategy"], run["workers"])
            windows[key] += [w["examples_per_window"] / s for s in w["window_seconds"]]
            meta[key] = {k: w[k] for k in ("description", "params", "gradient_bytes", "batch_per_rank", "steps_per_window")}
        if "time_to_accuracy" in res:
            tta[(run["strategy"], run["workers"])].append(res["time_to_accuracy"])
    rows = []
    for (workload, strategy, n), values in sorted(windows.items()):
        s = summary(values)
        single = windows.get((workload, "single", 1))
        own = windows.get((workload, strategy, 1))
        rows.append(
            {
                "workload": workload,
                "strategy": strategy,
                "workers": n,
                **meta[(workload, strategy, n)],
                "examples_per_s": s,
                "efficiency_vs_single": s["median"] / (n * statistics.median(single)) if single else None,
                "efficiency_vs_own_n1": s["median"] / (n * statistics.median(own)) if own else None,
            }
        )
    tta_rows = []
    for (strategy, n), runs in sorted(tta.items()):
        reached = [r["seconds_to_target"] for r in runs if r["seconds_to_target"] is not None]
        finals = [r["curve"][-1] for r in runs]
        tta_rows.append(
            {
                "strategy": strategy,
                "workers": n,
                "target": runs[0]["target"],
                "lr": runs[0]["lr"],
                "runs": len(runs),
                "reached": len(reached),
                "seconds_to_target": summary(reached) if reached else None,
                "epochs_to_target": summary([r["epochs_to_target"] for r in runs if r["epochs_to_target"]]) if reached else None,
                "final_accuracy": summary([c["test_accuracy"] for c in finals]),
                # whole batches only: each epoch trains steps x batch x workers examples, not the full set
                "examples_per_s": summary([tta_rate(r) for r in runs]),
            }
        )
    return {"throughput": rows, "time_to_accuracy": tta_rows}


def _median_rate(w: dict[str, Any], key: str = "window_seconds") -> float:
    return w["examples_per_window"] / statistics.median(w[key])


def ratios(raw: list[dict[str, Any]]) -> dict[str, Any]:
    """Throughput relative to the raw Horovod loop, one ratio per launch, summarised over launches.

    ``paired``: an hvdk8s strategy's windows over the raw loop's windows that alternated
    with them in the same process (the precise one: same launch, same load). ``rounds``:
    each strategy's launch over the raw loop's launch of the same round.
    ``time_to_accuracy``: the same per-round ratio for the time-to-accuracy rate;
    ``time_to_accuracy_paired``: hvdk8s's over the raw loop's epochs that
    alternated with its own in the same launch (same epochs, same load).
    ``thread_policy`` (where measured): the raw loop at hvdk8s's thread split over the raw loop at
    TensorFlow's default pools, launch over launch of the same round: the thread policy's own gain.
    """
    paired: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    tta_paired: dict[int, list[float]] = defaultdict(list)
    tta: dict[tuple[str, int, int], float] = {}
    for run in raw:
        n, strategy, r = run["workers"], run["strategy"], run["round"]
        for w in run["result"]["throughput"]:
            if w.get("paired_raw_window_seconds"):
                paired[(w["workload"], strategy, n)].append(_median_rate(w) / _median_rate(w, "paired_raw_window_seconds"))
        if "time_to_accuracy" in run["result"]:
            t = run["result"]["time_to_accuracy"]
            tta[(strategy, n, r)] = tta_rate(t)
            if t.get("paired_raw_epoch_seconds"):
                tta_paired[n].append(sum(t["paired_raw_epoch_seconds"]) / t["curve"][-1]["train_seconds"])
    rates = launch_rates(raw)
    rounds = per_round_ratios(rates, REFERENCE)
    tf_default, split = THREAD_STRATEGIES
    threads = {(wl, n): v for (wl, st, n), v in per_round_ratios(rates, tf_default).items() if st == split}
    tta_rounds: dict[tuple[str, int], list[float]] = defaultdict(list)
    for (strategy, n, r), rate in sorted(tta.items()):
        ref = tta.get((REFERENCE, n, r))
        if ref and strategy != REFERENCE:
            tta_rounds[(strategy, n)].append(rate / ref)
    return {
        "paired": [{"strategy": st, "workload": wl, "workers": n, "ratio": summary(v)} for (wl, st, n), v in sorted(paired.items())],
        "rounds": [{"workload": wl, "strategy": st, "workers": n, "ratio": summary(v)} for (wl, st, n), v in sorted(rounds.items())],
        "time_to_accuracy": [{"strategy": st, "workers": n, "ratio": summary(v)} for (st, n), v in sorted(tta_rounds.items())],
        # only where measured: results from before the pairing derive as they did
        **({"time_to_accuracy_paired": [{"workers": n, "ratio": summary(v)} for n, v in sorted(tta_paired.items())]}
           if tta_paired else {}),
        **({"thread_policy": [{"workload": wl, "workers": n, "ratio": summary(v)} for (wl, n), v in sorted(threads.items())]}
           if threads else {}),
    }


def tta_rate(run: dict[str, Any]) -> float:
    """Examples per training second over a whole time-to-accuracy run."""
    last = run["curve"][-1]
    return epoch_examples(run) * last["epoch"] / last["train_seconds"]


def stack_label(stack: dict[str, str]) -> str:
    """``TensorFlow 2.18.1, Keras 3.8.0``: the stack a launch ran (its worker's ``stack``)."""
    return f"TensorFlow {stack['tensorflow']}, Keras {stack['keras']}"


def knob_study(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each knob's hvdk8s and raw-loop rates over the baseline's in the same round (per workload), and its
    launches' hvdk8s/raw-loop ratio. Where the launches recorded their stack (results since stack knobs):
    ``stack``, the TensorFlow/Keras they ran, and ``baseline_hvdk8s_over_raw``, the baseline launches'
    hvdk8s/raw-loop ratio in the same rounds, to put beside the knob's (another stack's, for a stack knob)."""
    rates: dict[tuple[str, str, int], dict[str, float]] = {}
    stacks: dict[str, set[str]] = defaultdict(set)
    for run in raw:
        if "stack" in run["result"]:
            stacks[run["knob"]].add(stack_label(run["result"]["stack"]))
        for w in run["result"]["throughput"]:
            rates[(run["knob"], w["workload"], run["round"])] = {
                "hvdk8s": _median_rate(w), "horovod": _median_rate(w, "paired_raw_window_seconds"),
            }
    rows: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for (knob, workload, r), rate in rates.items():
        base = rates.get(("baseline", workload, r))
        if base:
            for who in rate:
                rows[(knob, workload)][who].append(rate[who] / base[who])
            rows[(knob, workload)]["hvdk8s_over_raw"].append(rate["hvdk8s"] / rate["horovod"])
            if stacks:  # only where recorded: results from before stack knobs derive as they did
                rows[(knob, workload)]["baseline_hvdk8s_over_raw"].append(base["hvdk8s"] / base["horovod"])
    return [{"knob": k, "workload": wl, **({"stack": "; ".join(sorted(stacks[k])) or None} if stacks else {}),
             **{who: summary(v) for who, v in d.items()}} for (k, wl), d in rows.items()]


def profile(raw: dict[str, Any] | None) -> dict[str, Any] | None:
    """Median seconds per step of every phase, and the derived waits (see ``profiling``)."""
    if not raw:
        return None
    out = []
    for p in raw["result"]["profile"]:
        t = {k: statistics.median(v) for k, v in p["seconds_per_step"].items()}
        optimizer = {"raw": t["optimizer"], "hvdk8s": t["hvdk8s_optimizer"]}
        compute = {who: t["input"] + t["forward_backward"] + optimizer[who] for who in optimizer}
        compiled = t["hvdk8s_train_step"]
        row = {
            "workload": p["workload"],
            "params": p["params"],
            "phases": t,
            "raw": {"step": t["raw_step"], "optimizer": optimizer["raw"], "allreduce_wait": t["raw_step"] - compute["raw"],
                    "step_call": None, "callbacks": None, "total": t["raw_step"]},
            "hvdk8s": {"step": t["hvdk8s_step"], "optimizer": optimizer["hvdk8s"], "allreduce_wait": compiled - compute["hvdk8s"],
                       "step_call": t["hvdk8s_step"] - compiled,
                       "callbacks": t["hvdk8s_fit"] - t["hvdk8s_step"], "total": t["hvdk8s_fit"]},
        }
        if "timeline" in p:
            row["overlap"] = overlap(p["timeline"]["spans"])
            steps = row["overlap"][1:] or row["overlap"]  # the first step may start before the timeline did
            row["overlap_summary"] = {
                "steps": len(steps),
                "overlapped_steps": sum(o["first_reduce_start_s"] < o["last_submit_s"] for o in steps),
                **{k: summary([o[k] for o in steps]) for k in ("tensors", "last_submit_s", "first_reduce_start_s",
                                                                "comm_after_last_submit_s")},
            }
        out.append(row)
    return {"workloads": out}


GRADIENT_TENSOR = "Distributed"  # DistributedOptimizer names its gradient allreduces Distributed<Optimizer>.<k>; metric averages differ


def overlap(spans: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Per step, from a Horovod timeline: when the last gradient was submitted (its negotiation began)
    and when reductions ran, in seconds from the step's first submission. A reduction that starts before
    the last submission overlaps backprop."""
    grads = [sp for sp in spans if GRADIENT_TENSOR in sp["tensor"] and sp["depth"] == 0]
    per_tensor: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for sp in sorted(grads, key=lambda x: x["start_us"]):
        per_tensor[(sp["tensor"], sp["activity"])].append(sp)
    steps = min((len(v) for v in per_tensor.values()), default=0)
    out = []
    for k in range(steps):
        neg = [v[k] for (t, a), v in per_tensor.items() if a.startswith("NEGOTIATE")]
        red = [v[k] for (t, a), v in per_tensor.items() if not a.startswith("NEGOTIATE")]
        if not neg or not red:
            continue
        t0 = min(sp["start_us"] for sp in neg)
        last_submit = max(sp["start_us"] for sp in neg)
        out.append({
            "tensors": len(neg),
            "last_submit_s": (last_submit - t0) / 1e6,
            "first_reduce_start_s": (min(sp["start_us"] for sp in red) - t0) / 1e6,
            "last_reduce_end_s": (max(sp["end_us"] for sp in red) - t0) / 1e6,
            "comm_after_last_submit_s": (max(sp["end_us"] for sp in red) - last_submit) / 1e6,
        })
    return out


def launch_rates(raw: list[dict[str, Any]]) -> dict[tuple[str, str, int, int], float]:
    """Each launch's median window rate, keyed (workload, strategy, N, round)."""
    return {(w["workload"], run["strategy"], run["workers"], run["round"]): _median_rate(w)
            for run in raw for w in run["result"]["throughput"]}


def per_round_ratios(rates: dict[tuple[str, str, int, int], float], reference: str) -> dict[tuple[str, str, int], list[float]]:
    """Each strategy's launch rate over ``reference``'s launch of the same round, workload and N, by (workload, strategy, N)."""
    out: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    for (workload, strategy, n, r), rate in sorted(rates.items()):
        ref = rates.get((workload, reference, n, r))
        if ref and strategy != reference:
            out[(workload, strategy, n)].append(rate / ref)
    return out


def with_ratio_to_hvdk8s(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Training rows with ``over_hvdk8s``: each launch's rate over hvdk8s's launch of the same round, summarised
    over rounds (None for hvdk8s itself and without an hvdk8s launch)."""
    over = per_round_ratios(launch_rates(raw), "hvdk8s")
    return [{**r, "over_hvdk8s": summary(v) if (v := over.get((r["workload"], r["strategy"], r["workers"]))) else None}
            for r in training(raw)["throughput"]]


def synthetic(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Horovod's synthetic benchmarks, per (section, knob, model, N): each script's per-launch img/s per rank (the
    median of its timed iterations) summarised over launches, the ``SCRIPT_RATIOS`` of launches of the same round,
    in the knob study each script's launch over the baseline's of the same round (``*_vs_baseline``), and where
    Horovod's own scripts ran (``synthetic_peer``) each of the suite's scripts over its peer's launch of the same round
    (``raw_over_peer``, ``hvdk8s_over_peer``) and whether they agree (``*_agrees_with_peer``, ``agrees``)."""
    rates: dict[tuple[str, str, str, int, int], dict[str, float]] = defaultdict(dict)
    pooled: dict[tuple[str, str, str, int], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    batch: dict[str, int] = {}
    for run in raw:
        key = (run["section"], run["knob"], run["model"], run["workers"], run["round"])
        rates[key][run["script"]] = statistics.median(run["iter_img_per_s_per_rank"])
        pooled[key[:4]][run["script"]] += run["iter_img_per_s_per_rank"]
        batch[run["model"]] = run["batch_per_rank"]
    rows: dict[tuple[str, str, str, int], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for (section, knob, model, n, r), rate in sorted(rates.items()):
        row = rows[(section, knob, model, n)]
        for who, v in rate.items():
            row[who].append(v)
            base = rates.get((section, "baseline", model, n, r), {}).get(who)
            if section == "knobs" and base:
                row[f"{who}_vs_baseline"].append(v / base)
        for ours, other in SCRIPT_RATIOS:
            if ours in rate and other in rate:
                row[f"{ours}_over_{other}"].append(rate[ours] / rate[other])
        for ours, peer in PEER_OF.items():
            if ours in rate and peer in rate:
                row[f"{ours}_over_peer"].append(rate[ours] / rate[peer])
    return [{"section": section, "knob": knob, "model": model, "workers": n, "batch_per_rank": batch[model],
             **{k: summary(v) for k, v in d.items()},
             **{f"{ours}_agrees_with_peer": agrees(its[ours], its[peer]) for ours, peer in PEER_OF.items()
                if (its := pooled[(section, knob, model, n)]).get(ours) and its.get(peer)}}
            for (section, knob, model, n), d in rows.items()]


def agrees(ours: list[float], peer: list[float], tolerance: float = PEER_TOLERANCE) -> bool:
    """Whether two scripts' per-iteration rates (every timed iteration of every launch, interleaved launches) say the
    same speed: their medians within ``tolerance`` of each other (the larger at most 1 + tolerance times the smaller),
    or their ranges [min, max] overlapping. Either is enough, so a load change between launches on a shared machine
    (which widens both ranges alike when the launches alternate) does not fail it; a script doing other work, a
    different model, image size or step, lands outside both when it costs more than the tolerance and the noise."""
    low, high = sorted((statistics.median(ours), statistics.median(peer)))
    return high <= (1 + tolerance) * low or (min(ours) <= max(peer) and min(peer) <= max(ours))


def allreduce(raw_runs: list[dict[str, Any]], memcopy: dict[str, Any] | None) -> dict[str, Any]:
    sweep, fusion = [], []
    for run in raw_runs:
        res = run["result"]
        n = res["ranks"]
        for p in res["sweep"]:
            t = summary(p["seconds_per_iter"])
            algbw = p["bytes"] / t["median"]
            sweep.append(
                {"fusion": run["fusion"], "workers": n, "bytes": p["bytes"], "seconds": t, "algbw_bytes_per_s": algbw,
                 "busbw_bytes_per_s": algbw * busbw_factor(n)}
            )
        for p in res["fusion"]:
            fusion.append(
                {"fusion": run["fusion"], "workers": n, "mode": p["mode"], "tensors": p["tensors"], "tensor_bytes": p["tensor_bytes"],
                 "seconds": summary(p["seconds_per_iter"])}
            )
    out: dict[str, Any] = {"sweep": sweep, "fusion": fusion, "fusion_pairs": fusion_pairs(fusion)}
    if memcopy:
        t = summary(memcopy["seconds"])
        out["memcopy"] = {"bytes": memcopy["bytes"], "seconds": t, "bytes_per_s": memcopy["bytes"] / t["median"]}
    return out


def fusion_pairs(fusion: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each (mode, tensors, size) with fusion on and off side by side, and off/on time ratio."""
    by_key: dict[tuple[str, int, int], dict[str, float]] = defaultdict(dict)
    for row in fusion:
        by_key[(row["mode"], row["tensors"], row["tensor_bytes"])][row["fusion"]] = row["seconds"]["median"]
    pairs = []
    for (mode, tensors, nbytes), t in sorted(by_key.items()):
        if "default" in t and "off" in t:
            pairs.append({"mode": mode, "tensors": tensors, "tensor_bytes": nbytes, "seconds_fusion_on": t["default"],
                          "seconds_fusion_off": t["off"], "off_over_on": t["off"] / t["default"]})
    return pairs


def _link(probe: dict[str, Any], rate_bits: float) -> dict[str, Any]:
    rtt = summary(probe["roundtrip_seconds"])
    per_direction = probe["bytes"] / probe["seconds"]
    return {"duplex_bytes_per_s_each_way": per_direction, "fraction_of_rate": per_direction * 8 / rate_bits, "roundtrip_s": rtt}


def emulated(raw: dict[str, Any]) -> dict[str, Any]:
    if raw.get("skipped"):
        return {"skipped": raw["skipped"], "rates": []}
    rates = []
    for r in raw["rates"]:
        ring = [
            {"workers": run["result"]["ranks"], "bytes": p["bytes"], "seconds": summary(p["seconds_per_iter"])}
            for run in r["ring"] for p in run["result"]["sweep"]
        ]
        ps = [
            {"workers": run["result"]["workers"], "servers": run["result"]["servers"], "bytes": p["bytes"], "seconds": summary(p["seconds_per_round"])}
            for run in r["ps"] for p in run["result"]["sizes"]
        ]
        entry = {
            "rate": r["rate"],
            "rate_bits_per_s": r["rate_bits_per_s"],
            "link": _link(r["link"], r["rate_bits_per_s"]),
            "ring": ring,
            "ps": ps,
            "training": with_ratio_to_hvdk8s(r["training"]) if r.get("training") else [],
            "training_paired": ratios(r["training"])["paired"] if r.get("training") else [],
        }
        if ring:
            entry["ring_fit"] = costmodel.fit_ring([{"workers": p["workers"], "bytes": p["bytes"], "seconds": p["seconds"]["median"]} for p in ring])
            entry["ring_fit"]["fraction_of_rate"] = entry["ring_fit"]["bandwidth_bytes_per_s"] * 8 / r["rate_bits_per_s"]
        if ps:
            entry["ps_fit"] = costmodel.fit_ps(
                [{"workers": p["workers"], "servers": p["servers"], "bytes": p["bytes"], "seconds": p["seconds"]["median"]} for p in ps]
            )
            entry["ps_fit"]["fraction_of_rate"] = entry["ps_fit"]["bandwidth_bytes_per_s"] * 8 / r["rate_bits_per_s"]
        rates.append(entry)
    return {"skipped": None, "rates": rates}


def model(ar: dict[str, Any]) -> dict[str, Any]:
    """Fits from the measurements (reported as measured, not extrapolated: a per-hop latency fitted on two
    oversubscribed cores is CPU scheduling), then the ideal-transport extrapolation with the measured H100 rates."""
    local_points = [
        {"workers": p["workers"], "bytes": p["bytes"], "seconds": p["seconds"]["median"]} for p in ar["sweep"] if p["fusion"] == "default"
    ]
    gpus = costmodel.gpus()
    return {
        "local_ring_fit": costmodel.fit_ring(local_points) if len(local_points) >= 2 else None,
        "networks": costmodel.NETWORKS,
        "models": costmodel.MODELS,
        "gpus": gpus,
        "ps_ratio": costmodel.PS_RATIO,
        "assumptions": costmodel.assumptions(gpus),
        "published": costmodel.PUBLISHED,
        "predictions": [row for gpu, spec in gpus.items() for row in costmodel.predict(gpu, spec["rates"])],
    }


def epoch_examples(run: dict[str, Any]) -> int:
    """Examples one time-to-accuracy epoch really trains on (all workers, whole batches)."""
    return run["steps_per_epoch_per_worker"] * run["batch_per_rank"] * run["workers"]


def derive(raw: dict[str, Any]) -> dict[str, Any]:
    ar = allreduce(raw.get("allreduce", []), raw.get("memcopy"))
    emu = emulated(raw.get("emulated", {"skipped": "not run"}))
    return {
        "training": training(raw.get("training", [])),
        "ratios": ratios(raw.get("training", [])),
        "synthetic": synthetic(raw.get("synthetic", [])),
        "profile": profile(raw.get("profile")),
        "knobs": knob_study(raw.get("knobs", [])),
        "allreduce": ar,
        "emulated": emu,
        "model": model(ar),
    }
