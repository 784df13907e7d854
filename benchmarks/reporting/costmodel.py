"""Alpha-beta cost model of ring allreduce and of parameter servers: fit, check, extrapolate.

Ring allreduce of M bytes over N workers (Patarasuk & Yuan 2009; the model
behind Horovod):          T = 2(N-1)/N * M/B + 2(N-1) * alpha + c
Parameter servers, P server hosts, N workers: every worker pulls M and pushes
M; each server link carries N*M/P in each direction (full duplex), a worker
link M; so          T = max(N/P, 2) * M/B + 2 * alpha
(the 2 is one worker alone: pull then push on its own link).

``c`` is a fixed cost per collective that does not grow with N (Horovod's
negotiation and the MPI call on this CPU stack); with c = 0 the ring formula
is the classic alpha-beta one. Without it, a fit on a software stack loads
that overhead onto alpha, and alpha is multiplied by 2(N-1) when extrapolated.
The parameters are fitted by non-negative least squares on relative error (so
small messages weigh as much as large ones); a term whose best value would
be negative is dropped (fixed at 0), and the result says which were fitted. The extrapolation uses
constants that are NOT measured here: link speeds, per-GPU compute time and
latencies of real fabrics; each is listed in ``assumptions`` with its source
or marked as an assumption, and the published figures are kept apart.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

GBIT = 1e9 / 8  # bytes per second in one Gbit/s

# Link speeds per direction (line rate; the constants the issue names).
NETWORKS: dict[str, dict[str, Any]] = {
    "25 GbE": {"bytes_per_s": 25 * GBIT, "alpha_s": 5e-6, "ethernet": True,
               "note": "25 Gbit/s per direction; alpha 5 us ASSUMED for an RDMA (RoCE) transport such as NCCL's"},
    "100 GbE": {"bytes_per_s": 100 * GBIT, "alpha_s": 5e-6, "ethernet": True,
                "note": "100 Gbit/s per direction; alpha 5 us ASSUMED (RoCE)"},
    "IB NDR": {"bytes_per_s": 400 * GBIT, "alpha_s": 2e-6, "ethernet": False,
               "note": "InfiniBand NDR, 400 Gbit/s per port and direction; alpha 2 us ASSUMED (RDMA verbs, one switch hop)"},
    "NVLink (H100)": {
        "bytes_per_s": 450e9, "alpha_s": 5e-6, "ethernet": False,
        "note": "NVLink 4 on H100: 900 GB/s total per GPU = 450 GB/s per direction (NVIDIA H100 datasheet); "
        "alpha 5 us ASSUMED (NCCL step); beyond 8 GPUs this stands for an NVLink-Switch fabric",
    },
}

# fp32 gradient sizes: parameters x 4 bytes.
MODELS: dict[str, dict[str, float]] = {
    "ResNet-50": {"params": 25.6e6, "gflops": 3.8},
    "ResNet-101": {"params": 44.5e6, "gflops": 7.6},
    "VGG-16": {"params": 138e6, "gflops": 15.3},
}

# Per-GPU compute. H100: measured single-GPU training rates (images/s at a batch), the benchmarks package's
# h100_training_rates.json (``gpus``: its bf16 rows; the file says what was measured, on what and when).
# P100 has no measurement here: the Horovod paper's era is modelled from an ASSUMED ResNet-50 rate,
# other models scaled by forward FLOPs.
H100_RATES_PATH = Path(__file__).parents[1] / "h100_training_rates.json"
P100: dict[str, Any] = {"measured": False, "rates": {"ResNet-50": [220.0, 64]}}


def gpus(h100_rates: Path = H100_RATES_PATH) -> dict[str, dict[str, Any]]:
    """Per-GPU rates {model: [images/s, batch]}: H100's measured bf16 rows from ``h100_rates``, P100's assumed one.
    ValueError naming the file when it is missing or lacks a model."""
    try:
        data = json.loads(h100_rates.read_text())
        rows = [r for r in data["rates"] if r["precision"].startswith("bf16") and r["model"] in MODELS]
        rates = {r["model"]: [float(r["images_per_second"]), int(r["batch"])] for r in rows}
        source = f"{data['device']}; {data['framework']}; measured {data['measured']}"
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"cost model: cannot read the measured H100 rates from {h100_rates} ({err}); the extrapolation "
                         "needs that file, part of the hvdk8s.benchmarks package (reinstall hvdk8s)") from None
    missing = sorted(set(MODELS) - set(rates))
    if missing:
        raise ValueError(f"cost model: {h100_rates} has no bf16 rate for {missing}")
    return {"H100": {"measured": True, "rates": rates, "source": source}, "P100": P100}


BACKWARD_SHARE = 2 / 3  # ASSUMED: backward = 2 x forward, spread over layers by their multiply-adds
BUCKET_BYTES = 25 * 2**20  # ASSUMED gradient bucket size of the overlap model (PyTorch DDP's default bucket_cap_mb=25)
LAYERS: dict[str, list[list[int]]] = json.loads((Path(__file__).parents[1] / "model_layers.json").read_text())["models"]

PS_RATIO = 4  # workers per parameter server in the predictions (ASSUMED)
SCALE_WORKERS = (8, 16, 32, 64, 128, 256, 512)

def assumptions(gpu_rates: dict[str, dict[str, Any]]) -> list[str]:
    """The extrapolation's assumptions, with the H100 rates it was given."""
    h100 = ", ".join(f"{m} {rate:,.0f} images/s at batch {batch}" for m, (rate, batch) in gpu_rates["H100"]["rates"].items())
    return [
        "Parameter counts: ResNet-50 25.6M, ResNet-101 44.5M, VGG-16 138M (torchvision model documentation; VGG-16 also Simonyan & Zisserman 2015, Table 2); fp32 gradients, 4 bytes each. Per-layer sizes and multiply-adds: benchmarks/model_layers.json (from keras.applications' definitions).",
        f"H100 compute per step = batch / MEASURED single-H100 training rate (benchmarks/h100_training_rates.json: {gpu_rates['H100']['source']}; {h100}; bf16 autocast). TensorFlow's rate on the same GPU may differ.",
        "P100 compute (the published figures' GPUs, no measurement here): ASSUMED 220 images/s for ResNet-50 at batch 64, other models scaled by forward multiply-adds (ResNet-50 3.8 G, ResNet-101 7.6 G, VGG-16 15.3 G; He et al. 2016).",
        f"Two schedules: 'no overlap' = compute, then one allreduce of all gradients; 'overlapped' = gradients leave in {BUCKET_BYTES >> 20} MiB buckets in reverse layer order as backprop produces them (backward = {BACKWARD_SHARE:.0%} of the step, ASSUMED, spread over layers by multiply-adds), buckets reduced one after another on the ring; the step ends when both compute and the last bucket are done. The bucket size is ASSUMED (PyTorch DDP's default): Horovod fuses what is ready in each 1 ms cycle into allreduces of up to 128 MiB (v0.28.1 defaults), which sends smaller, more frequent allreduces while backprop runs; on a flat ring each pays 2(N-1) alpha, which at hundreds of GPUs NCCL's tree algorithm (not modelled) avoids.",
        f"Parameter servers: one server per {PS_RATIO} workers (ASSUMED ratio), variables split evenly.",
        "Transport 'ideal': full line rate per direction, the network's ASSUMED alpha (below), c = 0 - roughly NCCL over RDMA, the stack of the published figures. No prediction uses the alpha and c fitted on this machine: fitted on two oversubscribed cores they are CPU scheduling, not a network's latency (they made overlapped communication slower than none).",
    ]


# Published, never mixed with measured numbers (labelled in every table and plot).
PUBLISHED = [
    {
        "model": "ResNet-101", "workers": 128, "network": "25 GbE (TCP)", "system": "Horovod", "efficiency": 0.88,
        "gpu": "P100", "source": "Sergeev & Del Balso 2018, arXiv:1802.05799, Fig. 6 (Inception V3 and ResNet-101)",
    },
    {
        "model": "ResNet-101", "workers": 128, "network": "25 GbE (TCP)", "system": "TF parameter servers", "efficiency": 0.50,
        "gpu": "P100", "source": "Sergeev & Del Balso 2018, arXiv:1802.05799, Fig. 1 and 6 (about half the resources unused)",
    },
    {
        "model": "ResNet-101", "workers": 512, "network": "25 GbE (RoCE)", "system": "Horovod", "efficiency": 0.90,
        "gpu": "P100", "source": "Horovod docs/benchmarks.rst (128 servers x 4 Pascal GPUs, RoCE 25 Gbit/s)",
    },
    {
        "model": "VGG-16", "workers": 512, "network": "25 GbE (RoCE)", "system": "Horovod", "efficiency": 0.68,
        "gpu": "P100", "source": "Horovod docs/benchmarks.rst (128 servers x 4 Pascal GPUs, RoCE 25 Gbit/s)",
    },
]


def ring_time(n: int, nbytes: float, alpha: float, bandwidth: float, overhead: float = 0.0) -> float:
    return 2 * (n - 1) / n * nbytes / bandwidth + 2 * (n - 1) * alpha + overhead


def ps_time(n: int, servers: int, nbytes: float, alpha: float, bandwidth: float) -> float:
    return max(n / servers, 2.0) * nbytes / bandwidth + 2 * alpha


def _nnls(features: np.ndarray, times: np.ndarray) -> tuple[np.ndarray, list[bool]]:
    """Relative-error least squares, column 0 (1/B) always kept, the others only if their value is > 0."""
    weights = 1.0 / times
    a = features * weights[:, None]
    b = times * weights
    best: tuple[float, np.ndarray, list[bool]] | None = None
    extra = features.shape[1] - 1
    for mask in range(1 << extra):
        keep = [True] + [bool(mask >> i & 1) for i in range(extra)]
        cols = [i for i, k in enumerate(keep) if k]
        coef, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
        if np.any(coef <= 0):
            continue
        full = np.zeros(features.shape[1])
        full[cols] = coef
        resid = float(np.sum((a @ full - b) ** 2))
        if best is None or resid < best[0] - 1e-15:
            best = (resid, full, keep)
    if best is None:
        raise ValueError("cost model fit: no positive bandwidth fits these times")
    return best[1], best[2]


def fit_ring(points: Sequence[dict[str, float]]) -> dict[str, Any]:
    """Fit B, alpha and c to ``{"workers", "bytes", "seconds"}`` ring measurements.

    alpha and c can only be told apart when more than one N was measured;
    with a single N, c is not fitted (fixed at 0).
    """
    n = np.array([p["workers"] for p in points], float)
    m = np.array([p["bytes"] for p in points], float)
    t = np.array([p["seconds"] for p in points], float)
    columns = [2 * (n - 1) / n * m, 2 * (n - 1)]
    if len(set(n)) > 1:
        columns.append(np.ones_like(m))
    coef, fitted = _nnls(np.stack(columns, axis=1), t)
    bandwidth, alpha = 1.0 / coef[0], float(coef[1])
    overhead = float(coef[2]) if len(coef) > 2 else 0.0
    predicted = [ring_time(int(p["workers"]), p["bytes"], alpha, bandwidth, overhead) for p in points]
    out = _with_check("ring", alpha, bandwidth, points, predicted)
    out["overhead_s"] = overhead
    out["fitted"] = ["B"] + [name for name, k in zip(("alpha", "c"), fitted[1:]) if k]
    return out


def fit_ps(points: Sequence[dict[str, float]]) -> dict[str, Any]:
    """Fit B and alpha to ``{"workers", "servers", "bytes", "seconds"}`` parameter-server rounds."""
    n = np.array([p["workers"] for p in points], float)
    s = np.array([p["servers"] for p in points], float)
    m = np.array([p["bytes"] for p in points], float)
    t = np.array([p["seconds"] for p in points], float)
    coef, fitted = _nnls(np.stack([np.maximum(n / s, 2.0) * m, np.full_like(m, 2.0)], axis=1), t)
    bandwidth, alpha = 1.0 / coef[0], float(coef[1])
    predicted = [ps_time(int(p["workers"]), int(p["servers"]), p["bytes"], alpha, bandwidth) for p in points]
    out = _with_check("ps", alpha, bandwidth, points, predicted)
    out["fitted"] = ["B"] + (["alpha"] if fitted[1] else [])
    return out


def _with_check(kind: str, alpha: float, bandwidth: float, points: Sequence[dict[str, float]], predicted: list[float]) -> dict[str, Any]:
    rows = [{**p, "predicted_seconds": q, "error": q / p["seconds"] - 1} for p, q in zip(points, predicted)]
    return {
        "kind": kind,
        "alpha_s": alpha,
        "bandwidth_bytes_per_s": bandwidth,
        "median_abs_error": float(np.median([abs(r["error"]) for r in rows])),
        "points": rows,
    }


def compute_seconds(model: str, rates: dict[str, list[float]]) -> float:
    """Per-step compute time of ``model`` (see ``assumptions``) from one GPU's ``rates``: measured where it has a rate,
    else FLOP-scaled from its ResNet-50 rate."""
    if model in rates:
        rate, batch = rates[model]
        return batch / rate
    rate, batch = rates["ResNet-50"]
    return batch / (rate * MODELS["ResNet-50"]["gflops"] / MODELS[model]["gflops"])


def buckets(model: str, bucket_bytes: int = BUCKET_BYTES) -> list[tuple[float, float]]:
    """(bytes, fraction of the backward pass done when the bucket's last gradient exists), in sending order.

    Backprop visits layers last to first; a bucket closes once it holds ``bucket_bytes``.
    """
    layers = LAYERS[model][::-1]
    total_macs = sum(m for _, m in layers)
    out, size, done = [], 0.0, 0.0
    for params, macs in layers:
        done += macs / total_macs
        size += params * 4
        if size >= bucket_bytes:
            out.append((size, done))
            size = 0.0
    if size:
        out.append((size, 1.0))
    return out


def overlapped_step(t_compute: float, model: str, comm: Any) -> float:
    """Step time when buckets are reduced as backprop produces them; ``comm(bytes)`` is one bucket's allreduce."""
    t_forward = t_compute * (1 - BACKWARD_SHARE)
    free = 0.0  # when the ring finishes the previous bucket
    for nbytes, done in buckets(model):
        ready = t_forward + done * t_compute * BACKWARD_SHARE
        free = max(free, ready) + comm(nbytes)
    return max(t_compute, free)


def predict(gpu: str, rates: dict[str, list[float]], workers: Sequence[int] = SCALE_WORKERS) -> list[dict[str, Any]]:
    """Scaling efficiency T_compute / T_step for every model, network and N, without and with overlap, on the ideal
    transport (line rate, each network's assumed alpha) with ``gpu``'s ``rates`` (``gpus``)."""
    rows = []
    for model, spec in MODELS.items():
        nbytes = spec["params"] * 4
        t_c = compute_seconds(model, rates)
        for net, link in NETWORKS.items():
            alpha, bw = link["alpha_s"], link["bytes_per_s"]
            for n in workers:
                t_ring = ring_time(n, nbytes, alpha, bw)
                t_ps = ps_time(n, max(1, n // PS_RATIO), nbytes, alpha, bw)
                t_overlap = overlapped_step(t_c, model, lambda b, _n=n: ring_time(_n, b, alpha, bw))
                rows.append(
                    {
                        "variant": "ideal transport", "model": model, "network": net, "gpu": gpu, "workers": n,
                        "gradient_bytes": nbytes, "compute_s": t_c, "ring_comm_s": t_ring, "ps_comm_s": t_ps,
                        "ring_efficiency": t_c / (t_c + t_ring), "ring_overlapped_efficiency": t_c / t_overlap,
                        "ps_efficiency": t_c / (t_c + t_ps),
                    }
                )
    return rows
