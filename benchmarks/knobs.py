"""Horovod and Open MPI settings the knob study measures, each against the suite's defaults.

A knob is an environment (``HOROVOD_*``) and/or Open MPI MCA parameters
applied to one mpirun launch of the paired hvdk8s/raw-loop training worker at
N=2; every round runs the baseline and every knob back to back, so each
knob's effect is a ratio to the baseline of its own round. Pure data.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from hvdk8s.launcher.mpirun import transport_mca


@dataclass(frozen=True)
class Knob:
    env: dict[str, str] = field(default_factory=dict)
    mca: dict[str, str] = field(default_factory=dict)
    what: str = ""


BASELINE = "baseline"

KNOBS: dict[str, Knob] = {
    BASELINE: Knob(what="the suite's settings: Horovod's defaults (1 ms cycle, 128 MiB fusion buffer, cache of 1024), "
                        "Open MPI picks the allreduce algorithm, ranks yield when idle, TCP eager limit 16 MiB"),
    "cycle_0.1ms": Knob({"HOROVOD_CYCLE_TIME": "0.1"}, what="Horovod's background loop wakes every 0.1 ms instead of 1 ms"),
    "cycle_5ms": Knob({"HOROVOD_CYCLE_TIME": "5"}, what="background loop every 5 ms (Horovod's default before 0.21)"),
    "fusion_4MiB": Knob({"HOROVOD_FUSION_THRESHOLD": str(4 << 20)}, what="fusion buffer 4 MiB instead of 128 MiB"),
    "fusion_off": Knob({"HOROVOD_FUSION_THRESHOLD": "0"}, what="no tensor fusion: one MPI allreduce per tensor"),
    "cache_off": Knob({"HOROVOD_CACHE_CAPACITY": "0"}, what="response cache off: every tensor is negotiated every step"),
    "autotune": Knob({"HOROVOD_AUTOTUNE": "1"}, what="Horovod's Bayesian autotuner (cycle time, fusion size, cache) during the run"),
    "ompi_ring": Knob(
        mca=transport_mca("ring"), what="Open MPI's ring allreduce forced (the suite forced it before this study)"
    ),
    "ompi_recursive_doubling": Knob(
        mca=transport_mca("recursive_doubling"),
        what="Open MPI's recursive-doubling allreduce (openMpi.allreduceAlgorithm: recursive_doubling)",
    ),
    "ompi_spin": Knob(mca={"mpi_yield_when_idle": "0"}, what="ranks busy-poll while waiting (Open MPI's default)"),
}


def names() -> tuple[str, ...]:
    """Every knob but the baseline, in study order."""
    return tuple(k for k in KNOBS if k != BASELINE)
