"""Markdown report and PNG plots, rendered from a results.json and nothing else.

Every number in a table is a value of the results file passed through one of
``FORMATTERS`` (a test checks this), so the report can be re-rendered from
the JSON (``hvdk8s bench --report-only``) and cannot drift from it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from hvdk8s.common import atomic, figures

from ..config.settings import STRATEGY_LABELS
from .analysis import GRADIENT_TENSOR, PEER_TOLERANCE, busbw_factor
from .stats import summary

MEASURED = "measured on this machine"
MEASURED_CLUSTER = "measured on the cluster"  # a cluster run's results (``cluster_collect``: they have ``cluster``)
PREDICTION_WORKERS = (8, 64, 512)


# --- formatting: the only way numbers reach the report ---------------------------------------
def num(x: float | int | None) -> str:
    if x is None:
        return "–"
    ax = abs(x)
    if ax >= 1000:
        return f"{x:,.0f}"
    if ax >= 100 or float(x).is_integer():
        return f"{x:.0f}"
    if ax >= 10:
        return f"{x:.1f}"
    return f"{x:.3g}"


def pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.0f}%"


def nbytes(b: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= scale:
            return f"{b / scale:.3g}{unit}"
    return f"{b:.0f}B"


def gbit(bytes_per_s: float) -> str:
    return f"{bytes_per_s * 8 / 1e9:.3g}Gbit/s"


def gbyte(bytes_per_s: float) -> str:
    return f"{bytes_per_s / 1e9:.3g}GB/s"


def secs(x: float | None) -> str:
    if x is None:
        return "–"
    if abs(x) < 1e-3:
        return f"{x * 1e6:.3g}µs"
    if abs(x) < 1:
        return f"{x * 1e3:.3g}ms"
    return f"{x:.3g}s"


FORMATTERS = (num, pct, nbytes, gbit, gbyte, secs)


def spread(s: dict[str, Any] | None, fmt: Any = num) -> str:
    """``median [min–max]`` of a ``stats.summary``."""
    if not s:
        return "–"
    if s["n"] == 1:
        return fmt(s["median"])
    return f"{fmt(s['median'])} [{fmt(s['min'])}–{fmt(s['max'])}]"


def over_launches(s: dict[str, Any] | None, fmt: Any = num) -> str:
    """``median [min–max] (n)`` of a ``stats.summary`` of one value per launch: the whole range, not quartiles
    interpolated from a handful of launches."""
    if not s:
        return "–"
    if s["n"] == 1:
        return f"{fmt(s['median'])} (1)"
    return f"{fmt(s['median'])} [{fmt(s['min'])}–{fmt(s['max'])}] ({s['n']})"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def label(strategy: str) -> str:
    return STRATEGY_LABELS.get(strategy, strategy)


COLORS = dict(zip(STRATEGY_LABELS, ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:cyan",
                                     "tab:olive", "tab:pink", "tab:brown", "tab:gray", "gold"), strict=True))


# --- plots -------------------------------------------------------------------------------------
def plot_throughput(rows: list[dict[str, Any]], path: Path) -> None:
    plt = figures.pyplot()
    workloads = sorted({r["workload"] for r in rows})
    fig, axes = plt.subplots(2, len(workloads), figsize=(5.2 * len(workloads), 7), squeeze=False)
    for col, wl in enumerate(workloads):
        ax_t, ax_e = axes[0][col], axes[1][col]
        for strategy in STRATEGY_LABELS:
            pts = sorted((r["workers"], r) for r in rows if r["workload"] == wl and r["strategy"] == strategy)
            if not pts:
                continue
            ns = [n for n, _ in pts]
            med = [r["examples_per_s"]["median"] for _, r in pts]
            err = [[m - r["examples_per_s"]["min"] for m, (_, r) in zip(med, pts)], [r["examples_per_s"]["max"] - m for m, (_, r) in zip(med, pts)]]
            ax_t.errorbar(ns, med, yerr=err, marker="o", capsize=3, color=COLORS[strategy], label=label(strategy))
            eff = [r["efficiency_vs_single"] for _, r in pts]
            if all(e is not None for e in eff):
                ax_e.plot(ns, eff, marker="o", color=COLORS[strategy], label=label(strategy))
        ax_t.set_title(f"{wl}: throughput (median, min–max)")
        ax_t.set_xlabel("workers N")
        ax_t.set_ylabel("examples / s")
        ax_e.axhline(1.0, color="grey", lw=0.8, ls=":")
        ax_e.set_title(f"{wl}: E(N) vs single process")
        ax_e.set_xlabel("workers N")
        ax_e.set_ylabel("efficiency")
        for ax in (ax_t, ax_e):
            ax.set_xticks(sorted({r["workers"] for r in rows}))
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    figures.save_figure(fig, path, dpi=80)


def plot_tta(raw_training: list[dict[str, Any]], path: Path) -> None:
    plt = figures.pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for run in raw_training:
        tta = run["result"].get("time_to_accuracy")
        if not tta or run["round"] != 0:
            continue
        xs = [c["train_seconds"] for c in tta["curve"]]
        ys = [c["test_accuracy"] for c in tta["curve"]]
        ax.plot(xs, ys, marker=".", ls="-" if run["workers"] > 1 else ":", color=COLORS.get(run["strategy"]),
                label=f"{label(run['strategy'])} N={run['workers']}")
        target = tta["target"]
    if ax.lines:
        ax.axhline(target, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("training seconds (evaluation excluded)")
    ax.set_ylabel("test accuracy (digits)")
    ax.set_title("Time to accuracy, round 1 (dotted: N=1)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    figures.save_figure(fig, path, dpi=80)


def plot_busbw(ar: dict[str, Any], emu: dict[str, Any], path: Path) -> None:
    plt = figures.pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    pts = sorted((p["bytes"], p["busbw_bytes_per_s"]) for p in ar["sweep"] if p["fusion"] == "default")
    if pts:  # the fusion-off launches measure only the many-small-tensors case, not the size sweep
        n = next(p["workers"] for p in ar["sweep"])
        ax.plot([b for b, _ in pts], [v / 1e9 for _, v in pts], marker="o", label=f"Horovod allreduce N={n}, shared memory")
    for rate in emu.get("rates", []):
        for n in sorted({p["workers"] for p in rate["ring"]}):
            pts = sorted((p["bytes"], p["bytes"] / p["seconds"]["median"] * busbw_factor(n)) for p in rate["ring"] if p["workers"] == n)
            ax.plot([b for b, _ in pts], [v / 1e9 for _, v in pts], marker="s", ls="--", label=f"ring N={n}, emulated {rate['rate']}")
        ax.axhline(rate["rate_bits_per_s"] / 8 / 1e9, color="grey", lw=0.6, ls=":")
    if "memcopy" in ar:
        ax.axhline(ar["memcopy"]["bytes_per_s"] / 1e9, color="black", lw=1, ls="-.", label="numpy memory copy (1 thread)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title("Allreduce busbw = algbw x 2(N-1)/N (dotted: shaped link rates)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    fig.tight_layout()
    figures.save_figure(fig, path, dpi=80)


def plot_prediction(model: dict[str, Any], path: Path) -> None:
    plt = figures.pyplot()
    preds = [p for p in model["predictions"] if p["variant"] == "ideal transport"]
    models = list(model["models"])
    fig, grid = plt.subplots(2, 2, figsize=(10, 7.5))
    axes = list(grid.flat)
    colors = dict(zip(model["networks"], ("tab:blue", "tab:orange", "tab:green", "tab:red")))
    for ax, name in zip(axes, models):
        for net, color in colors.items():
            rows = sorted((p["workers"], p) for p in preds if p["model"] == name and p["network"] == net and p["gpu"] == "H100")
            ns = [n for n, _ in rows]
            ax.plot(ns, [p["ring_overlapped_efficiency"] for _, p in rows], color=color, marker=".", label=f"{net} ring, overlapped")
            ax.plot(ns, [p["ring_efficiency"] for _, p in rows], color=color, ls=":", label=f"{net} ring, no overlap")
            ax.plot(ns, [p["ps_efficiency"] for _, p in rows], color=color, ls="--", label=f"{net} PS")
        ax.set_title(f"{name}, H100 (measured rate), ideal transport (modelled)", fontsize=10)
    ax = axes[len(models)]
    for name, color in zip(("ResNet-101", "VGG-16"), ("tab:purple", "tab:brown")):
        rows = sorted((p["workers"], p) for p in preds if p["model"] == name and p["network"] == "25 GbE" and p["gpu"] == "P100")
        ns = [n for n, _ in rows]
        ax.plot(ns, [p["ring_overlapped_efficiency"] for _, p in rows], color=color, label=f"{name} ring, overlapped (model)")
        ax.plot(ns, [p["ring_efficiency"] for _, p in rows], color=color, ls=":", label=f"{name} ring, no overlap (model)")
        ax.plot(ns, [p["ps_efficiency"] for _, p in rows], color=color, ls="--", label=f"{name} PS (model)")
        for pub in model["published"]:
            if pub["model"] == name:
                ax.scatter([pub["workers"]], [pub["efficiency"]], color=color, marker="*" if pub["system"] == "Horovod" else "x",
                           s=90, zorder=3, label=f"published: {pub['system']}, {name}, N={pub['workers']}")
    ax.set_title("25 GbE, P100-era compute: model vs published", fontsize=10)
    for ax in axes[: len(models) + 1]:
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("workers N")
        ax.set_ylabel("scaling efficiency")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2 if ax is not axes[len(models)] else 1, loc="lower left")
    fig.tight_layout()
    figures.save_figure(fig, path, dpi=80)


def plot_timeline(profiles: list[dict[str, Any]], path: Path) -> None:
    """Horovod timeline rows (one per gradient allreduce) of the last two hvdk8s steps, per workload;
    a red line marks each step's last gradient submission."""
    plt = figures.pyplot()
    with_tl = [p for p in profiles if p.get("timeline")]
    fig, axes = plt.subplots(len(with_tl), 1, figsize=(10, 1.5 + 2.6 * len(with_tl)), squeeze=False)
    colors = {"NEGOTIATE_ALLREDUCE": "tab:gray", "ALLREDUCE": "tab:blue"}
    for ax, prof in zip(axes[:, 0], with_tl):
        spans = [sp for sp in prof["timeline"]["spans"] if GRADIENT_TENSOR in sp["tensor"] and sp["depth"] == 0]
        tensors = sorted({sp["tensor"] for sp in spans}, key=lambda t: (len(t), t))  # .2 before .10
        submits = sorted(sp["start_us"] for sp in spans if sp["activity"].startswith("NEGOTIATE"))
        steps = [submits[i:i + len(tensors)] for i in range(0, len(submits), len(tensors))][-2:]
        if not steps:
            continue
        t0 = steps[0][0]
        for row, tensor in enumerate(tensors):
            for sp in spans:
                if sp["tensor"] == tensor and sp["end_us"] >= t0:
                    ax.barh(row, (sp["end_us"] - sp["start_us"]) / 1e3, left=(sp["start_us"] - t0) / 1e3, height=0.6,
                            color=colors.get(sp["activity"], "tab:orange"))
        for step in steps:
            ax.axvline((step[-1] - t0) / 1e3, color="tab:red", ls="--", lw=1)
        ax.set_yticks(range(len(tensors)))
        ax.set_yticklabels([t.rsplit("/", 1)[-1] for t in tensors], fontsize=7)
        ax.set_xlabel("ms (Horovod timeline, rank 0)")
        ax.set_title(f"{prof['workload']}: gray = negotiation from the gradient's submission, blue = allreduce, "
                     "red = last gradient of the step submitted", fontsize=9)
        ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    figures.save_figure(fig, path, dpi=80)


# --- sections ------------------------------------------------------------------------------------
def _header(results: dict[str, Any]) -> str:
    """Title, run, machine (a cluster run's: its nodes, pods and GPUs) and the settings every worker shares."""
    env, s = results["environment"], results["settings"]
    cluster = results.get("cluster")
    jobs = [j["job"] for j in _all_jobs(results["raw"])]
    busy = [j["machine_busy_cores"] for j in jobs if j.get("machine_busy_cores") is not None]
    ours = [j["cpu_seconds"] / j["wall_seconds"] for j in jobs if j.get("cpu_seconds") is not None]
    lines = [
        "# hvdk8s benchmark report",
        "",
        f"Preset `{s['preset']}`, {results['started']} → {results.get('finished', 'unfinished')}, "
        f"command `{' '.join(env['command'])}`. Raw per-repeat timings: `results.json` (section `raw`); "
        "every table below is derived from them (section `derived`).",
        "",
        _cluster_line(cluster) if cluster else
        f"**Machine:** {env['cpu_count']} cores ({env['cpu_model']}), {env['memory_gib']} GiB, no GPU. "
        f"Load average at start {env['load_average_start']}, at end {env.get('load_average_end')}.",
    ]
    if busy and ours:
        machine, own = summary(busy), summary(ours)
        lines.append(
            f"While jobs ran the whole machine was busy on {num(machine['min'])}–{num(machine['max'])} cores "
            f"(median {num(machine['median'])}), this benchmark's own processes used "
            f"{num(own['min'])}–{num(own['max'])} cores: where the first exceeds the second, other processes shared the cores "
            "and absolute numbers are lower and noisier than on an idle machine. Compare strategies within this run "
            "(they were interleaved), not with other runs."
        )
    lines += [
        "",
        "Every worker gets the same per-rank batch, "
        f"{s['threads_per_rank']} TensorFlow intra-op thread(s), {s['warmup_steps']} warm-up steps and "
        f"{s['windows']} timed windows of {s['steps']} steps per model, {s.get('models', 1)} model(s) built one after "
        f"another per launch (their windows pooled), {s['rounds']} launch(es) per configuration. "
        "N counts data-parallel workers (processes)."
        + ("" if cluster else " " + (  # a local run's N is bounded by this machine's cores
            f"N goes up to {max(s['ranks'])} only: this machine has {env['cpu_count']} cores, and with "
            f"{s['threads_per_rank']} thread(s) per worker a larger N would oversubscribe them and measure contention, "
            "not scaling."
            if max(s["ranks"]) * s["threads_per_rank"] <= env["cpu_count"]
            else f"**Warning:** N={max(s['ranks'])} × {s['threads_per_rank']} thread(s) exceeds the {env['cpu_count']} "
            "cores: those rows measure oversubscription, not scaling."
        )),
    ]
    return "\n".join(lines)


def _cluster_line(c: dict[str, Any]) -> str:
    gpus = "; ".join(f"{model} on {num(len(on))} node(s)" for model, on in c["gpus"].items()) or "no GPU seen"
    nodes = ", ".join(c["nodes"]) or "not known (no pod reported its node)"
    return (f"**Cluster:** Kubernetes, {num(len(c['nodes']))} node(s) seen ({nodes}), {num(c['pods'])} "
            f"benchmark pods; GPUs: {gpus}.")


def _cluster_section(results: dict[str, Any]) -> str:
    """A cluster run's jobs, pods and nodes, and its allreduce beside the cost model's ring (``cluster_collect``)."""
    if "cluster" not in results:
        return ""
    c, raw = results["cluster"], results["raw"]
    ns = sorted({r["workers"] for r in raw["training"]})
    by_job: dict[str, list[dict[str, Any]]] = {}
    for p in raw["cluster"]["pods"]:
        by_job.setdefault(p["job"], []).append(p)
    out = [
        "## Cluster: jobs, pods and nodes (" + MEASURED_CLUSTER + ")",
        "",
        "Every configuration ran as its own Kubernetes job, one job at a time (`hvdk8s bench --cluster`): hvdk8s and the "
        "raw Horovod loop as MPI Operator MPIJobs (one rank per worker pod), MultiWorkerMirrored and parameter-server "
        "TensorFlow as Training Operator TFJobs (N Workers; the PS strategy with a Chief coordinator and one parameter "
        "server besides), all from the same image and job file with the same settings. N counts worker pods, one "
        f"process each: {', '.join(num(n) for n in ns) or '–'}. Each job's rank 0 (Chief, worker 0) wrote its "
        "record to its log, and each process whose log was kept its pod, node and GPUs (every rank of an MPIJob, "
        "the TFJob's Chief or worker 0).",
        "",
        table(["job", "task reporting: pod on node (GPUs)", "every pod on its node (as the API placed them)"],
              [[job, "; ".join(f"{p['task']}: {p['pod']} on {p.get('node') or '?'}"
                               f" ({', '.join(p.get('gpus') or []) or 'no GPU'})" for p in pods),
                ", ".join(f"{pod} on {node}" for pod, node in raw["cluster"]["placement"].get(job, {}).items())
                or "–"]
               for job, pods in by_job.items()]),
        "",
    ]
    if c["allreduce"]:
        out += [
            f"**Allreduce across the cluster**: Horovod allreduce (sum) of one float32 tensor, one rank per worker pod "
            f"(NCCL where the ranks have GPUs). busbw = bytes / time × 2(N−1)/N; predicted: the cost model's ring "
            f"(section 5) on {c['network']} ({c['network_note']}), no fixed per-call cost.",
            "",
            table(["N", "message", "time median [min–max]", "busbw measured", "busbw predicted", "measured / predicted"],
                  [[num(r["workers"]), nbytes(r["bytes"]), spread(r["seconds"], secs), gbyte(r["busbw_bytes_per_s"]),
                    gbyte(r["predicted_busbw_bytes_per_s"]), pct(r["measured_over_predicted"])] for r in c["allreduce"]]),
            "",
        ]
    return "\n".join(out)


def _all_jobs(raw: dict[str, Any]) -> list[dict[str, Any]]:
    jobs = list(raw.get("training", [])) + list(raw.get("allreduce", []))
    for rate in raw.get("emulated", {}).get("rates", []):
        jobs += rate["ring"] + rate["ps"] + rate.get("training", [])
    return jobs


def _training_section(d: dict[str, Any], measured: str = MEASURED) -> str:
    rows = d["throughput"]
    out = [
        "## 1. Training throughput and scaling efficiency (" + measured + ")",
        "",
        "E(N) = throughput(N) / (N × throughput of the baseline at N=1): against the single process (plain Keras fit), "
        "and against the same strategy at N=1 (its scaling alone). E(1) against the single process is the strategy's "
        "own overhead. Synthetic data, one fixed batch per rank. `hvdk8s` and `single` run Keras `model.fit`; `hvdk8s` "
        "with its default callbacks (state broadcast, metric averaging, Prometheus metrics, rank-0 progress bar), as users "
        "run it, so their per-batch cost is part of its numbers; the others "
        "are custom loops (one tf.function per step, like fit): Keras 3's fit fails under MultiWorkerMirroredStrategy "
        "(keras-team/keras#20585) and cannot drive a ParameterServerStrategy cluster. The PS strategy is asynchronous: "
        "workers never wait for each other, so its throughput is not comparable one-to-one with synchronous training "
        "(see section 2). TF PS at N workers also runs 1 parameter server and 1 coordinator process; the optimizer "
        "update runs in the parameter server, which at N=1 has the second core to itself, so its E(1) can exceed 100%.",
        "",
    ]
    for wl in sorted({r["workload"] for r in rows}):
        sel = [r for r in rows if r["workload"] == wl]
        first = sel[0]
        out += [
            f"**{wl}** — {first['description']}; {num(first['params'])} parameters ({nbytes(first['gradient_bytes'])} fp32 gradients), "
            f"batch {num(first['batch_per_rank'])} per worker.",
            "",
            table(
                ["strategy", "N", "examples/s median [min–max]", "E(N) vs single", "E(N) vs own N=1", "windows"],
                [[label(r["strategy"]), num(r["workers"]), spread(r["examples_per_s"]), pct(r["efficiency_vs_single"]),
                  pct(r["efficiency_vs_own_n1"]), num(r["examples_per_s"]["n"])] for r in sel],
            ),
            "",
        ]
    out += ["![throughput and efficiency](throughput.png)", ""]
    return "\n".join(out)


def _by_n(rows: list[dict[str, Any]], key: Any, ratio: str = "ratio") -> tuple[list[int], list[list[str]]]:
    """Rows keyed by ``key(row)`` with one column per N (``over_launches`` of ``row[ratio]``): N=1 beside N=2."""
    ns = sorted({r["workers"] for r in rows})
    cells: dict[tuple[str, ...], dict[int, str]] = {}
    for r in rows:
        cells.setdefault(key(r), {})[r["workers"]] = over_launches(r.get(ratio))
    return ns, [[*k, *[c.get(n, "–") for n in ns]] for k, c in cells.items()]


def _headline(d: dict[str, Any]) -> list[str]:
    """hvdk8s / raw loop wherever both ran: alternating windows (equal threads: one process) on this machine's shared
    memory and on every emulated link, then Horovod's synthetic scripts; one column per N."""
    rows = [{**p, "where": "shared memory, alternating windows, equal threads"} for p in d["ratios"]["paired"]
            if p["strategy"] == "hvdk8s"]
    for rate in d["emulated"].get("rates", []):
        rows += [{**p, "where": f"emulated {rate['rate']} links, alternating windows, equal threads"}
                 for p in rate.get("training_paired", []) if p["strategy"] == "hvdk8s"]
    rows += [{"workload": f"horovod-synthetic:{p['model']}", "workers": p["workers"], "ratio": synthetic_equal_threads(p),
              "where": "Horovod's scripts, separate launches, equal threads"} for p in d.get("synthetic", [])
             if p["section"] == "synthetic"]
    ns, table_rows = _by_n(rows, lambda r: (r["workload"], r["where"]))
    return [table(["workload", "measured as", *[f"hvdk8s / raw loop, N={n}" for n in ns]], table_rows)] if rows else []


def _thread_policy(rows: list[dict[str, Any]]) -> list[str]:
    """The thread policy's own gain (``analysis.ratios``' ``thread_policy``), after the equal-thread headline."""
    if not rows:
        return []
    ns, table_rows = _by_n(rows, lambda r: (r["workload"],))
    return [
        "**The thread policy's own gain**, on CPU ranks: the raw loop at hvdk8s's thread split (`hvdk8s.threads`, "
        "default policy: cores / local_size intra-op threads per rank) over the raw loop at TensorFlow's default pools "
        "(as many threads as cores in every rank, so ranks on one host oversubscribe them: what a raw-loop user gets), "
        "separate launches of the same round. The rows above compare hvdk8s and the raw loop at equal threads "
        "(alternating windows in one process; Horovod's synthetic benchmark against the loop launched at hvdk8s's "
        "split); this is what hvdk8s's default thread policy adds on top of them on CPU, and what a raw-loop user "
        "gets with one `tf.config.threading.set_intra_op_parallelism_threads` line. On GPU ranks `hvdk8s.init` pins "
        "the rank's GPU and applies no thread policy (hvdk8s/runtime.py), so there only the equal-thread ratio "
        "applies.",
        "",
        table(["workload", *[f"raw loop, split / TensorFlow's defaults, N={n}" for n in ns]], table_rows),
        "",
    ]


def _ratio_section(d: dict[str, Any], measured: str = MEASURED) -> str:
    r = d["ratios"]
    headline = _headline(d)
    threads = _thread_policy([*r.get("thread_policy", []), *(
        {"workload": f"horovod-synthetic:{p['model']}", "workers": p["workers"], "ratio": p["raw_split_over_raw"]}
        for p in d.get("synthetic", []) if p["section"] == "synthetic" and p.get("raw_split_over_raw"))])
    if not (r["paired"] or r["rounds"] or headline or threads):
        return ""
    out: list[str] = [
        "## Summary: throughput relative to the raw Horovod loop (" + measured + ")",
        "",
        "One ratio per launch, then the median, the lowest and highest launch [min–max] and the number of launches; "
        "above 1 is faster than the raw loop. The N=1 column is the same comparison on one rank (no communication: "
        "what Keras fit, hvdk8s's callbacks and its optimizer cost or save by themselves) beside N=2. "
        "**Alternating windows**: every launch of hvdk8s (and of its steps_per_execution row) also builds the raw "
        "`horovod.tensorflow` loop on the same ranks "
        "and times its windows between hvdk8s's (warm-up, then hvdk8s window, raw window, ...; a fresh pair of models "
        "for each model of the launch), so both see the same load; the ratio is hvdk8s's median window rate over the "
        "raw loop's. **Separate launches**: each strategy's median "
        "rate over the raw loop's launch in the same round.",
        "",
        *([*headline, ""] if headline else []),
        *threads,
    ]
    if r["paired"]:
        ns, rows = _by_n(r["paired"], lambda p: (p["workload"], label(p["strategy"])))
        out += [
            "Every row with alternating windows on this machine:",
            "",
            table(["workload", "strategy", *[f"/ raw loop, alternating windows, N={n}" for n in ns]], rows),
            "",
        ]
    if r["rounds"]:
        ns, rows = _by_n(r["rounds"], lambda p: (p["workload"], label(p["strategy"])))
        out += [table(["workload", "strategy", *[f"/ raw loop, separate launches, N={n}: median [min–max] (rounds)" for n in ns]], rows), ""]
    if r.get("time_to_accuracy_paired"):
        out += [
            "**Alternating epochs** (time to accuracy): every hvdk8s launch also trains the raw loop on the same ranks and "
            "data, one epoch after each of its own (after its evaluation), for as many epochs; the ratio is the raw loop's "
            "training seconds over hvdk8s's.",
            "",
            table(["N", "hvdk8s / raw loop, time to accuracy, alternating epochs: median [min–max] (launches)"],
                  [[num(p["workers"]), over_launches(p["ratio"])] for p in r["time_to_accuracy_paired"]]),
            "",
        ]
    if r["time_to_accuracy"]:
        out += [
            table(["strategy", "N", "time-to-accuracy examples/s / raw loop's: median [min–max] (rounds)"],
                  [[label(p["strategy"]), num(p["workers"]), over_launches(p["ratio"])] for p in r["time_to_accuracy"]]),
            "",
        ]
    return "\n".join(out)


def synthetic_equal_threads(row: dict[str, Any]) -> dict[str, Any] | None:
    """hvdk8s over the raw loop at equal threads, from an ``analysis.synthetic`` row: over the loop at hvdk8s's split
    where it ran; at N=1, where the split is TensorFlow's own pool (``hvdk8s.threads``), over the loop's one launch."""
    return row.get("hvdk8s_over_raw_split") or (row.get("hvdk8s_over_raw") if row["workers"] == 1 else None)


def _synthetic_section(rows: list[dict[str, Any]], settings: dict[str, Any], what: dict[str, str],
                       measured: str = MEASURED) -> str:
    main = [r for r in rows if r["section"] == "synthetic"]
    knob_rows = [r for r in rows if r["section"] == "knobs"]
    if not rows:
        return ""
    # A results file written before the suite had its own versions of the scripts has no synthetic_peer setting.
    own = "synthetic_peer" in settings
    scripts = (
        "The benchmark of Horovod's `examples/tensorflow2/tensorflow2_synthetic_benchmark.py` and "
        "`tensorflow2_keras_synthetic_benchmark.py` (v0.28.1), written in this suite with those scripts' flags: the raw "
        "`horovod.tensorflow` loop (`python -m hvdk8s.benchmarks.workers.synthetic_loop`) and Keras `fit` on hvdk8s "
        "(`synthetic_fit`); what they run and how they follow Horovod's: `benchmarks/config/synthetic.py`."
        if own else
        "Horovod's `examples/tensorflow2/tensorflow2_synthetic_benchmark.py` (the raw `horovod.tensorflow` loop, with the "
        "fixes Keras 3 forces: one `hvd.allreduce` per gradient in place of `DistributedGradientTape`, whose "
        "`Variable.ref()` Keras 3 variables lack, and `opt.variables` as a list) against "
        "`tensorflow2_keras_synthetic_benchmark.py` as `hvdk8s migrate` ports it; both run from copies in the "
        "repository at the time, since removed (the suite now runs its own versions: `benchmarks/config/synthetic.py`)."
    )
    split = any("raw_split" in r for r in main)
    threads = (
        "hvdk8s applies `hvdk8s.init`'s CPU thread policy; the raw loop runs as a user gets it, at TensorFlow's default "
        "pools, and at N > 1 once more with hvdk8s's intra-op split (`--intra-op-threads`: cores / N on this host), "
        "the one line a careful user adds. At N=1 the split is TensorFlow's own pool, so there the loop's one launch "
        "is at equal threads." if split else
        "the suite sets no thread count, so the raw loop keeps TensorFlow's defaults and hvdk8s applies "
        "`hvdk8s.init`'s CPU thread policy."
    )
    out = [
        "## Horovod's synthetic benchmarks: the raw loop and hvdk8s" + ("" if own else " on Horovod's own scripts")
        + " (" + measured + ")",
        "",
        scripts + " Each launch runs one script under mpirun with `--no-cuda` as a user runs it: " + threads
        + " img/s per rank is the median of the launch's "
        f"{num(settings['synthetic_iters'])} timed iterations of {num(settings['synthetic_batches_per_iter'])} batches "
        "(after one iteration's worth of warm-up steps); each round launches the scripts back to back, alternating "
        "which goes first. Columns: median [lowest–highest launch] (launches); a ratio is one launch over another of "
        "the same round.",
        "",
    ]
    if main:
        out += [table(["model", "batch per rank", "N", "hvdk8s / raw loop at equal threads",
                       "raw loop: split / TensorFlow's defaults", "hvdk8s / raw loop at TensorFlow's defaults",
                       "raw loop img/s per rank", "raw loop at the split", "hvdk8s img/s per rank"],
                      [[r["model"], num(r["batch_per_rank"]), num(r["workers"]), over_launches(synthetic_equal_threads(r)),
                        over_launches(r.get("raw_split_over_raw")), over_launches(r.get("hvdk8s_over_raw")),
                        over_launches(r.get("raw")), over_launches(r.get("raw_split")), over_launches(r.get("hvdk8s"))]
                       for r in main]), ""]
    if peer := [r for r in main if "raw_over_peer" in r or "hvdk8s_over_peer" in r]:
        agree = {True: "yes", False: "no", None: "–"}
        out += [
            "Horovod's own scripts in the same rounds, with the same flags (setting `synthetic_peer`: their folder): the raw "
            "one with the changes Keras 3 forces (`PEER_FIXES` in `benchmarks/config/synthetic.py`), the Keras one as "
            "`hvdk8s migrate` ports it, both run from a temporary copy. "
            "Each of the suite's scripts over Horovod's launch of the same round; they agree when the medians of all "
            f"their timed iterations are within {PEER_TOLERANCE:.0%} of each other or those iterations' ranges overlap.",
            "",
            table(["model", "N", "raw loop / Horovod's raw script, per round", "agrees",
                   "hvdk8s fit / Horovod's Keras script migrated, per round", "agrees"],
                  [[r["model"], num(r["workers"]), over_launches(r.get("raw_over_peer")), agree[r.get("raw_agrees_with_peer")],
                    over_launches(r.get("hvdk8s_over_peer")), agree[r.get("hvdk8s_agrees_with_peer")]] for r in peer]),
            "",
        ]
    if knob_rows:
        out += [
            "Knob study on these scripts (N=2): every knob round launches both scripts with the baseline and with each "
            "knob; each launch's rate over the baseline launch's of the same round and script (a thread policy changes "
            "only hvdk8s's script: the raw loop sets no threads; Open MPI parameters change both).",
            "",
            table(["knob", "what it sets", "model", "raw loop vs baseline", "hvdk8s vs baseline", "hvdk8s / raw loop", "hvdk8s img/s per rank"],
                  [[r["knob"], what.get(r["knob"], ""), r["model"], over_launches(r.get("raw_vs_baseline")),
                    over_launches(r.get("hvdk8s_vs_baseline")), over_launches(r.get("hvdk8s_over_raw")), over_launches(r.get("hvdk8s"))]
                   for r in knob_rows]),
            "",
        ]
    return "\n".join(out)


def _tta_section(d: dict[str, Any], measured: str = MEASURED) -> str:
    rows = d["time_to_accuracy"]
    if not rows:
        return ""
    steady = {(t["strategy"], t["workers"]): t["examples_per_s"] for t in d["throughput"] if t["workload"] == "cnn"}
    return "\n".join(
        [
            "## 2. Time to accuracy on real data (" + measured + ")",
            "",
            "The CNN on scikit-learn's digits (1,437 training / 360 test images at 28×28). Synchronous strategies use "
            "lr × N for the N-times larger global batch; asynchronous PS workers apply their own gradients and keep "
            "the single-worker rate. One epoch is one pass over the training set by all workers together. The clock "
            "counts training only (test evaluation after every epoch is excluded). Runs that never reach the target "
            "within the epoch limit show `–`. Keras-fit strategies train all epochs in one `fit` call, as users do; the "
            "loops keep one iterator across epochs. The last column is section 1's steady-state rate of the same CNN "
            "and batch on synthetic data: the time-to-accuracy rate differs by what short epochs, real input "
            "(shuffling, a new shard order every pass) and per-epoch work (metric averaging, job figures) cost.",
            "",
            table(
                ["strategy", "N", "lr", "reached target", "seconds to target", "epochs to target", "final test accuracy", "examples/s",
                 "steady-state examples/s"],
                [[label(r["strategy"]), num(r["workers"]), num(r["lr"]), f"{num(r['reached'])} of {num(r['runs'])} at {pct(r['target'])}",
                  spread(r["seconds_to_target"], secs), spread(r["epochs_to_target"]), spread(r["final_accuracy"], pct),
                  spread(r["examples_per_s"]), spread(steady.get((r["strategy"], r["workers"])))] for r in rows],
            ),
            "",
            "![time to accuracy](tta.png)",
            "",
        ]
    )


PHASES = (
    ("input", "input (next() in a compiled function)"),
    ("forward_backward", "forward + backward"),
    ("optimizer", "optimizer update"),
    ("allreduce_wait", "allreduce wait (compiled step − the three above)"),
    ("step_call", "fit's step call around train_step (train_function − compiled train_step)"),
    ("callbacks", "callbacks and fit loop (fit − train_function)"),
    ("total", "total per step"),
)


def _profile_section(p: dict[str, Any] | None, measured: str = MEASURED) -> str:
    if not p:
        return ""
    out = [
        "## 6. Where a step's time goes, N=2 (" + measured + ", `--profile`)",
        "",
        "A profiling-only build (`benchmarks/workers/profiling.py`): each phase is its own compiled function on a copy of the model, "
        "timed alone, round-robin between hvdk8s's `fit` windows; brackets inside the real step would order its ops and "
        "hide the overlap being measured. Input and forward+backward are the same model for both; the optimizer update is "
        "each one's own (Keras's SGD for the raw loop, the `DistributedOptimizer`'s fused SGD update for hvdk8s, without "
        "its gradient reduction). The allreduce wait is the compiled step (the raw "
        "loop's step function; for hvdk8s the model's public `train_step` in one `tf.function`, as the raw loop's is) minus "
        "those three, i.e. communication that compute did not hide plus glue in the step; fit's step call is the "
        "model's `train_function` (what `fit` calls per step: hvdk8s's lean call, `hvdk8s/train/fit_step.py`) minus that compiled "
        "`train_step`, on the same model: the per-call work around `train_step`; "
        "callbacks are hvdk8s's `fit` window minus its `train_function`. Milliseconds per step (medians):",
        "",
    ]
    rows = []
    for k, text in PHASES:
        rows.append([text, *[secs(w[who][k] if k in w[who] else w["phases"][k]) for w in p["workloads"] for who in ("raw", "hvdk8s")]])
    rows.append(["allreduce alone, nothing overlapping (reference)", *[secs(w["phases"]["allreduce_alone"]) for w in p["workloads"] for _ in "12"]])
    header = ["phase", *[f"{w['workload']}: {who}" for w in p["workloads"] for who in ("raw loop", "hvdk8s")]]
    out += [table(header, rows), ""]
    overlaps = [w for w in p["workloads"] if w.get("overlap_summary")]
    if overlaps:
        out += [
            "Horovod timeline of hvdk8s's steps (rank 0; times from the step's first gradient submission, medians over "
            "the steps after the first): a reduction that starts before the last gradient is submitted overlaps backprop.",
            "",
            table(["workload", "gradient allreduces per step", "steps with overlap", "last gradient submitted",
                   "first reduction starts", "communication after the last gradient"],
                  [[w["workload"], num(o["tensors"]["median"]), f"{num(o['overlapped_steps'])} of {num(o['steps'])}",
                    secs(o["last_submit_s"]["median"]), secs(o["first_reduce_start_s"]["median"]),
                    secs(o["comm_after_last_submit_s"]["median"])] for w in overlaps for o in [w["overlap_summary"]]]),
            "",
        ]
    out += ["![Horovod timeline of hvdk8s steps](timeline.png)", ""]
    return "\n".join(out)


def _knob_section(rows: list[dict[str, Any]], settings: dict[str, Any], what: dict[str, str],
                  stacks: dict[str, dict[str, str]] | None = None, measured: str = MEASURED) -> str:
    if not rows:
        return ""
    intro = ("Each knob is one mpirun launch of the alternating hvdk8s/raw-loop worker, run right after the baseline launch "
             f"in each of {num(settings['knob_rounds'])} round(s); the ratio is the knob's median rate over the baseline's in "
             "the same round (above 1: the knob helps), then median [min–max] (rounds).")
    if "stack" not in rows[0]:  # results from before stack knobs: as they were rendered
        return "\n".join([
            "## 7. Horovod and Open MPI knobs, N=2 (" + measured + ")",
            "",
            intro,
            "",
            table(["knob", "what it sets", "workload", "hvdk8s vs baseline", "raw loop vs baseline", "hvdk8s / raw loop"],
                  [[r["knob"], what.get(r["knob"], ""), r["workload"], over_launches(r["hvdk8s"]), over_launches(r["horovod"]), over_launches(r["hvdk8s_over_raw"])]
                   for r in rows]),
            "",
        ])
    return "\n".join([
        "## 7. Horovod, Open MPI and software-stack knobs, N=2 (" + measured + ")",
        "",
        intro + " **hvdk8s / raw loop** is each launch's hvdk8s median window rate over the raw loop's windows that "
        "alternated with them in the same launch, beside the baseline launches' of the same rounds; the stack column is "
        "the TensorFlow and Keras the launches' workers ran."
        + (" A stack knob's ranks run another virtual environment (" + ", ".join(sorted(stacks)) + "; the Environment "
           "section lists what each runs): its hvdk8s / raw loop is that stack's, its ratios to the baseline compare the "
           "stacks' speeds on the same machine in the same rounds." if stacks else ""),
        "",
        table(["knob", "what it sets", "workload", "stack", "hvdk8s / raw loop", "baseline's hvdk8s / raw loop, same rounds",
               "hvdk8s vs baseline", "raw loop vs baseline"],
              [[r["knob"], what.get(r["knob"], ""), r["workload"], r["stack"] or "–", over_launches(r["hvdk8s_over_raw"]),
                over_launches(r["baseline_hvdk8s_over_raw"]), over_launches(r["hvdk8s"]), over_launches(r["horovod"])] for r in rows]),
        "",
    ])


def _allreduce_section(ar: dict[str, Any], measured: str = MEASURED) -> str:
    if not ar["sweep"] and not ar["fusion"]:
        return ""
    out = [
        "## 3. Allreduce microbenchmark (" + measured + ")",
        "",
        "Horovod allreduce (sum) of one float32 tensor, ranks on this machine (Open MPI shared memory, Open MPI's own "
        "choice of algorithm). algbw = bytes / time; busbw = algbw × 2(N−1)/N, the bytes each rank moves per second, "
        "comparable across N and with the memory-copy rate (one thread copying one buffer with numpy: the local limit). "
        "Small messages cannot go below Horovod's cycle time: its background thread starts a cycle at most every "
        "`HOROVOD_CYCLE_TIME` (default 1 ms; `RunLoopOnce` in horovod/common/operations.cc sleeps until "
        "last cycle start + cycle time), and a tensor submitted in one cycle is negotiated and reduced in the next, so "
        "back-to-back allreduces each wait for a cycle. The last column re-measures the small sizes in a launch with "
        "`HOROVOD_CYCLE_TIME=0.1`.",
        "",
    ]
    fast = {p["bytes"]: p["seconds"] for p in ar["sweep"] if p["fusion"] == "cycle_0.1ms"}
    rows = [[nbytes(p["bytes"]), num(p["workers"]), spread(p["seconds"], secs), gbyte(p["algbw_bytes_per_s"]), gbyte(p["busbw_bytes_per_s"]),
             spread(fast.get(p["bytes"]), secs)]
            for p in ar["sweep"] if p["fusion"] == "default"]
    if "memcopy" in ar:
        m = ar["memcopy"]
        rows.append([f"{nbytes(m['bytes'])} memory copy", "–", spread(m["seconds"], secs), gbyte(m["bytes_per_s"]), "–", "–"])
    out += [table(["message", "N", "time median [min–max]", "algbw", "busbw", "time at 0.1 ms cycle"], rows), ""]
    if ar["fusion_pairs"]:
        out += [
            "Tensor fusion: many small tensors reduced in one step, submitted as separate allreduce ops (hvdk8s's "
            "DistributedOptimizer default: one per gradient, so they can overlap backprop) or as one grouped allreduce "
            "(its `groups=`), with Horovod's fusion buffer at its default (128 MiB) "
            "and off (`HOROVOD_FUSION_THRESHOLD=0`), in separate launches.",
            "",
            table(
                ["tensors × size", "submitted as", "fusion on", "fusion off", "off / on"],
                [[f"{num(p['tensors'])} × {nbytes(p['tensor_bytes'])}", p["mode"], secs(p["seconds_fusion_on"]), secs(p["seconds_fusion_off"]),
                  num(p["off_over_on"])] for p in ar["fusion_pairs"]],
            ),
            "",
        ]
    out += ["![busbw](busbw.png)", ""]
    return "\n".join(out)


def _emulated_section(emu: dict[str, Any], measured: str = MEASURED) -> str:
    head = ["## 4. Bandwidth-limited cluster in network namespaces (" + measured + ", links emulated)", ""]
    if emu.get("skipped"):
        return "\n".join(head + [f"Skipped: {emu['skipped']}.", ""])
    out = head + [
        "Each host is a Linux network namespace with one veth link to a bridge, shaped to the rate in both directions "
        "(`tc` token bucket). Host 0 runs mpirun or the PS coordinator, hosts 1..N the workers, the next host the "
        "parameter server (P=1). Bandwidth is emulated, CPU is not: all hosts share this machine's cores, so the "
        "faster links can be limited by the CPU rather than the shaper (compare the TCP probe with the rate). "
        "Communication runs with more workers than cores only move data (a bias-free dense layer on a batch of one "
        "for the PS, a bare allreduce for the ring), so they measure the links rather than the cores; training on "
        "the emulated links uses at most one worker per core.",
        "",
        table(
            ["link", "TCP duplex each way", "fraction of rate", "TCP round trip"],
            [[r["rate"], gbit(r["link"]["duplex_bytes_per_s_each_way"]), pct(r["link"]["fraction_of_rate"]), spread(r["link"]["roundtrip_s"], secs)]
             for r in emu["rates"]],
        ),
        "",
    ]
    for r in emu["rates"]:
        rows = []
        for kind, fit in (("ring allreduce", r.get("ring_fit")), ("parameter server", r.get("ps_fit"))):
            for p in (fit or {}).get("points", []):
                rows.append([kind, num(p["workers"]), nbytes(p["bytes"]), secs(p["seconds"]), secs(p["predicted_seconds"]), pct(p["error"])])
        out += [
            f"**{r['rate']} links**: time per step, measured (median) vs the fitted model (section 5). A parameter-server "
            "step is one round in which every worker pulls and pushes the whole message once.",
            "",
            table(["transport", "N", "message", "measured", "model", "model error"], rows),
            "",
        ]
        if r["training"]:
            out += [
                f"Training on the {r['rate']} links (same models, batches, warm-up and windows as section 1, "
                f"{_launches(r['training'])}; "
                + ("fp32 gradients everywhere but the fp16-compression row, which is not a like-for-like comparison). "
                   if any(t["strategy"] == "hvdk8s_fp16" for t in r["training"]) else "fp32 gradients everywhere). ")
                + "The last column is each launch's median rate over hvdk8s's launch of the same round: median [min–max] (rounds).",
                "",
                table(
                    ["workload", "strategy", "N", "examples/s median [min–max]", "/ hvdk8s, per round"],
                    [[t["workload"], label(t["strategy"]), num(t["workers"]), spread(t["examples_per_s"]), "1" if t["strategy"] == "hvdk8s" else over_launches(t["over_hvdk8s"])]
                     for t in r["training"]],
                ),
                "",
                *([table(["workload", "strategy", "N", "strategy / raw loop, alternating windows"],
                         [[x["workload"], label(x["strategy"]), num(x["workers"]), over_launches(x["ratio"])]
                          for x in r["training_paired"]]), ""]
                  if r["training_paired"] else []),
            ]
    return "\n".join(out)


def _launches(rows: list[dict[str, Any]]) -> str:
    rounds = max((t["over_hvdk8s"]["n"] for t in rows if t["over_hvdk8s"]), default=1)
    return "one launch each" if rounds == 1 else f"{rounds} launches each, one of every strategy per round"


def _fit_rows(d: dict[str, Any]) -> list[list[str]]:
    rows = []
    local = d["model"].get("local_ring_fit")
    if local:
        rows.append(["shared memory (this machine)", "ring (Horovod, Open MPI)", ", ".join(local["fitted"]), secs(local["alpha_s"]),
                     secs(local["overhead_s"]), gbyte(local["bandwidth_bytes_per_s"]), "–", pct(local["median_abs_error"])])
    for r in d["emulated"].get("rates", []):
        for kind, key in (("ring (Horovod, Open MPI TCP)", "ring_fit"), ("parameter server (TF gRPC)", "ps_fit")):
            f = r.get(key)
            if f:
                rows.append([f"emulated {r['rate']}", kind, ", ".join(f["fitted"]), secs(f["alpha_s"]), secs(f.get("overhead_s")),
                             gbyte(f["bandwidth_bytes_per_s"]), pct(f["fraction_of_rate"]), pct(f["median_abs_error"])])
    return rows


def _model_section(d: dict[str, Any]) -> str:
    m = d["model"]
    out = [
        "## 5. Cost model: fitted here; extrapolated on an ideal transport with stated assumptions",
        "",
        "Ring allreduce: T = 2(N−1)/N · M/B + 2(N−1)·α + c. Parameter servers (P servers, N workers, each server link "
        "carries N·M/P each way): T = max(N/P, 2) · M/B + 2α. B, α and c are fitted (non-negative least squares on "
        "relative error) to the measurements above; c is a per-collective software cost that does not grow with N "
        "(only separable from α when more than one N was measured; `fitted` lists the terms that were).",
        "",
        table(["measured on", "transport", "fitted", "α", "c", "B", "B / link rate", "median model error"], _fit_rows(d)),
        "",
    ]
    out += [
        "**Extrapolation** (modelled, not measured). Scaling efficiency = T_compute / T_step, with T_compute from "
        "measured single-H100 training rates. *No overlap*: T_step = T_compute + T_comm. *Overlapped*: gradients leave "
        "in buckets as backprop produces them and are reduced one after another while earlier layers still "
        "differentiate (the schedule hvdk8s and Horovod use; details under the assumptions). Transport: line rate and "
        "an assumed RDMA-class α (NCCL-like, the stack of the published figures). The α and c fitted above are not "
        "extrapolated: on two oversubscribed cores they measure CPU scheduling, not a network's latency."
        f" Parameter servers: one per {num(m['ps_ratio'])} workers.",
        "",
    ]
    by_key = {(p["variant"], p["gpu"], p["model"], p["network"], p["workers"]): p for p in m["predictions"]}
    rows = [[model_name, net, num(n), secs(p["compute_s"]), secs(p["ring_comm_s"]), pct(p["ring_efficiency"]),
             pct(p["ring_overlapped_efficiency"]), pct(p["ps_efficiency"])]
            for (variant, gpu, model_name, net, n), p in by_key.items()
            if variant == "ideal transport" and gpu == "H100" and n in PREDICTION_WORKERS]
    out += [
        "Predicted scaling efficiency, H100 compute (measured single-GPU rates):",
        "",
        table(["model", "network", "N", "compute/step", "ring comm", "ring E no overlap", "ring E overlapped", "PS E"], rows),
        "",
        "**Published figures** (not measured here; P100 GPUs, Horovod with NCCL over 25 GbE) next to this model with "
        "P100-era compute at the same N:",
        "",
    ]
    rows = []
    for pub in m["published"]:
        keys = ("ring_efficiency", "ring_overlapped_efficiency") if pub["system"] == "Horovod" else ("ps_efficiency", None)
        p = by_key.get(("ideal transport", "P100", pub["model"], "25 GbE", pub["workers"]))
        rows.append([pub["model"], num(pub["workers"]), pub["network"], pub["system"], pct(pub["efficiency"]), pub["source"],
                     *[pct(p[k]) if p and k else "–" for k in keys]])
    out += [
        table(["model", "N", "network", "system", "published E", "source", "model no overlap", "model overlapped"], rows),
        "",
        "![predicted efficiency](prediction.png)",
        "",
        "Assumptions of the extrapolation:",
        "",
        *[f"- {a}" for a in m["assumptions"]],
        *[f"- {name}: {net['note']}." for name, net in m["networks"].items()],
        "",
    ]
    return "\n".join(out)


def _environment_section(results: dict[str, Any]) -> str:
    env = results["environment"]
    git = env["git"]
    lines = [
        "## Environment",
        "",
        "```",
        f"command      {' '.join(env['command'])}",
        f"git          {git['commit']}{' (with local changes)' if git['dirty'] else ''}",
        f"python       {env['python']}",
        *[f"{k:<12} {v}" for k, v in env["packages"].items()],
        f"open mpi     {env['open_mpi']}",
        f"iproute2     {env['iproute2']}",
        f"kernel       {env['kernel']}",
        f"cpu          {env['cpu_model']} x {env['cpu_count']}",
        f"memory       {env['memory_gib']} GiB",
        f"mpi flags    {' '.join(f'-mca {k} {v}' for k, v in env['mpi_mca'].items())}",
        f"env flags    {' '.join(f'{k}={v}' for k, v in env['environment_flags'].items()) or '(none)'}",
        *[f"knob {name:<7} {v['interpreter']}: python {v['python']}, tensorflow {v['tensorflow']}, keras {v['keras']}, "
          f"horovod {v['horovod']}, hvdk8s from {v['hvdk8s']}" for name, v in env.get("stacks", {}).items()],
        "```",
        "",
        "Settings (reproduce with the same command on the same commit): see `settings` in results.json.",
        "",
    ]
    return "\n".join(lines)


def _errors_section(results: dict[str, Any]) -> str:
    if not results["errors"]:
        return ""
    return "\n".join(["## Errors", ""] + [f"- {e['job']}: `{e['error'].splitlines()[0]}`" for e in results["errors"]] + [""])


def render(results: dict[str, Any]) -> str:
    """report.md of a local run, or of a cluster run (results with ``cluster``: the cluster in place of the machine,
    its own section after the header, every measurement "measured on the cluster")."""
    d = results["derived"]
    measured = MEASURED_CLUSTER if "cluster" in results else MEASURED
    parts = [
        _header(results),
        _cluster_section(results),
        _ratio_section(d, measured),
        _synthetic_section(d.get("synthetic", []), results["settings"], results["labels"].get("knobs", {}), measured),
        _training_section(d["training"], measured) if d["training"]["throughput"] else "",
        _tta_section(d["training"], measured),
        _allreduce_section(d["allreduce"], measured),
        _emulated_section(d["emulated"], measured),
        _model_section(d),
        _profile_section(d["profile"], measured),
        _knob_section(d["knobs"], results["settings"], results["labels"].get("knobs", {}), results["environment"].get("stacks"),
                      measured),
        _errors_section(results),
        _environment_section(results),
    ]
    return "\n\n".join(p.strip() for p in parts if p) + "\n"


def write(results: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    """report.md and its PNGs in ``out_dir``; plots for sections without data are not drawn."""
    out_dir.mkdir(parents=True, exist_ok=True)
    d = results["derived"]
    if d["training"]["throughput"]:
        plot_throughput(d["training"]["throughput"], out_dir / "throughput.png")
    if d["training"]["time_to_accuracy"]:
        plot_tta(results["raw"]["training"], out_dir / "tta.png")
    if d["allreduce"]["sweep"]:
        plot_busbw(d["allreduce"], d["emulated"], out_dir / "busbw.png")
    if d["model"]["predictions"]:
        plot_prediction(d["model"], out_dir / "prediction.png")
    if d["profile"]:
        plot_timeline(results["raw"]["profile"]["result"]["profile"], out_dir / "timeline.png")
    md = atomic.write_text(out_dir / "report.md", render(results))
    return {"markdown": md}
